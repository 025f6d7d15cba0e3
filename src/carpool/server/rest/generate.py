"""Triton's generate extension: a flat JSON object in (each field named as an input is that
input, the rest and ``parameters`` are request parameters), one JSON object out per answer,
or per step as server-sent events. Pure: the app reads the body and sends what this makes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import orjson

from carpool.model import Model
from carpool.server.inference.call import Answer, Call, Withdrawal
from carpool.server.messages import MAX_ELEMENTS, InferRequest, ProtocolError
from carpool.server.rest.codec import parse_infer_request
from carpool.server.tensors import array_to_json

__all__ = ["GENERATE", "EVENT_STREAM", "error_event", "event", "generate_call"]

GENERATE = "generate"  # the protocol label of generate requests in /metrics
EVENT_STREAM = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]
_RESERVED = ("id", "parameters")


def generate_call(
    name: str,
    version: str | None,
    read: Callable[[], Awaitable[bytes]],
    withdrawn: Withdrawal,
) -> Call[bytes, bytes]:
    """A generate (or generate_stream) request for model ``name``: each answer (or step)
    encoded as one JSON object."""
    return Call(
        protocol=GENERATE, model=name, version=version, read=read, size=len,
        decode=decode, encode=encode, withdrawal=withdrawn,
    )  # fmt: skip


def decode(model: Model, body: bytes) -> InferRequest:
    """The v2 request a generate body stands for: a row of each input it names."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"the body is not JSON: {exc}", field="body") from None
    if not isinstance(doc, dict):
        raise ProtocolError("the body must be a JSON object", field="body")
    parameters = doc.get("parameters", {})
    if not isinstance(parameters, dict):
        raise ProtocolError("parameters must be a JSON object", field="parameters")
    specs = {t.name: t for t in model.input_specs}
    inputs = []
    for key, value in doc.items():
        if key in specs:
            spec = specs[key]
            data = value if isinstance(value, list) else [value]
            shape = [1, len(data)] if model.batching.batched else [len(data)]
            inputs.append({"name": key, "datatype": spec.datatype, "shape": shape, "data": data})
        elif key not in _RESERVED:
            parameters = {**parameters, key: value}  # Triton's rule: a field, not an input
    v2: dict[str, Any] = {"inputs": inputs, "parameters": parameters}
    if "id" in doc:
        v2["id"] = doc["id"]
    return parse_infer_request(orjson.dumps(v2), None, max_elements=MAX_ELEMENTS)


def encode(answer: Answer, body: bytes) -> bytes:
    """One answer (or one step) as Triton's generate extension writes it: the model's name
    and version and a field per output, a lone element as itself."""
    doc: dict[str, Any] = {
        "model_name": answer.served.name,
        "model_version": answer.served.version,
    }
    if answer.request.id is not None:
        doc["id"] = answer.request.id
    for tensor, _ in answer.outputs:
        data = array_to_json(tensor.data, datatype=tensor.datatype, name=tensor.name)
        doc[tensor.name] = data[0] if np.prod(tensor.shape) == 1 else data
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)  # numbers come as numpy


def event(data: bytes) -> bytes:
    """One server-sent event carrying ``data`` (JSON: one line, no newline to escape)."""
    return b"data: " + data + b"\n\n"


def error_event(message: str) -> bytes:
    """The event an error after the first step arrives as."""
    return event(orjson.dumps({"error": message}))
