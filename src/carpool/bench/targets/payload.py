"""What is sent: request shapes from model metadata, request data, and v2 request bodies, each
encoded once and sent over and over. Pure: numpy and :mod:`carpool.server.tensors`, the codecs
the server itself decodes with."""

from __future__ import annotations

import itertools
import json
import string
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from carpool.datatypes import DATATYPES
from carpool.server.tensors import (
    array_to_json,
    array_to_wire,
    deserialize_bf16_tensor,
    serialize_bf16_tensor,
)

__all__ = [
    "HEADER_LENGTH",
    "InputSpec",
    "RequestSpec",
    "check_array",
    "checked_inputs",
    "described_inputs",
    "encode",
    "generate",
    "is_unique",
    "spec_from_metadata",
]

Array = npt.NDArray[Any]
Request = dict[str, Array]

#: The header that splits a binary body into its JSON part and the tensors after it.
HEADER_LENGTH = "Inference-Header-Content-Length"

_GOLDEN = 0x9E3779B1  # Knuth's multiplicative hash: spreads indices evenly over 2**32
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
    described = described_inputs(metadata)
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
    for name, datatype, array in checked_inputs(request, spec):
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


def is_unique(index: int, repeat_fraction: float) -> bool:
    """Whether send ``index`` is one of the others (``--repeat-fraction``): a share
    ``1 - repeat_fraction`` of the indices, spread evenly, so that every caller, client
    process and stride of indices gets its share."""
    return (index * _GOLDEN) & 0xFFFFFFFF >= repeat_fraction * 2**32


def checked_inputs(
    request: Mapping[str, Array], spec: RequestSpec
) -> Iterator[tuple[str, str, Array]]:
    """``(name, datatype, array)`` of each input of ``spec``, in its order, taken from
    ``request``; what :func:`encode` and :func:`carpool.bench.targets.grpc_target.encode_request`
    encode. Raises ``ValueError`` for a missing input or an array its datatype cannot
    carry."""
    for spec_input in spec.inputs:
        name, datatype = spec_input.name, spec_input.datatype
        if name not in request:
            raise ValueError(f"the request has no input {name!r} (it has {', '.join(request)})")
        array = np.asarray(request[name])
        check_array(array, datatype, name)
        yield name, datatype, array


def described_inputs(metadata: Mapping[str, Any]) -> list[tuple[str, str, list[int]]]:
    """``(name, datatype, dims)`` of each input in v2 model metadata; dims may hold ``-1``.

    Shared with :mod:`carpool.bench.targets.requests_file`, so a file's requests are checked
    against the metadata exactly as generated ones are. Raises ``ValueError`` naming what
    is malformed.
    """
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


# ---------------------------------------------------------------------------- helpers


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


def check_array(array: Array, datatype: str, name: str) -> None:
    """Refuse (``ValueError``) what the codec would refuse, worded for an input rather than
    an output."""
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
