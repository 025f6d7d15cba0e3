"""The built-in ``demo`` model that ``carpool serve`` runs with no target: a small deterministic
numpy MLP. Each output row depends only on its own input row, so batching changes how fast
answers come, never what they are."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from carpool.model import Model, Tensor

__all__ = ["DemoMLP", "demo_model"]


class DemoMLP:
    """float32 MLP through ``dims`` with ReLU between layers and fixed-seed weights.

    The default, 256 -> 1024 -> 1024 -> 8, is the ``demo`` model; the benchmarks build
    larger ones (e.g. 512 -> 2048 -> 2048 -> 2048 -> 512) from the same class.
    """

    def __init__(self, dims: tuple[int, ...] = (256, 1024, 1024, 8), seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.dims = dims
        self.features = dims[0]
        self.layers = [
            (
                (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32),
                np.zeros(b, np.float32),
            )
            for a, b in itertools.pairwise(dims)
        ]

    def __call__(self, batch: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        x = np.asarray(batch, dtype=np.float32)
        last = len(self.layers) - 1
        for i, (w, b) in enumerate(self.layers):
            x = x @ w
            x += b
            if i != last:
                np.maximum(x, 0.0, out=x)
        return x


def demo_model() -> Model:
    """The ``demo`` model ``carpool serve`` runs with no target: 256 floats in, 8 out."""
    # One BLAS thread: idle OpenBLAS threads spin on both cores and starve the event loop,
    # and a serving process wants one thread per model worker anyway.
    threadpool_limits(1, user_api="blas")
    mlp = DemoMLP()
    return Model(
        mlp,
        name="demo",
        inputs=[Tensor("INPUT0", "FP32", (mlp.features,))],
        outputs=[Tensor("OUTPUT0", "FP32", (mlp.dims[-1],))],
        platform="carpool_numpy",
    )
