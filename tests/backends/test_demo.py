"""The built-in ``demo`` model (``carpool.backends.demo``): a deterministic numpy MLP whose
rows do not depend on their neighbours, so batching never changes an answer."""

from __future__ import annotations

import numpy as np

from carpool.backends.demo import DemoMLP, demo_model


def test_each_row_is_the_same_alone_or_in_a_batch() -> None:
    mlp = DemoMLP()
    batch = np.random.default_rng(0).standard_normal((16, mlp.features)).astype(np.float32)
    together = mlp(batch)
    assert (together.shape, together.dtype) == ((16, 8), np.float32)
    for row, out in zip(batch, together, strict=True):
        np.testing.assert_allclose(mlp(row[np.newaxis])[0], out, rtol=1e-5, atol=1e-5)


def test_the_weights_come_from_the_seed() -> None:
    row = np.ones((1, 4), np.float32)
    small = DemoMLP((4, 6, 3), seed=5)
    np.testing.assert_array_equal(small(row), DemoMLP((4, 6, 3), seed=5)(row))
    assert not np.array_equal(small(row), DemoMLP((4, 6, 3), seed=6)(row))
    assert (small.features, len(small.layers)) == (4, 2)


def test_demo_model_declares_its_tensors() -> None:
    model = demo_model()
    assert (model.name, model.platform) == ("demo", "carpool_numpy")
    assert [(t.name, t.datatype, t.shape) for t in model.input_specs] == [
        ("INPUT0", "FP32", (256,))
    ]
    assert [(t.name, t.datatype, t.shape) for t in model.output_specs] == [
        ("OUTPUT0", "FP32", (8,))
    ]
