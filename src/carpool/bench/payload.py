"""What is sent: request shapes from model metadata, request data, and v2 request bodies.

Pure: numpy and :mod:`carpool.server.tensors` (the v2 codecs the server itself decodes
with), no HTTP client, no orjson. The runner resolves a :class:`RequestSpec` from
``GET /v2/models/NAME``, generates (or reads) a few distinct requests, encodes each once
with :func:`encode`, and sends the bytes over and over.
"""

from __future__ import annotations

import itertools
import json
import math
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from carpool.server.tensors import (
    DATATYPES,
    array_from_json,
    array_to_json,
    array_to_wire,
    check_shape,
    deserialize_bf16_tensor,
    serialize_bf16_tensor,
)

__all__ = [
    "HEADER_LENGTH",
    "InputSpec",
    "RequestSpec",
    "encode",
    "generate",
    "read_requests",
    "read_strings",
    "spec_from_metadata",
]

Array = npt.NDArray[Any]
Request = dict[str, Array]

#: The header that splits a binary body into its JSON part and the tensors after it.
HEADER_LENGTH = "Inference-Header-Content-Length"

_INT_HIGH = 100  # ints in [0, 100): valid for every integer type, and for embedding ids
_WORDS_PER_TEXT = (1, 8)  # random BYTES elements: 1 to 8 words ...
_WORD_LETTERS = (2, 9)  # ... of 2 to 9 lowercase letters
_FLOATS = frozenset({"FP16", "FP32", "FP64", "BF16"})


@dataclass(frozen=True, slots=True)
class InputSpec:
    """One input of a request: ``shape`` is the whole request's, batch axis included, with
    every dimension resolved (no ``-1``)."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """The inputs every request of a run carries, in the model's order."""

    inputs: tuple[InputSpec, ...]


def spec_from_metadata(
    metadata: Mapping[str, Any],
    *,
    rows: int = 1,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    batched: bool | None = None,
) -> RequestSpec:
    """Request shapes from v2 model metadata (``{"inputs": [{"name", "datatype", "shape"}]}``).

    A leading ``-1`` is the batch axis and becomes ``rows``. Any other ``-1`` comes from
    ``shapes`` (input name -> the dims of one row, without the batch axis; for a model
    without batching, its whole shape). ``batched``: whether the leading dimension is the
    batch axis; ``None`` decides from the metadata (every input's shape starts with -1).
    Without it the shape is used as it is and ``rows`` is ignored. Raises ``ValueError``
    for malformed metadata, an unresolved dimension, or ``shapes`` that do not fit.
    """
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 1:
        raise ValueError(f"rows must be an int >= 1, got {rows!r}")
    described = _described_inputs(metadata)
    shapes = dict(shapes or {})
    unknown = sorted(set(shapes) - {name for name, _, _ in described})
    if unknown:
        known = ", ".join(name for name, _, _ in described)
        raise ValueError(
            f"--shape names input {unknown[0]!r}, which the model does not have (inputs: {known})"
        )
    if batched is None:
        batched = all(dims[:1] == [-1] for _, _, dims in described)
    inputs = []
    for name, datatype, dims in described:
        if batched and not dims:
            raise ValueError(f"input {name!r} has shape [], so it has no batch axis")
        row = dims[1:] if batched else dims
        given = shapes.get(name)
        if given is not None:
            row = _fit_row(name, dims, row, given)
        if -1 in row:
            raise ValueError(
                f"input {name!r} has a dimension of any size ({dims}); give it with "
                f"--shape {name}:DIMS"
            )
        shape = (rows, *row) if batched else tuple(row)
        inputs.append(InputSpec(name=name, datatype=datatype, shape=tuple(shape)))
    return RequestSpec(inputs=tuple(inputs))


def generate(
    spec: RequestSpec, count: int, *, seed: int, strings: Sequence[str] | None = None
) -> list[Request]:
    """``count`` requests of random data, the same for the same ``seed``.

    Floats are uniform in [-1, 1) (BF16: float32 values BF16 can hold exactly), integers
    in [0, 100), BOOL fair coin flips; BYTES cycle through ``strings`` (UTF-8 encoded) or
    are random lowercase words. Arrays are in carpool's dtypes (``DATATYPES``); each
    request's arrays are views of one draw per input. Raises ``ValueError`` for a negative
    count or an empty ``strings``.
    """
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ValueError(f"count must be an int >= 0, got {count!r}")
    if strings is not None and not strings:
        raise ValueError("strings is empty; give at least one string, or None for random words")
    rng = np.random.default_rng(seed)
    texts = itertools.cycle([s.encode() for s in strings]) if strings is not None else None
    requests: list[Request] = [{} for _ in range(count)]
    for spec_input in spec.inputs:
        batch = _random(rng, spec_input.datatype, (count, *spec_input.shape), texts)
        for request, array in zip(requests, batch, strict=True):
            request[spec_input.name] = array
    return requests


def read_requests(
    path: str | Path, spec_or_metadata: RequestSpec | Mapping[str, Any]
) -> list[Request]:
    """Requests from a JSON-lines file, one request per non-blank line.

    A line is a v2 request body (``{"inputs": [{"name", "datatype", "shape", "data"}]}``)
    or a plain object ``{"NAME": nested list}`` whose datatypes come from the spec or
    metadata. Shapes must fit: exactly a spec's, or a metadata shape's fixed dimensions.
    A plain object's lists may also be flat (or one row, without the batch axis) when the
    shape leaves at most one dimension to deduce. BF16 data is given as numbers. Raises
    ``ValueError`` naming the line; ``OSError`` when the file cannot be read.
    """
    expected = (
        {i.name: (i.datatype, list(i.shape)) for i in spec_or_metadata.inputs}
        if isinstance(spec_or_metadata, RequestSpec)
        else {name: (dt, dims) for name, dt, dims in _described_inputs(spec_or_metadata)}
    )
    requests: list[Request] = []
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            try:
                requests.append(_request_from_line(line, expected))
            except ValueError as exc:
                raise ValueError(f"{str(path)!r}, line {number}: {exc}") from None
    if not requests:
        raise ValueError(f"{str(path)!r} holds no requests")
    return requests


def read_strings(path: str | Path) -> list[str]:
    """One string per non-blank line (without its line break), for BYTES inputs.

    Raises ``ValueError`` for a file without any, ``OSError`` when it cannot be read.
    """
    with open(path, encoding="utf-8") as file:
        strings = [line.rstrip("\r\n") for line in file if line.strip()]
    if not strings:
        raise ValueError(f"{str(path)!r} holds no strings (one per line)")
    return strings


def encode(
    request: Mapping[str, Array],
    spec: RequestSpec,
    *,
    binary: bool,
    binary_output: bool | None = None,
) -> tuple[bytes, dict[str, str]]:
    """The body and headers of ``POST /v2/models/NAME/infer`` for one request.

    ``spec`` names the inputs and their datatypes (shapes are the arrays' own). JSON
    (``binary=False``: flat ``data`` lists), or the binary tensor extension: a JSON header
    announcing each input's ``binary_data_size``, the raw tensors after it in input order,
    and its length in the ``Inference-Header-Content-Length`` header, laid out as
    tritonclient lays it out. ``binary_output`` (default: ``binary``) asks for every output
    binary. Raises ``ValueError`` for a missing input, an array its datatype cannot carry,
    or data JSON cannot carry (BF16, non-UTF-8 bytes).
    """
    entries: list[dict[str, Any]] = []
    blobs: list[bytes | memoryview] = []
    for spec_input in spec.inputs:
        name, datatype = spec_input.name, spec_input.datatype
        if name not in request:
            raise ValueError(f"the request has no input {name!r} (it has {', '.join(request)})")
        array = np.asarray(request[name])
        _check_array(array, datatype, name)
        entry: dict[str, Any] = {"name": name, "shape": list(array.shape), "datatype": datatype}
        if binary:
            blobs.append(array_to_wire(array, datatype=datatype, name=name))
            entry["parameters"] = {"binary_data_size": len(blobs[-1])}
        else:
            entry["data"] = _json_data(array, datatype, name)
        entries.append(entry)
    doc: dict[str, Any] = {"inputs": entries}
    if binary if binary_output is None else binary_output:
        doc["parameters"] = {"binary_data_output": True}
    header = json.dumps(doc, separators=(",", ":")).encode()  # tritonclient's exact bytes
    if not binary:
        return header, {"Content-Type": "application/json"}
    headers = {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(header))}
    return b"".join([header, *blobs]), headers


# ---------------------------------------------------------------------------- helpers


def _described_inputs(metadata: Mapping[str, Any]) -> list[tuple[str, str, list[int]]]:
    # (name, datatype, dims) of each input, checked; dims may hold -1.
    inputs = metadata.get("inputs") if isinstance(metadata, Mapping) else None
    if not isinstance(inputs, list) or not inputs:
        raise ValueError("model metadata has no 'inputs' list")
    out = []
    for index, item in enumerate(inputs):
        name = item.get("name") if isinstance(item, Mapping) else None
        if not isinstance(name, str):
            raise ValueError(f"model metadata: inputs[{index}] has no name")
        datatype = item.get("datatype")
        if datatype not in DATATYPES:
            raise ValueError(
                f"model metadata: input {name!r} has datatype {datatype!r}, expected one of "
                + ", ".join(DATATYPES)
            )
        dims = item.get("shape")
        if not isinstance(dims, list) or not all(type(d) is int and d >= -1 for d in dims):
            raise ValueError(f"model metadata: input {name!r} has shape {dims!r}")
        out.append((name, datatype, dims))
    return out


def _fit_row(name: str, dims: list[int], row: list[int], given: tuple[int, ...]) -> list[int]:
    # The --shape dims in place of the row's, checked against its fixed dimensions.
    fits = len(given) == len(row) and all(
        type(g) is int and g >= 0 and r in (-1, g) for g, r in zip(given, row, strict=False)
    )
    if not fits:
        raise ValueError(
            f"--shape {name}:{','.join(map(str, given))} does not fit input {name!r} of "
            f"shape {dims}: give {len(row)} dims of one row, matching its fixed ones"
        )
    return list(given)


def _random(
    rng: np.random.Generator,
    datatype: str,
    shape: tuple[int, ...],
    texts: Any,
) -> Array:
    dtype = DATATYPES[datatype]
    if datatype in _FLOATS:
        values = rng.uniform(-1.0, 1.0, size=shape)
        if datatype == "BF16":  # round to what the wire carries, so a round trip is exact
            return deserialize_bf16_tensor(serialize_bf16_tensor(values)).reshape(shape)
        return values.astype(dtype)
    if datatype == "BOOL":
        return rng.integers(0, 2, size=shape, dtype=np.uint8).astype(np.bool_)
    if datatype == "BYTES":
        out = np.empty(shape, dtype=object)
        flat = out.reshape(-1)
        for i in range(flat.size):
            flat[i] = next(texts) if texts is not None else _words(rng)
        return out
    return rng.integers(0, _INT_HIGH, size=shape, dtype=dtype)


def _words(rng: np.random.Generator) -> bytes:
    letters = string.ascii_lowercase.encode()
    count = int(rng.integers(_WORDS_PER_TEXT[0], _WORDS_PER_TEXT[1] + 1))
    lengths = rng.integers(_WORD_LETTERS[0], _WORD_LETTERS[1] + 1, size=count)
    picks = rng.integers(0, len(letters), size=int(lengths.sum()))
    chars = bytes(letters[i] for i in picks)
    ends = np.cumsum(lengths)
    return b" ".join(
        chars[end - n : end] for end, n in zip(ends.tolist(), lengths.tolist(), strict=True)
    )


def _check_array(array: Array, datatype: str, name: str) -> None:
    # Refuse what the codec would refuse, worded for an input rather than an output.
    kind = array.dtype.kind
    if datatype == "BYTES":
        ok = kind in "OSU"
    elif datatype == "BF16":
        ok = kind in "fiu" or array.dtype.name == "bfloat16"
    else:
        ok = kind in "biuf" and np.can_cast(array.dtype, DATATYPES[datatype], "same_kind")
    if not ok:
        raise ValueError(f"input {name!r}: a {array.dtype} array cannot be sent as {datatype}")


def _json_data(array: Array, datatype: str, name: str) -> list[Any]:
    if datatype == "BF16":
        raise ValueError(f"input {name!r} is BF16, which JSON cannot carry; send it binary")
    if datatype == "BYTES":
        out = []
        for index, item in enumerate(array.reshape(-1).tolist()):
            if isinstance(item, bytes | bytearray):
                try:
                    item = item.decode()
                except UnicodeDecodeError:
                    raise ValueError(
                        f"input {name!r}: element {index} is not UTF-8, which JSON cannot "
                        "carry; send it binary"
                    ) from None
            elif not isinstance(item, str):
                raise ValueError(f"input {name!r}: BYTES element {index} is {type(item).__name__}")
            out.append(item)
        return out
    data = array_to_json(array, datatype=datatype, name=name)
    return data.tolist() if isinstance(data, np.ndarray) else data


def _request_from_line(line: str, expected: Mapping[str, tuple[str, list[int]]]) -> Request:
    try:
        doc = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError("expected a JSON object")
    items: list[tuple[str, str | None, tuple[int, ...] | None, Any]]
    if "inputs" in doc and isinstance(doc["inputs"], list) and "inputs" not in expected:
        items = [_v2_input(item, index) for index, item in enumerate(doc["inputs"])]
    else:
        items = [(name, None, None, data) for name, data in doc.items()]
    request: Request = {}
    for name, datatype, shape, data in items:
        if name not in expected:
            raise ValueError(f"input {name!r} is not one of the model's ({', '.join(expected)})")
        if name in request:
            raise ValueError(f"input {name!r} is given twice")
        want_type, dims = expected[name]
        if datatype is not None and datatype != want_type:
            raise ValueError(f"input {name!r} is {datatype}, the model takes {want_type}")
        request[name] = _array(name, want_type, dims, shape, data)
    missing = [name for name in expected if name not in request]
    if missing:
        raise ValueError(f"input {missing[0]!r} is missing")
    return request


def _v2_input(item: Any, index: int) -> tuple[str, str | None, tuple[int, ...], Any]:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise ValueError(f"inputs[{index}] must be an object with a name")
    name = item["name"]
    if "data" not in item:
        raise ValueError(f"input {name!r} has no 'data' (binary data cannot be read from JSON)")
    datatype = item.get("datatype")
    if not isinstance(datatype, str):
        raise ValueError(f"input {name!r} has no datatype")
    return name, datatype, check_shape(item.get("shape"), name=name), item["data"]


def _array(
    name: str, datatype: str, dims: list[int], shape: tuple[int, ...] | None, data: Any
) -> Array:
    # The input's array: a v2 body's declared shape must fit dims; a plain object's nested
    # lists give the shape, or are reshaped when dims leave one dimension to deduce.
    if not isinstance(data, list):
        raise ValueError(f"input {name!r}: expected a list of values")
    nested = shape is None
    if shape is None:
        shape = _nested_shape(data)
    count = math.prod(shape)
    wire_type = "FP32" if datatype == "BF16" else datatype
    flat = array_from_json(data, datatype=wire_type, count=count, name=name)
    if datatype == "BF16":
        flat = deserialize_bf16_tensor(serialize_bf16_tensor(flat))
    if not _fits(shape, dims):
        resolved = _deduce(dims, count) if nested else None
        if resolved is None:
            raise ValueError(f"input {name!r} has shape {list(shape)}, the model takes {dims}")
        shape = resolved
    return flat.reshape(shape)


def _nested_shape(data: list[Any]) -> tuple[int, ...]:
    shape = []
    level: Any = data
    while isinstance(level, list):
        shape.append(len(level))
        if not level:
            break
        level = level[0]
    return tuple(shape)


def _fits(shape: tuple[int, ...], dims: list[int]) -> bool:
    return len(shape) == len(dims) and all(d in (-1, s) for s, d in zip(shape, dims, strict=True))


def _deduce(dims: list[int], count: int) -> tuple[int, ...] | None:
    # dims with its one -1 (if any) set so that the shape holds count elements.
    known = math.prod(d for d in dims if d != -1)
    if dims.count(-1) > 1 or (dims.count(-1) == 0 and known != count):
        return None
    if -1 in dims:
        if known == 0 or count % known:
            return None
        return tuple(count // known if d == -1 else d for d in dims)
    return tuple(dims)
