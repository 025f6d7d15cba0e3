"""The v2 (KServe / Open Inference Protocol) inference wire format: bytes in, dataclasses out.

Pure and sans-I/O: no sockets, no event loop, no framework. The ASGI layer reads the body
and the ``Inference-Header-Content-Length`` header, calls :func:`parse_header_length`, then
:func:`parse_infer_request` (or :func:`parse_raw_request` when the length is 0), runs the
model, and sends what :func:`encode_infer_response` returns. Every refusal is a
:class:`ProtocolError` carrying the HTTP status and the field at fault; messages keep
Triton's wording where it has one, because clients and operators grep for it.

The tensor codecs live in :mod:`carpool.server.tensors`; the ones other modules need are
re-exported here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from carpool.errors import CarpoolError
from carpool.server.tensors import (
    DATATYPES,
    array_from_json,
    array_from_wire,
    array_to_json,
    array_to_wire,
    check_shape,
    datatype_of,
    deserialize_bf16_tensor,
    deserialize_bytes_tensor,
    element_size,
    raw_shape,
    serialize_bf16_tensor,
    serialize_bytes_tensor,
)

__all__ = [
    "HEADER_LENGTH",
    "ProtocolError",
    "InferInput",
    "RequestedOutput",
    "InferRequest",
    "OutputTensor",
    "parse_header_length",
    "parse_infer_request",
    "parse_raw_request",
    "wants_binary",
    "encode_infer_response",
    "encode_error",
    "DATATYPES",
    "datatype_of",
    "element_size",
    "serialize_bytes_tensor",
    "deserialize_bytes_tensor",
    "serialize_bf16_tensor",
    "deserialize_bf16_tensor",
]

#: The header that splits a body into its JSON part and the binary blobs after it.
HEADER_LENGTH = "Inference-Header-Content-Length"

Parameters = dict[str, str | int | float | bool]
Array = np.ndarray[Any, np.dtype[Any]]

_NO_SHM = "shared memory is not supported by this server ({} '{}'); send the data in the body"


class ProtocolError(CarpoolError, ValueError):
    """A request the protocol cannot accept, or a response it cannot carry.

    ``field`` names what is at fault: a JSON path (``"inputs[0].shape"``), a tensor name
    (``"INPUT0"``), ``"body"``, or a header name. ``status`` is the HTTP status to answer
    with: 400 for a malformed request, 413 for one over a size limit, 500 for a model
    output the protocol cannot express. The message is what the client should read.
    """

    def __init__(self, message: str, *, field: str, status: int = 400) -> None:
        self.detail = message
        self.field = field
        self.status = status
        super().__init__(message)

    def _fields(self) -> dict[str, Any]:
        return {"message": self.detail, "field": self.field, "status": self.status}


@dataclass(frozen=True, slots=True, eq=False)
class InferInput:
    """One input tensor; ``data`` is read-only and has ``shape`` (BF16 held as float32).

    ``parameters`` are the input's own, minus ``binary_data_size`` (consumed by framing).
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: Array
    parameters: Parameters


@dataclass(frozen=True, slots=True)
class RequestedOutput:
    """An output the client asked for; ``binary`` is ``None`` when it did not say how.

    ``parameters`` are the output's own, minus ``binary_data`` (lifted into ``binary``).
    """

    name: str
    binary: bool | None
    parameters: Parameters


@dataclass(frozen=True, slots=True, eq=False)
class InferRequest:
    """A parsed inference request; ``outputs`` is ``None`` when the client wants them all.

    ``parameters`` are the request's own (``priority``, ``timeout``, custom keys) minus
    ``binary_data_output``, which is lifted into its own field.
    """

    id: str | None
    parameters: Parameters
    inputs: tuple[InferInput, ...]
    outputs: tuple[RequestedOutput, ...] | None
    binary_data_output: bool


@dataclass(frozen=True, slots=True, eq=False)
class OutputTensor:
    """One output to send; ``data`` may be any dtype that casts same-kind to ``datatype``."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: Array


def parse_header_length(value: str | None, body_length: int) -> int | None:
    """The ``Inference-Header-Content-Length`` value, checked to lie in [0, body_length].

    ``None`` when the header is absent (the whole body is JSON); 0 means a raw binary
    request. Raises ``ProtocolError`` (400) for anything else, as Triton does.
    """
    if value is None:
        return None
    text = value.strip()
    digits = text[1:] if text[:1] in "+-" else text
    if not (digits.isascii() and digits.isdigit() and len(digits) <= 20):
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise ProtocolError(f"Unable to parse {HEADER_LENGTH}, got: {shown}", field=HEADER_LENGTH)
    length = int(text)
    _check_header_range(length, body_length, allow_zero=True)
    return length


def parse_infer_request(
    body: bytes | memoryview, header_length: int | None, *, max_elements: int
) -> InferRequest:
    """A JSON request, or a JSON header followed by the binary inputs in input order.

    ``header_length`` is :func:`parse_header_length`'s result (0 belongs to
    :func:`parse_raw_request`). ``max_elements`` bounds the element count summed over the
    inputs; shapes are checked with Python ints before anything is allocated, so
    ``[2**40, 2**40]`` costs nothing. Binary inputs are zero-copy views of ``body``.
    Raises ``ProtocolError``: 400, or 413 over ``max_elements``.
    """
    if max_elements < 1:
        raise ValueError(f"max_elements must be >= 1, got {max_elements}")
    view = memoryview(body)
    if header_length is not None:
        _check_header_range(header_length, len(view), allow_zero=False)
    split = len(view) if header_length is None else header_length
    header, blobs = view[:split], view[split:]
    try:
        doc = orjson.loads(header)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(
            f"failed to parse the request JSON buffer: {exc}", field="body"
        ) from None
    if type(doc) is not dict:
        raise ProtocolError("the request body must be a JSON object", field="body")
    request_id = doc.get("id")
    if request_id is not None and type(request_id) is not str:
        raise ProtocolError("Unable to parse 'id': expected a string", field="id")
    parameters = _parameters(doc.get("parameters"), "parameters")
    binary_output = _expect_bool(
        parameters.pop("binary_data_output", False), "parameters.binary_data_output"
    )
    raw_inputs = doc.get("inputs")
    if type(raw_inputs) is not list:
        raise ProtocolError("Unable to parse 'inputs': expected an array", field="inputs")

    inputs: list[InferInput] = []
    names: set[str] = set()
    total = offset = 0
    for index, item in enumerate(raw_inputs):
        where = f"inputs[{index}]"
        name, datatype, shape, params = _describe_input(item, where, names)
        count = math.prod(shape)
        total += count
        if total > max_elements:
            raise ProtocolError(
                f"input '{name}' with shape {list(shape)} brings the request to {total} "
                f"elements, over this server's limit of {max_elements}",
                field=f"{where}.shape",
                status=413,
            )
        if "data" in item:
            with _blame(name):
                data = array_from_json(item["data"], datatype=datatype, count=count, name=name)
        else:
            size = _binary_size(params.pop("binary_data_size"), where, name)
            if size and header_length is None:
                raise ProtocolError(
                    f"must specify valid '{HEADER_LENGTH}' in request header and "
                    "'binary_data_size' when passing inputs in binary data format",
                    field=HEADER_LENGTH,
                )
            if size > len(blobs) - offset:
                raise ProtocolError(
                    f"unexpected size for input '{name}', expecting "
                    f"{size - (len(blobs) - offset)} additional bytes",
                    field=name,
                )
            with _blame(name):
                chunk = blobs[offset : offset + size]
                data = array_from_wire(chunk, datatype=datatype, count=count, name=name)
            offset += size
        inputs.append(_input(name, datatype, shape, data, params))
    if offset != len(blobs):
        raise ProtocolError(
            f"unexpected additional input data: {len(blobs) - offset} bytes follow the last "
            "binary input",
            field="body",
        )
    return InferRequest(
        id=request_id,
        parameters=parameters,
        inputs=tuple(inputs),
        outputs=_outputs(doc.get("outputs")),
        binary_data_output=binary_output,
    )


def parse_raw_request(
    body: bytes | memoryview,
    *,
    name: str,
    datatype: str,
    shape_without_batch: Sequence[int],
    batched: bool = True,
) -> InferRequest:
    """A raw binary request (header length 0): the whole body is the one input's data.

    The model's only input supplies name, datatype and shape; one ``-1`` dimension is
    deduced from the body size. With ``batched`` (a model with a batch dimension) the
    request is batch-1: a leading 1 is added. A BYTES input must have shape [1], and the
    body is that element's content without a length prefix. Every output is returned
    binary, as Triton does. Raises ``ProtocolError`` (400) when the body does not fit.
    """
    with _blame(name):
        dims = raw_shape(shape_without_batch, datatype=datatype, nbytes=len(body), name=name)
        if datatype == "BYTES":
            data = np.empty(1, dtype=object)
            data[0] = bytes(body)
        else:
            count = math.prod(dims)
            data = array_from_wire(body, datatype=datatype, count=count, name=name)
    shape = (1, *dims) if batched else tuple(dims)
    return InferRequest(
        id=None,
        parameters={},
        inputs=(_input(name, datatype, shape, data, {}),),
        outputs=None,
        binary_data_output=True,
    )


def wants_binary(request: InferRequest, output: RequestedOutput | None) -> bool:
    """Whether to send an output binary: its own ``binary_data`` wins over the request's."""
    if output is not None and output.binary is not None:
        return output.binary
    return request.binary_data_output


def encode_infer_response(
    *,
    model_name: str,
    model_version: str | None,
    request_id: str | None,
    outputs: Sequence[tuple[OutputTensor, bool]],
    parameters: Parameters | None = None,
) -> tuple[bytes, int | None]:
    """The response body, and the JSON header's length when any output is binary.

    ``outputs`` pairs each tensor with whether to send it binary (see :func:`wants_binary`);
    binary blobs follow the JSON in output order, each announced by ``binary_data_size``.
    A NaN or infinity in a JSON output switches to the stdlib encoder, which writes
    ``NaN``/``Infinity`` as Python's ``json`` reads them (orjson would write ``null``).
    Raises ``ProtocolError``: 400 for an output JSON cannot carry (BF16, non-UTF-8 BYTES),
    so the client should ask for it binary; 500 for an array that does not fit its
    datatype or shape.
    """
    header: dict[str, Any] = {"model_name": model_name}
    if model_version is not None:
        header["model_version"] = model_version
    if request_id is not None:
        header["id"] = request_id
    if parameters is not None:
        header["parameters"] = parameters
    entries: list[dict[str, Any]] = []
    blobs: list[bytes | memoryview] = []
    finite = True
    for tensor, binary in outputs:
        name, datatype = tensor.name, tensor.datatype
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(tensor.shape)}
        if datatype not in DATATYPES or math.prod(tensor.shape) != tensor.data.size:
            raise ProtocolError(
                f"output '{name}' ({tensor.data.size} elements) does not fit datatype "
                f"{datatype!r} and shape {list(tensor.shape)}",
                field=name,
                status=500,
            )
        with _blame(name):
            if binary:
                blobs.append(array_to_wire(tensor.data, datatype=datatype, name=name))
                entry["parameters"] = {"binary_data_size": len(blobs[-1])}
            else:
                entry["data"] = data = array_to_json(tensor.data, datatype=datatype, name=name)
                if finite and isinstance(data, np.ndarray) and data.dtype.kind == "f":
                    finite = bool(np.isfinite(data).all())
        entries.append(entry)
    header["outputs"] = entries
    try:
        if finite:
            text = orjson.dumps(header, option=orjson.OPT_SERIALIZE_NUMPY)
        else:
            for entry in entries:
                if isinstance(entry.get("data"), np.ndarray):
                    entry["data"] = entry["data"].tolist()
            text = json.dumps(header, separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:  # orjson.JSONEncodeError is a TypeError
        raise ProtocolError(
            f"the response cannot be encoded as JSON: {exc}", field="body", status=500
        ) from None
    if not any(binary for _, binary in outputs):
        return text, None
    return b"".join([text, *blobs]), len(text)


def encode_error(message: str) -> bytes:
    """The body of every error response, ``{"error": message}``, as tritonclient reads it."""
    return json.dumps({"error": message}).encode()  # ASCII-escaped: any str encodes


@contextmanager
def _blame(field: str) -> Iterator[None]:
    # The codecs raise builtins with client-ready messages; attach the field and status
    # here: ValueError is the client's to fix (400), TypeError the server's (500).
    try:
        yield
    except ProtocolError:
        raise
    except ValueError as exc:
        raise ProtocolError(str(exc), field=field) from None
    except TypeError as exc:
        raise ProtocolError(str(exc), field=field, status=500) from None


def _check_header_range(length: int, body_length: int, *, allow_zero: bool) -> None:
    if not (0 if allow_zero else 1) <= length <= body_length:
        raise ProtocolError(
            f"inference header size should be in range [{0 if allow_zero else 1}, "
            f"{body_length}], got {length}",
            field=HEADER_LENGTH,
        )


def _name(item: Any, where: str, taken: set[str], kind: str) -> str:
    # The item's name, checked to be a string not used by an earlier tensor of its kind.
    if type(item) is not dict:
        raise ProtocolError(f"Unable to parse '{where}': expected an object", field=where)
    name = item.get("name")
    if type(name) is not str:
        field = f"{where}.name"
        raise ProtocolError(f"Unable to parse '{field}': expected a string", field=field)
    if name in taken:
        raise ProtocolError(f"{kind} '{name}' already exists in request", field=f"{where}.name")
    taken.add(name)
    return name


def _describe_input(
    item: Any, where: str, names: set[str]
) -> tuple[str, str, tuple[int, ...], Parameters]:
    # Everything about one input but its data: name, datatype, shape, parameters.
    name = _name(item, where, names, "input")
    datatype = item.get("datatype")
    if type(datatype) is not str or datatype not in DATATYPES:
        raise ProtocolError(
            f"invalid datatype {datatype!r} for input '{name}', expected one of "
            + ", ".join(DATATYPES),
            field=f"{where}.datatype",
        )
    with _blame(f"{where}.shape"):
        shape = check_shape(item.get("shape"), name=name)
    params = _parameters(item.get("parameters"), f"{where}.parameters")
    _check_content_fields("data" in item, params, name, where)
    return name, datatype, shape, params


def _binary_size(value: Any, where: str, name: str) -> int:
    if type(value) is not int or value < 0:
        raise ProtocolError(
            f"Unable to parse 'binary_data_size' of input '{name}': expected a non-negative "
            "integer",
            field=f"{where}.parameters.binary_data_size",
        )
    return value


def _parameters(value: Any, field: str) -> Parameters:
    # A fresh dict every time: callers pop the keys they lift into fields.
    if value is None:
        return {}
    if type(value) is not dict:
        raise ProtocolError(f"Unable to parse '{field}': expected an object", field=field)
    for key, item in value.items():
        if type(item) not in (str, int, float, bool):
            raise ProtocolError(
                f"Unable to parse '{field}': '{key}' must be a string, number or boolean",
                field=f"{field}.{key}",
            )
    return dict(value)


def _expect_bool(value: Any, field: str) -> bool:
    if type(value) is not bool:
        key = field.rpartition(".")[2]
        raise ProtocolError(f"Unable to parse '{key}': expected true or false", field=field)
    return value


def _check_content_fields(has_data: bool, params: Parameters, name: str, where: str) -> None:
    keys = ("data", "binary_data_size", "shared_memory_region")
    given = [key for key in keys if (has_data if key == "data" else key in params)]
    if len(given) != 1:
        found = " set " + " ".join(f"'{key}'" for key in given) if given else " no field is set"
        raise ProtocolError(
            "Input must set only one of the following fields: 'data', 'binary_data_size' in "
            f"'parameters', 'shared_memory_region' in 'parameters'. But{found} (input "
            f"'{name}')",
            field=where,
        )
    if given == ["shared_memory_region"]:
        raise ProtocolError(_NO_SHM.format("input", name), field=f"{where}.parameters")


def _input(
    name: str, datatype: str, shape: tuple[int, ...], data: Array, params: Parameters
) -> InferInput:
    data = data.reshape(shape)
    data.flags.writeable = False  # mostly views of the request body; copies follow suit
    return InferInput(name=name, datatype=datatype, shape=shape, data=data, parameters=params)


def _outputs(value: Any) -> tuple[RequestedOutput, ...] | None:
    if value is None:
        return None
    if type(value) is not list:
        raise ProtocolError("Unable to parse 'outputs': expected an array", field="outputs")
    outputs: list[RequestedOutput] = []
    names: set[str] = set()
    for index, item in enumerate(value):
        where = f"outputs[{index}]"
        name = _name(item, where, names, "output")
        params = _parameters(item.get("parameters"), f"{where}.parameters")
        if "shared_memory_region" in params:
            raise ProtocolError(_NO_SHM.format("output", name), field=f"{where}.parameters")
        if "classification" in params:
            raise ProtocolError(
                f"the classification extension is not supported (output '{name}')",
                field=f"{where}.parameters.classification",
            )
        binary = params.pop("binary_data", None)
        if binary is not None:
            binary = _expect_bool(binary, f"{where}.parameters.binary_data")
        outputs.append(RequestedOutput(name=name, binary=binary, parameters=params))
    return tuple(outputs) or None  # Triton answers an empty list with every output
