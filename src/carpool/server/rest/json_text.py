"""REST's JSON text, in and out: what orjson reads and writes, and the stdlib where JSON
holds what orjson does not (Triton's bare ``NaN``, ``Infinity`` and ``-Infinity``).

Pure: bytes in, records out, and back; it must not import the app or anything that sends.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson

from carpool.server.messages import ProtocolError
from carpool.server.rest.json_arrays import Lifted, syntax_error
from carpool.server.statuses import Status

__all__ = ["check_id", "dump_answer", "read_object"]


def check_id(request_id: Any) -> None:
    """An ``id`` is echoed in the answer: a string, and one that can be written back (the
    stdlib's parser, which reads bodies with NaN, takes a lone surrogate orjson refuses)."""
    if type(request_id) is not str:
        raise ProtocolError("Unable to parse 'id': expected a string", field="id")
    if not request_id.isascii():
        try:
            request_id.encode()
        except UnicodeEncodeError:
            raise ProtocolError(
                "Unable to parse 'id': it holds a lone UTF-16 surrogate, which is not text; "
                "send the id as valid UTF-8",
                field="id",
            ) from None


def read_object(header: memoryview, lifted: Lifted | None = None) -> dict[str, Any]:
    """A request body's JSON object; a 400 naming the body when it is not one. ``lifted``:
    the body with its large arrays cut out, which is what is parsed."""
    text = header if lifted is None else memoryview(lifted.text)
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        doc = _json_with_non_finite(text, exc, lifted)
    if type(doc) is not dict:
        raise ProtocolError("the request body must be a JSON object", field="body")
    return doc


def _json_with_non_finite(
    header: memoryview, error: orjson.JSONDecodeError, lifted: Lifted | None
) -> Any:
    """A body orjson refused, read again by the stdlib if it holds ``NaN``, ``Infinity`` or
    ``-Infinity``: Triton's JSON accepts those bare tokens, and perf_analyzer sends random
    FP32 bit patterns as JSON numbers. Ordinary bodies never leave the fast parser."""
    raw = bytes(header)
    if b"NaN" in raw or b"Infinity" in raw:
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):  # a nesting bomb: the stdlib recurses
            pass
    if lifted is not None:  # say where the error is in the body the client sent
        raise syntax_error(lifted.source, lifted.position(error.pos), error.msg)
    raise ProtocolError(f"failed to parse the request JSON buffer: {error}", field="body")


def dump_answer(header: dict[str, Any], entries: list[dict[str, Any]]) -> bytes:
    """An answer's JSON text: orjson, unless a float output holds NaN or infinity, which
    only the stdlib writes (as Triton's bare tokens)."""
    try:
        if _finite(entries):
            return orjson.dumps(header, option=orjson.OPT_SERIALIZE_NUMPY)
        for entry in entries:
            if isinstance(entry.get("data"), np.ndarray):
                entry["data"] = entry["data"].tolist()
        return json.dumps(header, separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:  # orjson.JSONEncodeError is a TypeError
        raise ProtocolError(
            f"the response cannot be encoded as JSON: {exc}",
            field="body",
            status=Status.INTERNAL_ERROR,
        ) from None


def _finite(entries: list[dict[str, Any]]) -> bool:
    for entry in entries:
        data = entry.get("data")
        if isinstance(data, np.ndarray) and data.dtype.kind == "f" and not np.isfinite(data).all():
            return False
    return True
