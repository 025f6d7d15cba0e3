"""Requests read from files: ``--input-data`` (JSON lines, one request or chat conversation
each) and ``--strings`` (one BYTES element per line), checked against the model's metadata or
OpenAI's message shape. Reads files; sends nothing."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from carpool.bench.targets.payload import Array, Request, RequestSpec, described_inputs
from carpool.server.tensors import (
    array_from_json,
    check_shape,
    deserialize_bf16_tensor,
    serialize_bf16_tensor,
)

__all__ = ["read_conversations", "read_requests", "read_strings"]


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
        else {name: (dt, dims) for name, dt, dims in described_inputs(spec_or_metadata)}
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


def read_conversations(path: str | Path) -> list[list[dict[str, Any]]]:
    """Chat conversations from a JSON-lines file, one per non-blank line: an object whose
    ``messages`` is a non-empty list of ``{"role", "content"}`` objects (OpenAI's). Raises
    ``ValueError`` naming the line; ``OSError`` when the file cannot be read."""
    conversations = []
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{str(path)!r}, line {number}: not JSON: {exc}") from None
            messages = doc.get("messages") if isinstance(doc, dict) else None
            if not (isinstance(messages, list) and messages) or not all(
                isinstance(m, dict) and {"role", "content"} <= m.keys() for m in messages
            ):
                raise ValueError(
                    f'{str(path)!r}, line {number}: expected {{"messages": [{{"role", '
                    f'"content"}}, ...]}}'
                )
            conversations.append(messages)
    if not conversations:
        raise ValueError(f"{str(path)!r} holds no conversations")
    return conversations


def read_strings(path: str | Path) -> list[str]:
    """One string per non-blank line (without its line break), for BYTES inputs.

    Raises ``ValueError`` for a file without any, ``OSError`` when it cannot be read.
    """
    with open(path, encoding="utf-8") as file:
        strings = [line.rstrip("\r\n") for line in file if line.strip()]
    if not strings:
        raise ValueError(f"{str(path)!r} holds no strings (one per line)")
    return strings


# ---------------------------------------------------------------------------- helpers


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
