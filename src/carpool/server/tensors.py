"""Tensor codecs of the v2 protocol: binary layouts and JSON ``data`` lists. Errors are builtins
with a message ready for the client (``ValueError``: the client's data; ``TypeError``: an
array the server cannot express). BF16 is held as float32: the upper 16 bits, rounded to
nearest even when encoding. Pure: numpy only."""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from carpool.datatypes import FIXED_DTYPES, STRING_KINDS, element_size

__all__ = [
    "serialize_bytes_tensor",
    "deserialize_bytes_tensor",
    "serialize_bf16_tensor",
    "deserialize_bf16_tensor",
    "array_from_json",
    "array_from_wire",
    "check_shape",
    "raw_shape",
    "array_to_json",
    "array_to_wire",
    "json_may_hold_booleans",
]

Array = npt.NDArray[Any]

_MAX_DIMS = 32  # numpy 1.x's limit (numpy 2 allows 64); no model input needs more
_MAX_EXTENT = (2**63 - 1) // 8  # numpy refuses shapes whose nonzero dims * itemsize overflow
_U32 = struct.Struct("<I")
# The wire's little-endian dtypes, made once: newbyteorder() builds a new dtype per call.
_LITTLE = {name: dtype.newbyteorder("<") for name, dtype in FIXED_DTYPES.items()}
_JSON_TYPES = {bool: "a boolean", int: "a number", float: "a number", str: "a string"}


def serialize_bytes_tensor(array: Array) -> bytes:
    """Row-major elements, each a 4-byte little-endian length then its bytes (str as UTF-8).

    Raises ``TypeError`` for elements that are neither bytes nor str.
    """
    parts: list[bytes] = []
    for index, item in enumerate(array.reshape(-1).tolist()):
        if isinstance(item, str):
            item = item.encode()
        elif not isinstance(item, bytes | bytearray):
            raise TypeError(f"BYTES element {index} is {type(item).__name__}, not bytes or str")
        parts.append(_U32.pack(len(item)))
        parts.append(item)
    return b"".join(parts)


def deserialize_bytes_tensor(buf: bytes | memoryview, count: int) -> Array:
    """Exactly ``count`` length-prefixed elements from ``buf``, as a 1-D object array of bytes.

    Raises ``ValueError`` unless the prefixes consume exactly the whole buffer.
    """
    view = memoryview(buf)
    end = len(view)
    if 4 * count > end:  # before allocating: a shape cannot claim more than was sent
        raise ValueError(f"{count} BYTES elements need at least {4 * count} bytes, got {end}")
    out = np.empty(count, dtype=object)
    offset = 0
    for index in range(count):
        if offset + 4 > end:
            raise ValueError(f"the data ends inside the length prefix of element {index}")
        (length,) = _U32.unpack_from(view, offset)
        offset += 4
        if offset + length > end:
            raise ValueError(f"element {index} declares {length} bytes, {end - offset} remain")
        out[index] = bytes(view[offset : offset + length])
        offset += length
    if offset != end:
        raise ValueError(f"{end - offset} bytes remain after the last of {count} elements")
    return out


def serialize_bf16_tensor(array: Array) -> bytes:
    """BF16 bits of a float (or ``ml_dtypes.bfloat16``) array, little-endian.

    Rounds to nearest even, as torch and ml_dtypes do; NaN stays a quiet NaN.
    """
    if array.dtype.name == "bfloat16":
        return np.ascontiguousarray(array).reshape(-1).view(np.uint16).astype("<u2").tobytes()
    values = np.ascontiguousarray(array, dtype=np.float32).reshape(-1)
    bits = values.view(np.uint32)
    rounded = ((bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16).astype("<u2")
    nan = np.isnan(values)
    if nan.any():  # rounding could carry a NaN's mantissa into the exponent
        rounded[nan] = ((bits[nan] >> 16) | 0x0040).astype("<u2")
    return rounded.tobytes()


def deserialize_bf16_tensor(buf: bytes | memoryview) -> npt.NDArray[np.float32]:
    """BF16 bits widened to float32; exact, since BF16 is float32 with a shorter mantissa."""
    bits = np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16
    return bits.view(np.float32)


def array_from_wire(buf: bytes | memoryview, *, datatype: str, count: int, name: str) -> Array:
    """A flat array of ``count`` elements of input ``name`` from its binary data.

    Fixed-size types are zero-copy views of ``buf``, aligned or not (numpy reads either,
    and what a model gets is the batch stacked from them, a copy). Raises
    ``ValueError`` for a size that does not fit the shape, BYTES framing errors, and BOOL
    bytes other than 0 and 1.
    """
    itemsize = element_size(datatype)
    if itemsize is not None and len(buf) != count * itemsize:
        raise ValueError(
            f"input byte size mismatch for input '{name}'. Expected {count * itemsize}, "
            f"got {len(buf)}"
        )
    if datatype == "BYTES":
        try:
            return deserialize_bytes_tensor(buf, count)
        except ValueError as exc:
            raise ValueError(f"Unable to parse BYTES data of input '{name}': {exc}") from None
    if datatype == "BF16":
        return deserialize_bf16_tensor(buf)
    array = np.frombuffer(buf, dtype=_LITTLE[datatype])
    if datatype == "BOOL" and count and array.view(np.uint8).max() > 1:
        raise ValueError(f"BOOL data of input '{name}' must be bytes 0 or 1")
    return array  # even misaligned: the batch a model gets is always a fresh, aligned stack


def check_shape(value: Any, *, name: str) -> tuple[int, ...]:
    """Input ``name``'s JSON shape, checked before anything is allocated from it.

    Non-negative integers (not booleans), at most 32 of them, whose product numpy can
    represent. Raises ``ValueError`` with Triton's wording.
    """
    if (
        type(value) is not list
        or len(value) > _MAX_DIMS
        or not all(type(d) is int and d >= 0 for d in value)
    ):
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:60] + "..."
        raise ValueError(
            f"Unable to parse 'shape' of input '{name}': expected at most {_MAX_DIMS} "
            f"non-negative integers, got {shown}"
        )
    if math.prod(d for d in value if d) > _MAX_EXTENT:
        raise ValueError(
            f"input '{name}' with shape {value} causes total element count to exceed "
            f"maximum size of {_MAX_EXTENT}"
        )
    return tuple(value)


def raw_shape(dims: Sequence[int], *, datatype: str, nbytes: int, name: str) -> list[int]:
    """The shape a raw binary body of ``nbytes`` fills, deducing the one ``-1`` if present.

    Triton's rules and wording: BYTES needs shape [1] (the body is that one element), and
    at most one dimension may vary. Raises ``ValueError`` when the body cannot fill it.
    """
    shape = list(dims)
    if datatype == "BYTES":
        if -1 in shape or math.prod(shape) != 1:
            raise ValueError(
                f"For BYTE datatype raw input '{name}', the model must have input shape [1]"
            )
        return shape
    if shape.count(-1) > 1:
        raise ValueError(
            f"The shape of the raw input '{name}' can not be deduced because there are more "
            "than one variable-sized dimension"
        )
    step = (element_size(datatype) or 0) * math.prod(d for d in shape if d != -1)
    if -1 in shape:
        if step == 0 or nbytes % step:
            raise ValueError(
                f"The shape of the raw input '{name}' can not be deduced: {nbytes} bytes do "
                f"not fill shape {shape} a whole number of times"
            )
        shape[shape.index(-1)] = nbytes // step
    return shape


def array_from_json(
    data: Any,
    *,
    datatype: str,
    count: int | None,
    name: str,
    booleans: bool = True,
    first: int = 0,
) -> Array:
    """A flat array from input ``name``'s JSON ``data`` (flat or nested) of ``count`` elements.

    Elements must be of the JSON type the datatype takes: true/false for BOOL, integers in
    range for integer types, numbers for floats, strings for BYTES (UTF-8 encoded). Nothing
    wraps or truncates silently. BF16 has no JSON form. ``booleans=False`` says no array of
    the JSON text holds a ``true`` or ``false`` (:func:`json_may_hold_booleans`), which
    lets numbers skip a per-element type check. ``count=None`` takes any count and ``first``
    numbers the elements from there: a piece of a larger array (:mod:`.json_arrays`).
    Raises ``ValueError``.
    """
    if not booleans and datatype in _FLOAT_TYPES and type(data) is list:
        fast = _floats_without_booleans(data, datatype, count)
        if fast is not None:
            return fast
    where = f"Unable to parse 'data' of input '{name}'"
    if datatype == "BF16":
        raise ValueError(
            "receiving BF16 data via JSON is not supported. Please use the binary data format "
            f"for input '{name}'"
        )
    if type(data) is not list:
        raise ValueError(f"{where}: expected an array, got {_kind(data)}")
    types = set(map(type, data))  # every element's JSON type, in one C-speed pass
    flat = data
    if list in types:  # nested: flatten, then look again
        flat = _flatten(data)
        types = set(map(type, flat))
    if count is not None and len(flat) != count:
        raise ValueError(f"{where}: it holds {len(flat)} elements but the shape needs {count}")
    if datatype == "BYTES":
        if not types <= {str}:
            raise ValueError(f"{where}: BYTES need strings; {_first_not(flat, (str,), first)}")
        out = np.empty(len(flat), dtype=object)
        out[:] = [item.encode() for item in flat]
        return out
    if datatype == "BOOL":
        if not types <= {bool}:
            raise ValueError(f"{where}: BOOL needs true/false; {_first_not(flat, (bool,), first)}")
        return np.array(flat, dtype=np.bool_)
    if FIXED_DTYPES[datatype].kind in "iu":
        return _integers_from_json(flat, types, datatype, where, first)
    return _floats_from_json(flat, types, datatype, where, first)


_FLOAT_TYPES = frozenset({"FP32", "FP64"})  # FP16's rounding stays on the checked path
_F32_MAX = float(np.finfo(np.float32).max)


def _floats_without_booleans(data: list[Any], datatype: str, count: int | None) -> Array | None:
    """JSON numbers known to hold no booleans, read by numpy's own type discovery: what
    is not all numbers (strings, nulls, objects) or not ``count`` of them, ragged nesting,
    and integers past 64 bits come back None, for the checked path to refuse with its
    message."""
    try:
        raw = np.array(data)
    except (ValueError, OverflowError, RecursionError):
        return None
    if raw.dtype.kind not in "fi" or (count is not None and raw.size != count):
        return None
    flat = raw.reshape(-1)
    if datatype == "FP64":
        return flat.astype(np.float64, copy=False)
    # Past float32's range (an infinity too) goes the checked way, which refuses a finite
    # number too large and keeps the infinities; NaN is ignored here and kept.
    if raw.dtype.kind == "f" and np.fmax.reduce(np.abs(flat), initial=0.0) > _F32_MAX:
        return None
    return flat.astype(np.float32)


def json_may_hold_booleans(text: bytes | memoryview) -> bool:
    """Whether a JSON text may hold a boolean in an array (a ``true`` or ``false`` after
    ``[`` or ``,``; a parameter's follows ``:``): a few searches in C, so that
    :func:`array_from_json` can read numbers without a type check per element when not."""
    raw = text if isinstance(text, bytes) else bytes(text)
    # A one-byte find is memchr, ten times a four-byte find over digits: look for the token's
    # first letter, which numbers never hold, then at what is there.
    for first, token in ((b"t", b"true"), (b"f", b"false")):
        at = raw.find(first)
        while at != -1:
            if raw.startswith(token, at):
                before = at - 1
                while before >= 0 and raw[before] in b" \t\r\n":
                    before -= 1
                if before >= 0 and raw[before] in b"[,":
                    return True
            at = raw.find(first, at + 1)
    return False


def _integers_from_json(
    flat: list[Any], types: set[type], datatype: str, where: str, first: int
) -> Array:
    # Integers only, each in the datatype's range, checked before any cast could wrap.
    dtype = FIXED_DTYPES[datatype]
    info = np.iinfo(dtype)
    wanted = f"{where}: {datatype} needs integers in [{info.min}, {info.max}]"
    if not types <= {int}:
        raise ValueError(f"{wanted}; {_first_no_integer(flat, info, first)}")
    raw = np.array(flat)  # int64 or uint64; float64 only for a mix of both ranges
    exact = raw.dtype.kind in "iu"
    low, high = (
        (int(raw.min()), int(raw.max())) if exact else (min(flat, default=0), max(flat, default=0))
    )
    if low < info.min or high > info.max:
        raise ValueError(f"{wanted}; {_first_no_integer(flat, info, first)}")
    return raw.astype(dtype) if exact else np.array(flat, dtype=dtype)


def _floats_from_json(
    flat: list[Any], types: set[type], datatype: str, where: str, first: int
) -> Array:
    # Numbers, rounded to the nearest value of the datatype; one too large for it is refused.
    if not types <= {int, float}:
        wrong = _first_not(flat, (int, float), first)
        raise ValueError(f"{where}: {datatype} needs numbers; {wrong}")
    try:
        with np.errstate(over="ignore"):
            out = np.array(flat, dtype=FIXED_DTYPES[datatype])
    except OverflowError:  # an integer past float64's range (the stdlib reads any size)
        raise ValueError(f"{where}: a value is out of range for {datatype}") from None
    if not np.isfinite(out).all():
        # NaN and +-Infinity sent as such (bare tokens, as Triton's JSON takes them) stay;
        # a finite number that does not fit the datatype is refused.
        sent = np.array(flat, dtype=np.float64)
        if (np.isfinite(sent) & ~np.isfinite(out)).any():
            raise ValueError(f"{where}: a value is out of range for {datatype}")
    return out


def array_to_json(array: Array, *, datatype: str, name: str) -> Array | list[Any]:
    """Output ``name``'s JSON ``data``: flat and row-major.

    Numbers come back as a contiguous native 1-D array, which orjson writes fast with
    ``OPT_SERIALIZE_NUMPY`` (``.tolist()`` it for other encoders); FP16 is widened to
    float64, which prints exactly. BYTES come back as a list of str. Raises ``ValueError``
    for BF16 and non-UTF-8 bytes (the client must ask for binary data), ``TypeError`` when
    the array cannot be sent as ``datatype``.
    """
    cannot = f"output '{name}' cannot be sent as JSON"
    advice = 'request it with "parameters": {"binary_data": true}'
    if datatype == "BF16":
        raise ValueError(f"{cannot}: BF16 has no JSON form; {advice}")
    if datatype == "BYTES":
        _check_kind(array, datatype, STRING_KINDS, name)
        out: list[Any] = []
        for index, item in enumerate(array.reshape(-1).tolist()):
            if isinstance(item, bytes | bytearray):
                try:
                    item = item.decode()
                except UnicodeDecodeError:
                    raise ValueError(f"{cannot}: element {index} is not UTF-8; {advice}") from None
            elif not isinstance(item, str):
                raise TypeError(f"output '{name}': BYTES element {index} is {type(item).__name__}")
            out.append(item)
        return out
    flat = np.ascontiguousarray(_cast(array, datatype, name), dtype=FIXED_DTYPES[datatype]).reshape(
        -1
    )
    return flat.astype(np.float64) if datatype == "FP16" else flat


def array_to_wire(array: Array, *, datatype: str, name: str) -> bytes | memoryview:
    """Output ``name``'s binary data: row-major, little-endian, no padding.

    Raises ``TypeError`` when the array cannot be sent as ``datatype``.
    """
    if datatype == "BYTES":
        _check_kind(array, datatype, STRING_KINDS, name)
        try:
            return serialize_bytes_tensor(array)
        except TypeError as exc:
            raise TypeError(f"output '{name}': {exc}") from None
    if datatype == "BF16":
        if array.dtype.name != "bfloat16":
            _check_kind(array, datatype, "fiu", name)
        return serialize_bf16_tensor(array)
    wire = np.ascontiguousarray(_cast(array, datatype, name), dtype=_LITTLE[datatype])
    return wire.reshape(-1).view(np.uint8).data


def _cast(array: Array, datatype: str, name: str) -> Array:
    # Same-kind casts only (float64 -> FP32 yes, float -> INT32 no): silently truncating a
    # model's output would send a wrong answer, not an encoding detail.
    if array.dtype is FIXED_DTYPES[datatype]:  # nothing to cast (the usual answer)
        return array
    if array.dtype.kind not in "biuf" or not np.can_cast(
        array.dtype, FIXED_DTYPES[datatype], casting="same_kind"
    ):
        raise TypeError(f"output '{name}': a {array.dtype} array cannot be sent as {datatype}")
    return array


def _check_kind(array: Array, datatype: str, kinds: str, name: str) -> None:
    if array.dtype.kind not in kinds:
        raise TypeError(f"output '{name}': a {array.dtype} array cannot be sent as {datatype}")


def _flatten(data: list[Any]) -> list[Any]:
    # Iterative, so deep nesting costs no Python stack. Like Triton, any nesting that holds
    # the right number of elements in row-major order is accepted.
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if type(item) is list:
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def _first_no_integer(flat: list[Any], info: Any, first: int) -> str:
    # Error path only: the first element that is no integer, or one out of range, in order:
    # what a reader that takes the array in pieces meets first too.
    for index, item in enumerate(flat, first):
        if type(item) is not int:
            return _first_not([item], (int,), index)
        if not info.min <= item <= info.max:
            return f"got {item}"
    return "no element is of the wrong type"


def _first_not(flat: list[Any], wanted: tuple[type, ...], first: int) -> str:
    # Error path only: name the first element of the wrong JSON type.
    for index, item in enumerate(flat, first):
        if type(item) not in wanted:
            shown = repr(item) if type(item) is float else _kind(item)
            return f"element {index} is {shown}"
    return "no element is of the wrong type"


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return _JSON_TYPES.get(type(value), "an object")
