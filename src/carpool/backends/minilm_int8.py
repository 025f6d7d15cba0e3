"""``minilm``'s int8 graph: how it is quantized, which weights this CPU gets, and the check at
load. SmoothQuant on the MatMuls fed by LayerNorm, the feed-forward outputs kept in fp32;
``int8`` weights where the CPU's int8 sums are exact, ``int7`` (no 16-bit saturation)
elsewhere. Each graph carries fp32 embeddings of a few texts, and the engine refuses numbers
below :data:`MIN_COSINE`. Why, and what each choice measured: docs/models.md."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from carpool.backends.cpu_features import CpuFeatures

__all__ = [
    "VARIANTS",
    "CHECK_TEXTS",
    "INT8_RECIPE",
    "MIN_COSINE",
    "Weights",
    "check_metadata",
    "choose_weights",
    "quantize",
    "smooth",
    "worst_cosine",
]

# What the quantized graph is; any change here changes its file name, so caches re-export.
INT8_RECIPE: dict[str, Any] = {
    "quantize": "dynamic, QInt8 weights per channel, MatMul",
    "fp32": "feed-forward output dense",
    "smooth": "query, key, value, attention output dense, intermediate dense",
    "alpha": 0.5,
    "check": 1,
}
# Each quantized variant's weight bits and the MatMuls it keeps in fp32 besides the
# feed-forward outputs (node-name parts); part of the cached file's name.
VARIANTS: dict[str, dict[str, Any]] = {
    "int8": {"bits": 8, "also fp32": []},
    "int7": {"bits": 7, "also fp32": ["/attention/self/"]},
}
MIN_COSINE = 0.99  # docs/models.md's promise: cosine to sentence-transformers on every text
# Calibration for smoothing: ordinary sentences of several lengths and kinds (none of them
# the texts the tests check accuracy on). Smoothing needs only each channel's rough scale.
CALIBRATION = (
    "A man is playing a guitar on the street.",
    "Shares dropped sharply after the quarterly report was published.",
    "How do I reset my password if I no longer have access to my email?",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "Error: connection refused while contacting the server at port 8080.",
    "The committee approved the new budget for 2024 after a long debate, and the mayor "
    "promised that the libraries, the parks and the night buses would all keep their funding.",
    "Berlin, Tokyo, São Paulo and Lagos are among the largest cities in the world.",
    "ok thanks",
)
# The load-time check: short texts, where int8 loses most (saturation took "hello" to 0.963
# on an AVX2 CPU), and a few longer ones; one batch, a few milliseconds.
CHECK_TEXTS = (
    "ok",
    "hi",
    "hello",
    "Hello, world!",
    "What is the capital of Australia?",
    "Order #48213 shipped on 2024-03-14 via express courier.",
    "東京は日本の首都です。",
    "Dynamic batching holds requests for a few milliseconds so that one model call serves "
    "many callers; each caller still gets exactly its own row back, as if it ran alone.",
)
_CHECK_KEY = "carpool.check"  # the graph's metadata entry holding the check's embeddings
_FEED_FORWARD_OUT = "/output/dense/"  # in node names; "/attention/output/dense/" excepted

Embed = Callable[[dict[str, np.ndarray[Any, Any]]], np.ndarray[Any, Any]]


@dataclasses.dataclass(frozen=True)
class Weights:
    """The int8 graph a CPU gets: ``variant`` names the cached file ('int8' or 'int7')."""

    variant: str
    reason: str


def choose_weights(cpu: CpuFeatures) -> Weights:
    """8-bit weights where this CPU sums int8 products exactly, 7-bit ones elsewhere."""
    if cpu.exact_int8:
        return Weights("int8", f"int8 weights for {cpu.describe()}")
    return Weights("int7", f"int7 weights, exact without VNNI, for {cpu.describe()}")


def smooth(torch: Any, bert: Any, tokenizer: Any) -> None:
    """SmoothQuant on the MatMuls fed by LayerNorm outputs (and the attention output): each
    input channel j divided by s_j inside the graph, the weight's column j multiplied by it,
    so fp32 results are unchanged and int8 ranges lose their outlier channels."""
    targets = [
        (owner, attr)
        for block in bert.encoder.layer
        for owner, attr in (
            (block.attention.self, "query"),
            (block.attention.self, "key"),
            (block.attention.self, "value"),
            (block.attention.output, "dense"),
            (block.intermediate, "dense"),
        )
    ]
    linears = [getattr(owner, attr) for owner, attr in targets]
    peaks = _input_peaks(torch, bert, tokenizer, linears)
    alpha = INT8_RECIPE["alpha"]
    for (owner, attr), linear, peak in zip(targets, linears, peaks, strict=True):
        column_peak = linear.weight.detach().abs().amax(dim=0).clamp(min=1e-5)
        scale = (peak.clamp(min=1e-5) ** alpha / column_peak ** (1 - alpha)).clamp(min=1e-5)
        setattr(owner, attr, _scaled(torch, linear, scale))


def _input_peaks(torch: Any, bert: Any, tokenizer: Any, linears: list[Any]) -> list[Any]:
    """Each linear layer's largest |input| per channel over the calibration texts."""
    peaks = [torch.zeros(linear.in_features) for linear in linears]

    def hook(index: int) -> Callable[..., None]:
        def record(module: Any, inputs: tuple[Any, ...], output: Any) -> None:
            seen = inputs[0].detach().abs().flatten(0, -2).amax(dim=0)
            peaks[index] = torch.maximum(peaks[index], seen)

        return record

    handles = [linear.register_forward_hook(hook(i)) for i, linear in enumerate(linears)]
    try:
        with torch.inference_mode():
            for text in CALIBRATION:
                encoding = tokenizer.encode(text)
                ids = torch.tensor([encoding.ids])
                bert(input_ids=ids, attention_mask=torch.ones_like(ids))
    finally:
        for handle in handles:
            handle.remove()
    return peaks


def _scaled(torch: Any, linear: Any, scale: Any) -> Any:
    """``linear`` taking inputs pre-divided by ``scale``: the same function in fp32."""

    class Smoothed(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(linear.in_features, linear.out_features)
            with torch.no_grad():
                self.linear.weight.copy_(linear.weight * scale)
                self.linear.bias.copy_(linear.bias)
            self.register_buffer("inverse", (1.0 / scale).contiguous())

        def forward(self, x: Any) -> Any:
            return self.linear(x * self.inverse)

    return Smoothed().eval()


def quantize(source: Path, target: Path, variant: str, check: dict[str, str]) -> None:
    """Dynamic int8 on every MatMul with a constant weight but the feed-forward outputs (and
    those ``variant`` keeps in fp32 besides); ``check`` (:func:`check_metadata`) goes into
    the graph's metadata."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    matmuls = [node.name for node in onnx.load(str(source)).graph.node if node.op_type == "MatMul"]
    kept = [n for n in matmuls if _FEED_FORWARD_OUT in n and "/attention/" not in n]
    if len(kept) != 6:  # one per layer: a transformers change renamed them
        raise RuntimeError(
            f"minilm int8 export: expected 6 feed-forward output MatMuls to keep in fp32, "
            f"found {kept}; the exported graph's node names changed"
        )
    also = VARIANTS[variant]["also fp32"]
    kept += [n for n in matmuls if any(part in n for part in also)]
    with _quiet_quantizer():
        quantize_dynamic(
            source,
            target,
            op_types_to_quantize=["MatMul"],
            per_channel=True,
            reduce_range=VARIANTS[variant]["bits"] == 7,
            weight_type=QuantType.QInt8,
            nodes_to_exclude=kept,
        )
    graph = onnx.load(str(target))
    onnx.helper.set_model_props(graph, check)
    onnx.save(graph, str(target))


def check_metadata(embed: Embed, tokenizer: Any) -> dict[str, str]:
    """The fp32 graph's embeddings of :data:`CHECK_TEXTS`, as the int8 graph's metadata."""
    unit = np.ascontiguousarray(embed(_encoded(tokenizer)), dtype="<f4")
    payload = {"texts": list(CHECK_TEXTS), "float32": base64.b64encode(unit.tobytes()).decode()}
    return {_CHECK_KEY: json.dumps(payload)}


def worst_cosine(metadata: dict[str, str], embed: Embed, tokenizer: Any) -> float:
    """The lowest cosine between the graph's embeddings of the check texts, computed here,
    and the fp32 ones it carries. ``ValueError`` for a graph without them."""
    try:
        payload = json.loads(metadata[_CHECK_KEY])
        texts = tuple(payload["texts"])
        expected = np.frombuffer(base64.b64decode(payload["float32"]), dtype="<f4")
        expected = expected.reshape(len(texts), -1)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"the int8 graph carries no usable check embeddings ({exc!r})") from exc
    got = np.asarray(embed(_encoded(tokenizer, texts)), dtype=np.float64)
    norms = np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1)
    cosines = (got * expected).sum(1) / norms
    return float(cosines.min())


def _encoded(tokenizer: Any, texts: tuple[str, ...] = CHECK_TEXTS) -> dict[str, Any]:
    encodings = tokenizer.encode_batch(list(texts))
    return {
        "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
    }


@contextlib.contextmanager
def _quiet_quantizer() -> Iterator[None]:
    """Without the quantizer's advice on the root logger ("consider pre-processing": its
    pre-processing cannot infer this graph's shapes), and without ``logging.warning``'s
    side effect of configuring the root logger when it has no handler."""
    root = logging.getLogger()
    spare = logging.NullHandler() if not root.handlers else None
    # Drops what is logged on the root logger itself (the quantizer's advice); records of
    # named loggers (carpool's, anyone's) reach the root's handlers without meeting it.
    drop = logging.Filter("\0")
    if spare is not None:
        root.addHandler(spare)
    root.addFilter(drop)
    try:
        yield
    finally:
        root.removeFilter(drop)
        if spare is not None:
            root.removeHandler(spare)
