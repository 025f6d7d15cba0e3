"""ONNX files served through onnxruntime as a :class:`carpool.Model`: the graph's signature
(names, datatypes, batch axis) and the numpy <-> onnxruntime crossing. onnxruntime is imported
only when :func:`onnx_model` is called, so ``import carpool`` never pays for it."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from carpool.model import Batching, Model, Tensor

__all__ = ["onnx_model"]

log = logging.getLogger("carpool.backends.onnx")

# onnxruntime's type string -> (v2 datatype, the numpy dtype onnxruntime takes and returns).
_TYPES: dict[str, tuple[str, np.dtype[Any]]] = {
    "tensor(float)": ("FP32", np.dtype(np.float32)),
    "tensor(double)": ("FP64", np.dtype(np.float64)),
    "tensor(float16)": ("FP16", np.dtype(np.float16)),
    "tensor(int8)": ("INT8", np.dtype(np.int8)),
    "tensor(int16)": ("INT16", np.dtype(np.int16)),
    "tensor(int32)": ("INT32", np.dtype(np.int32)),
    "tensor(int64)": ("INT64", np.dtype(np.int64)),
    "tensor(uint8)": ("UINT8", np.dtype(np.uint8)),
    "tensor(uint16)": ("UINT16", np.dtype(np.uint16)),
    "tensor(uint32)": ("UINT32", np.dtype(np.uint32)),
    "tensor(uint64)": ("UINT64", np.dtype(np.uint64)),
    "tensor(bool)": ("BOOL", np.dtype(np.bool_)),
    "tensor(string)": ("BYTES", np.dtype(object)),  # str inside onnxruntime, bytes outside
}

_DTYPES = dict(_TYPES.values())  # v2 datatype -> numpy dtype

# A GPU when this onnxruntime build has one, else the CPU; never the remote Azure provider.
_PREFERRED = ("CUDAExecutionProvider", "CPUExecutionProvider")

Array = np.ndarray[Any, Any]


def onnx_model(
    path: str | os.PathLike[str],
    *,
    name: str | None = None,
    version: str = "1",
    batching: Batching | None = None,
    providers: Sequence[str] | None = None,
    intra_op_threads: int | None = None,
    inter_op_threads: int | None = None,
) -> Model:
    """A :class:`Model` that runs the ONNX file at ``path`` in one onnxruntime session.

    The signature comes from the graph, so metadata is exact and mismatched requests are
    refused before they queue. The first axis is the batch axis when it is dynamic (symbolic
    or unknown) on every input; otherwise the graph fixes every request's shape, so the model
    is served with batching off (``max_batch_size=0``) and a warning says why. ``name``
    defaults to the file's stem. ``providers`` defaults to CUDA when this onnxruntime build
    has it, then the CPU. The session is created once and shared by every worker:
    ``InferenceSession.run`` is thread-safe. The thread counts are onnxruntime's session
    options (0 or None: onnxruntime's default).

    Raises ``ImportError`` when onnxruntime is not installed, and ``ValueError`` for a
    missing file, a file onnxruntime cannot load, an input or output type carpool cannot
    carry, an unavailable provider, or a thread count below 0.
    """
    file = Path(path)
    session = _session(file, providers, intra_op_threads, inter_op_threads)
    model_name = name if name is not None else file.stem
    requested = batching if batching is not None else Batching()
    graph_inputs, graph_outputs = session.get_inputs(), session.get_outputs()
    batched = _batch_axis(file, model_name, requested, graph_inputs)
    settings = (
        requested if batched else replace(requested, max_batch_size=0, allowed_batch_sizes=())
    )
    inputs = tuple(_tensor(file, "input", arg, batched) for arg in graph_inputs)
    outputs = tuple(_tensor(file, "output", arg, batched) for arg in graph_outputs)
    return Model(
        _runner(session, inputs, outputs),
        name=model_name,
        inputs=inputs,
        outputs=outputs,
        batching=settings,
        version=version,
        platform="onnxruntime_onnx",  # what Triton reports for the same file
    )


def _session(
    file: Path,
    providers: Sequence[str] | None,
    intra_op_threads: int | None,
    inter_op_threads: int | None,
) -> Any:
    """One onnxruntime session of ``file``, its options and providers checked first."""
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise ImportError(
            "carpool's ONNX backend needs onnxruntime: pip install 'carpool[onnx]'"
        ) from exc
    if not file.is_file():
        raise ValueError(f"ONNX model {file}: no such file; give the path of a .onnx file")
    options = ort.SessionOptions()
    if intra_op_threads is not None:
        options.intra_op_num_threads = _check_threads("intra_op_threads", intra_op_threads)
    if inter_op_threads is not None:
        options.inter_op_num_threads = _check_threads("inter_op_threads", inter_op_threads)
    chosen = _providers(file, providers, list(ort.get_available_providers()))
    try:
        return ort.InferenceSession(str(file), sess_options=options, providers=chosen)
    except Exception as exc:  # onnxruntime's error types derive from Exception directly
        raise ValueError(
            f"ONNX model {file}: onnxruntime cannot load it ({exc}); give a file exported to "
            "ONNX, e.g. with torch.onnx.export"
        ) from exc


def _batch_axis(file: Path, name: str, requested: Batching, graph_inputs: Sequence[Any]) -> bool:
    """Whether to batch along the first axis: asked to, and it is dynamic on every input.
    A graph that fixes it is served with batching off, and a warning says why."""
    fixed = next((arg for arg in graph_inputs if not _dynamic_first(arg.shape)), None)
    if requested.batched and fixed is not None:
        log.warning(
            "ONNX model %r (%s): input %r has shape %s, with no dynamic first axis to batch "
            "along; serving it with batching off (each request runs alone, in that shape)",
            name,
            file,
            fixed.name,
            list(fixed.shape),
        )
    return requested.batched and fixed is None


def _check_threads(option: str, value: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{option} must be an int >= 0 (0: onnxruntime's default), got {value!r}")
    return value


def _providers(file: Path, providers: Sequence[str] | None, available: list[str]) -> list[str]:
    """The execution providers to ask for, checked here because onnxruntime only warns about
    an unknown one and silently falls back to the CPU."""
    if providers is None:
        return [p for p in _PREFERRED if p in available]
    if isinstance(providers, str):
        raise TypeError(f"providers must be a list of names, e.g. [{providers!r}]")
    missing = [p for p in providers if p not in available]
    if missing or not providers:
        problem = f"execution providers {missing} are not available" if missing else "none given"
        raise ValueError(f"ONNX model {file}: {problem}; choose from {available}")
    return list(providers)


def _dynamic_first(shape: Sequence[int | str | None]) -> bool:
    """Whether the first axis may take any size: symbolic (a str), unknown, or negative."""
    return bool(shape) and not (isinstance(shape[0], int) and shape[0] >= 0)


def _tensor(file: Path, kind: str, arg: Any, batched: bool) -> Tensor:
    """The Tensor for a graph input or output: the row shape when batched, else the whole."""
    if arg.type not in _TYPES:
        served = ", ".join(t[len("tensor(") : -1] for t in _TYPES)
        raise ValueError(
            f"ONNX model {file}: {kind} {arg.name!r} has type {arg.type}, which carpool cannot "
            f"carry; it serves tensors of {served}"
        )
    shape = list(arg.shape)
    if batched and not shape:
        raise ValueError(
            f"ONNX model {file}: {kind} {arg.name!r} has no axes (a scalar, or a shape "
            "onnxruntime cannot infer), so it cannot hold one row per request row; serve it "
            "with batching off (max_batch_size=0)"
        )
    dims = shape[1:] if batched else shape
    return Tensor(
        arg.name,
        _TYPES[arg.type][0],
        tuple(d if isinstance(d, int) and d >= 0 else -1 for d in dims),
    )


def _runner(
    session: Any, inputs: tuple[Tensor, ...], outputs: tuple[Tensor, ...]
) -> Callable[[Any], dict[str, Array]]:
    """The model function: one batch (a dict by input name, or the single input's array, as
    :attr:`Model.takes_dict` says) through ``session.run``, outputs by name."""
    dtypes = {t.name: _DTYPES[t.datatype] for t in inputs}
    first = inputs[0].name
    strings = {t.name for t in outputs if t.datatype == "BYTES"}
    names = [t.name for t in outputs]

    def run(batch: Any) -> dict[str, Array]:
        arrays = batch if isinstance(batch, Mapping) else {first: batch}
        feed = {name: _to_ort(arrays[name], dtype) for name, dtype in dtypes.items()}
        results = session.run(None, feed)
        return {
            name: _encode(value) if name in strings else value
            for name, value in zip(names, results, strict=True)
        }

    return run


def _to_ort(value: Any, dtype: np.dtype[Any]) -> Array:
    """``value`` as onnxruntime takes it, copied only when its dtype or layout differs."""
    array = np.asarray(value)
    if dtype.kind == "O":
        # Strings: onnxruntime would turn a bytes element into the text "b'...'".
        if array.dtype.kind == "U":
            return array
        decoded = np.empty(array.shape, dtype=object)
        decoded.flat[:] = [v.decode() if isinstance(v, bytes) else v for v in array.flat]
        return decoded
    if array.dtype != dtype:
        array = array.astype(dtype)
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    return array


def _encode(value: Array) -> Array:
    """A string output (str elements) as BYTES (bytes elements)."""
    encoded = np.empty(value.shape, dtype=object)
    encoded.flat[:] = [v.encode() if isinstance(v, str) else v for v in value.flat]
    return encoded
