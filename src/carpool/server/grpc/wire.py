"""A ``ModelInferRequest``'s tensor bytes read where they lie in the message grpc received.
protobuf copies raw and packed contents as it parses and again on each read (a 16 MiB raw
tensor costs ~5x its size), so raw entries and packed FP32/FP64 contents become views here and
only the rest is parsed by protobuf. A message this walk does not follow is parsed whole, so
every refusal is protobuf's own. Pure: bytes in, records out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tritonclient.grpc import service_pb2 as pb

__all__ = ["WALK_BYTES", "Received", "read_infer_request", "varint"]

# Below this many bytes, copying the tensors costs less than walking the fields (measured:
# the walk costs ~3.5 us, a whole 64 KiB message's parse and copy ~1 us more than a 2 KiB's).
WALK_BYTES = 64 * 1024
_LEN = 2  # the wire type of bytes, strings, messages and packed repeated fields
_RAW, _INPUTS = 7, 5  # ModelInferRequest's raw_input_contents and inputs
_CONTENTS = 5  # InferInputTensor's contents
_PACKED = {6: "fp32_contents", 7: "fp64_contents"}  # InferTensorContents' fixed-width floats


class _Irregular(ValueError):
    """The bytes are not the fields this walk follows: parse them whole instead."""


@dataclass(frozen=True, slots=True)
class Received:
    """A ``ModelInferRequest`` as received: ``message`` without the tensor bytes lifted out
    of it, ``size`` bytes in all, ``raw`` its ``raw_input_contents`` (``None``: it had none),
    and ``typed`` each input's packed float contents by input index, as (field, bytes)."""

    message: Any
    size: int  # bytes received
    raw: tuple[memoryview, ...] | None = None
    typed: Mapping[int, tuple[str, memoryview]] | None = None  # None: none (no dict made)

    @property
    def model_name(self) -> str:
        return str(self.message.model_name)

    @property
    def model_version(self) -> str:
        return str(self.message.model_version)

    @property
    def id(self) -> str:
        return str(self.message.id)


def read_infer_request(data: bytes) -> Received:
    """``data``, a serialized ``ModelInferRequest``, as :class:`Received` (grpc's request
    deserializer). Raises protobuf's ``DecodeError`` for bytes that are not one."""
    if len(data) < WALK_BYTES:
        return Received(pb.ModelInferRequest.FromString(data), len(data))
    view = memoryview(data)
    try:
        kept, raw, typed = _walk_request(view)
    except _Irregular:
        return Received(pb.ModelInferRequest.FromString(data), len(data))
    if raw is None and not typed:
        return Received(pb.ModelInferRequest.FromString(data), len(data))
    return Received(pb.ModelInferRequest.FromString(b"".join(kept)), len(data), raw, typed)


def _walk_request(
    view: memoryview,
) -> tuple[list[bytes | memoryview], tuple[memoryview, ...] | None, dict[int, Any]]:
    # The message's fields but its raw entries and its inputs' packed floats, which are
    # returned as views.
    kept: list[bytes | memoryview] = []
    raw: list[memoryview] = []
    typed: dict[int, tuple[str, memoryview]] = {}
    inputs = 0
    for number, begin, start, end in _fields(view, 0, len(view)):
        if number == _RAW:
            raw.append(view[start:end])
        elif number == _INPUTS:
            kept.append(_walk_input(view, begin, start, end, inputs, typed))
            inputs += 1
        else:
            kept.append(view[begin:end])
    return kept, (tuple(raw) if raw else None), typed


def _walk_input(
    view: memoryview, begin: int, start: int, end: int, index: int, typed: dict[int, Any]
) -> bytes | memoryview:
    # One input, its contents left out when they are one packed float field, whose bytes
    # are recorded under the input's index.
    parts: list[bytes | memoryview] = []
    lifted = None
    for number, field_begin, field_start, field_end in _fields(view, start, end):
        if number == _CONTENTS:
            if lifted is not None:  # contents twice: protobuf merges them; let it
                raise _Irregular
            lifted = _packed_floats(view, field_start, field_end)
            if lifted is not None:
                continue
        parts.append(view[field_begin:field_end])
    if lifted is None:
        return view[begin:end]
    typed[index] = lifted
    body = b"".join(parts)
    return b"".join((_varint_bytes(_INPUTS << 3 | _LEN), _varint_bytes(len(body)), body))


def _packed_floats(view: memoryview, start: int, end: int) -> tuple[str, memoryview] | None:
    # Contents that are one packed FP32 or FP64 field and nothing else: (its name, bytes).
    # Only the first field is looked at: a million BYTES elements are a million fields.
    number, _, field_start, field_end = next(_fields(view, start, end), (0, 0, 0, 0))
    if number not in _PACKED or field_end != end:
        return None
    if (field_end - field_start) % (4 if number == 6 else 8):
        raise _Irregular  # not whole values: protobuf refuses it, with its own words
    return _PACKED[number], view[field_start:field_end]


def _fields(view: memoryview, start: int, end: int) -> Any:
    # (number, where its tag begins, where its value begins, where it ends) for each
    # length-delimited field in ``view[start:end]``; anything else is irregular (the
    # messages walked carry strings, messages and packed fields only where it matters,
    # and a varint field at the top is parsed whole: rare, and never bulk).
    at = start
    while at < end:
        begin = at
        tag, at = varint(view, at, end)
        if tag & 7 != _LEN:
            raise _Irregular
        length, at = varint(view, at, end)
        if at + length > end:
            raise _Irregular
        yield tag >> 3, begin, at, at + length
        at += length


def varint(view: memoryview | bytes, at: int, end: int) -> tuple[int, int]:
    """The protobuf varint at ``view[at:end]``: its value, and where what follows begins;
    ``ValueError`` when it does not end there."""
    value = shift = 0
    while at < end and shift < 64:
        byte = view[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if byte < 0x80:
            return value, at
        shift += 7
    raise _Irregular


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
