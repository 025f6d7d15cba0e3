"""Response bodies of the v2 protocol: inference results and error bodies, as bytes.

After the model runs, the ASGI layer sends what :func:`encode_infer_response` returns; every
error response's body is :func:`encode_error`'s. An output the protocol cannot carry is a
:class:`ProtocolError` carrying the HTTP status and the output's name. Pure and sans-I/O: it
must not import the ASGI app, the batcher or anything that touches a socket.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from carpool.server.messages import (
    OutputTensor,
    Parameters,
    ProtocolError,
    blame,
    check_output_fits,
)
from carpool.server.tensors import array_to_json, array_to_wire

__all__ = ["encode_infer_response", "encode_error"]


def encode_infer_response(
    *,
    model_name: str,
    model_version: str | None,
    request_id: str | None,
    outputs: Sequence[tuple[OutputTensor, bool]],
    parameters: Parameters | None = None,
) -> tuple[bytes, int | None]:
    """The response body, and the JSON header's length when any output is binary.

    ``outputs`` pairs each tensor with whether to send it binary (see
    :func:`~carpool.server.messages.wants_binary`); binary blobs follow the JSON in output
    order, each announced by ``binary_data_size``. A NaN or infinity in a JSON output
    switches to the stdlib encoder, which writes ``NaN``/``Infinity`` as Python's ``json``
    reads them (orjson would write ``null``). Raises ``ProtocolError``: 400 for an output
    JSON cannot carry (BF16, non-UTF-8 BYTES), so the client should ask for it binary; 500
    for an array that does not fit its datatype or shape.
    """
    header: dict[str, Any] = {"model_name": model_name}
    if model_version is not None:
        header["model_version"] = model_version
    if request_id is not None:
        header["id"] = request_id
    if parameters is not None:
        header["parameters"] = parameters
    blobs: list[bytes | memoryview] = []
    entries = [_output_entry(tensor, binary, blobs) for tensor, binary in outputs]
    header["outputs"] = entries
    text = _dump_json(header, entries)
    if not blobs:  # no output is binary
        return text, None
    return b"".join([text, *blobs]), len(text)


def encode_error(message: str) -> bytes:
    """The body of every error response, ``{"error": message}``, as tritonclient reads it."""
    return json.dumps({"error": message}).encode()  # ASCII-escaped: any str encodes


def _output_entry(
    tensor: OutputTensor, binary: bool, blobs: list[bytes | memoryview]
) -> dict[str, Any]:
    # The output's JSON entry; its data either inline or appended to ``blobs``.
    name, datatype = tensor.name, tensor.datatype
    entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(tensor.shape)}
    check_output_fits(tensor)
    with blame(name):
        if binary:
            blob = array_to_wire(tensor.data, datatype=datatype, name=name)
            blobs.append(blob)
            entry["parameters"] = {"binary_data_size": len(blob)}
        else:
            entry["data"] = array_to_json(tensor.data, datatype=datatype, name=name)
    return entry


def _dump_json(header: dict[str, Any], entries: list[dict[str, Any]]) -> bytes:
    # orjson, unless a float output holds NaN or infinity, which only the stdlib writes.
    try:
        if _finite(entries):
            return orjson.dumps(header, option=orjson.OPT_SERIALIZE_NUMPY)
        for entry in entries:
            if isinstance(entry.get("data"), np.ndarray):
                entry["data"] = entry["data"].tolist()
        return json.dumps(header, separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:  # orjson.JSONEncodeError is a TypeError
        raise ProtocolError(
            f"the response cannot be encoded as JSON: {exc}", field="body", status=500
        ) from None


def _finite(entries: list[dict[str, Any]]) -> bool:
    for entry in entries:
        data = entry.get("data")
        if isinstance(data, np.ndarray) and data.dtype.kind == "f" and not np.isfinite(data).all():
            return False
    return True
