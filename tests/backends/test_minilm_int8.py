"""The onnx-int8 engine on every kind of CPU: which weights each CPU gets, that the ``int7``
weights cannot saturate a 16-bit pair sum (so their numbers here are their numbers on an AVX2
CPU), that both variants hold cosine 0.99 to sentence-transformers alone and in mixed-length
batches, and that a graph failing its load-time check falls back, then is refused.

Accuracy of whichever variant this CPU picks is also ``test_minilm.py``'s; graphs are
exported once per session into ``onnx_cache``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from carpool.backends import minilm_onnx
from carpool.backends.cpu_features import CpuFeatures
from carpool.backends.minilm import minilm_model
from carpool.backends.minilm_int8 import MIN_COSINE, choose_weights, worst_cosine
from carpool.errors import ConfigError

from .test_minilm import TEXTS, as_rows, onnx_cache, reference, st

__all__ = ["onnx_cache", "reference", "st"]  # fixtures shared with test_minilm.py

pytestmark = pytest.mark.slow  # graphs export once (seconds), then load from the cache

AVX2 = CpuFeatures("x86_64", frozenset({"avx", "avx2", "fma"}))
VNNI = CpuFeatures("x86_64", frozenset({"avx2", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni"}))
VARIANT_CPUS = {"int8": VNNI, "int7": AVX2}


@pytest.mark.parametrize(
    ("cpu", "variant"),
    [
        (AVX2, "int7"),
        (VNNI, "int8"),
        (CpuFeatures("aarch64"), "int8"),
        (CpuFeatures("x86_64"), "int7"),
    ],
)
def test_each_cpu_gets_weights_its_kernels_sum_exactly(cpu: CpuFeatures, variant: str) -> None:
    chosen = choose_weights(cpu)
    assert chosen.variant == variant
    assert cpu.describe() in chosen.reason


def load(monkeypatch: pytest.MonkeyPatch, cpu: CpuFeatures) -> Any:
    monkeypatch.setattr(minilm_onnx, "cpu_features", lambda: cpu)
    return minilm_model(engine="onnx-int8", threads=1)


def served_graph(caplog: pytest.LogCaptureFixture) -> Path:
    """The graph file the engine's one load line names."""
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("loaded ")]
    return Path(line.split(", ")[-1].split(" in ")[0])


def test_int7_weights_cannot_saturate_a_16_bit_pair_sum(
    onnx_cache: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """vpmaddubsw adds two u8 x s8 products into a signed 16-bit lane: with every weight in
    [-64, 64] no pair exceeds 2 x 255 x 64 = 32,640, so AVX2's sums are VNNI's, exactly."""
    with caplog.at_level(logging.INFO, logger="carpool.backends.minilm"):
        load(monkeypatch, AVX2)
    path = served_graph(caplog)
    assert "-int7-" in path.name
    weights = [
        numpy_helper.to_array(t)
        for t in onnx.load(str(path)).graph.initializer
        if t.data_type == onnx.TensorProto.INT8 and len(t.dims) == 2
    ]
    assert len(weights) == 12  # attention output and intermediate dense, six layers each
    peak = max(int(np.abs(w.astype(np.int32)).max()) for w in weights)
    assert peak <= 64
    assert 2 * 255 * peak <= np.iinfo(np.int16).max


@pytest.mark.parametrize("variant", ["int8", "int7"])
def test_each_variant_holds_its_promise_alone_and_in_mixed_length_batches(
    variant: str,
    onnx_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    reference: dict[str, np.ndarray[Any, Any]],
) -> None:
    """Each text alone, then all of them padded into one batch (short texts beside a
    256-token one: where dynamic int8 loses most), against sentence-transformers. Where this
    CPU cannot sum int8 exactly, the int8 variant's check falls back to int7 at load: the
    promise holds either way."""
    with caplog.at_level(logging.INFO, logger="carpool.backends.minilm"):
        model = load(monkeypatch, VARIANT_CPUS[variant])
    assert model.preprocess is not None
    expected = np.stack([reference[t] for t in TEXTS])
    alone = np.stack(
        [model.fn(model.preprocess({"TEXT": as_rows([t])}))["EMBEDDING"][0] for t in TEXTS]
    )
    mixed = model.fn(model.preprocess({"TEXT": as_rows(TEXTS)}))["EMBEDDING"]
    for got in (alone, mixed):
        cosines = (got * expected).sum(1) / np.linalg.norm(got, axis=1)
        assert cosines.min() >= MIN_COSINE, dict(zip(TEXTS, cosines.round(4), strict=True))
    assert float(np.abs(alone - expected).max()) > 1e-4  # quantized, not the fp32 graph
    assert f"-{variant}-" in served_graph(caplog).name or "int8 ones gave cosine" in caplog.text


def test_int8_weights_failing_the_check_fall_back_to_int7_then_are_refused(
    onnx_cache: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A CPU whose flags promise exact products but whose kernel saturates (a hypervisor
    hiding AVX-512 state, a new onnxruntime): the check at load catches it."""
    scores = {"int8": 0.9585, "int7": 0.9966}
    checked: list[str] = []

    def check(metadata: dict[str, str], embed: Any, tokenizer: Any) -> float:
        worst_cosine(metadata, embed, tokenizer)  # the real check runs; its score is set
        variant = "int8" if len(checked) == 0 else "int7"
        checked.append(variant)
        return scores[variant]

    monkeypatch.setattr(minilm_onnx, "worst_cosine", check)
    with caplog.at_level(logging.INFO, logger="carpool.backends.minilm"):
        load(monkeypatch, VNNI)
    assert checked == ["int8", "int7"]
    assert "int8 weights give cosine 0.9585 (< 0.99)" in caplog.text
    assert "-int7-" in served_graph(caplog).name
    assert "int7 weights, as int8 ones gave cosine 0.9585 here, check cosine >= 0.9966" in (
        caplog.text
    )

    scores["int7"] = 0.97
    checked.clear()
    with pytest.raises(ConfigError, match=r'cosine 0\.9700 .* below the 0\.99 .* engine = "onnx"'):
        load(monkeypatch, VNNI)
    assert checked == ["int8", "int7"]


def test_a_graph_without_its_check_embeddings_is_refused() -> None:
    with pytest.raises(ValueError, match="carries no usable check embeddings"):
        worst_cosine({}, lambda feed: np.zeros((1, 384), np.float32), None)
    with pytest.raises(ValueError, match="carries no usable check embeddings"):
        worst_cosine({"carpool.check": "{}"}, lambda feed: np.zeros((1, 384), np.float32), None)
