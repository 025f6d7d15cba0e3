"""REST's v2 bodies to :class:`~carpool.server.messages.InferRequest` records, and response
tensors back to bodies: the REST twin of :mod:`carpool.server.grpc.codec`. Refusals are
:class:`ProtocolError`, in Triton's wording where it has one, since clients and operators grep
for it. Pure and sans-I/O."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from carpool.datatypes import DATATYPES
from carpool.server.messages import (
    HEADER_LENGTH,
    Array,
    InferRequest,
    OutputTensor,
    Parameters,
    ProtocolError,
    RequestedOutput,
    blame,
    check_element_total,
    check_output_fits,
    check_requested_output,
    claim_name,
    input_tensor,
    refuse_shared_memory,
)
from carpool.server.rest.json_arrays import Lifted, lift, read_lifted
from carpool.server.rest.json_text import check_id, dump_answer, read_object
from carpool.server.tensors import (
    array_from_json,
    array_from_wire,
    array_to_json,
    array_to_wire,
    check_shape,
    json_may_hold_booleans,
    raw_shape,
)

__all__ = [
    "parse_header_length",
    "parse_infer_request",
    "parse_raw_request",
    "parse_index_request",
    "check_raw_content_type",
    "encode_infer_response",
    "encode_error",
]


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


def check_raw_content_type(value: str | None) -> None:
    """A raw binary request (header length 0) must not say its body is JSON: a client that
    sends JSON with that header made a mistake, and its JSON text would be read as tensor
    data. Raises ``ProtocolError`` (400)."""
    if value is not None and value.partition(";")[0].strip().lower() == "application/json":
        raise ProtocolError(
            f"{HEADER_LENGTH} 0 makes the whole body raw binary tensor data, but Content-Type "
            "says application/json; send the JSON without that header, or the raw data as "
            "application/octet-stream",
            field=HEADER_LENGTH,
        )


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
    if header_length is None:  # all JSON (read from bytes: the boolean search copies nothing)
        text = body if isinstance(body, bytes) else bytes(view)
        return _read_header(text, max_elements).request(view[len(view) :], framed=False)
    _check_header_range(header_length, len(view), allow_zero=False)
    if header_length <= _REMEMBERED_HEADER_BYTES:
        header = _remembered_header(bytes(view[:header_length]), max_elements)
    else:
        header = _read_header(view[:header_length], max_elements)
    return header.request(view[header_length:], framed=True)


@dataclass(frozen=True, slots=True)
class _Input:
    """One input as the JSON says it: its JSON ``data`` read, or the size of its binary."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    count: int
    parameters: Parameters
    data: Array | None  # None: binary, ``size`` bytes of the body after the JSON
    size: int
    lifted: bool = False  # its data was cut out of the text and read piece by piece


@dataclass(frozen=True, slots=True)
class _Header:
    """A request's JSON, checked: everything but the binary inputs' bytes."""

    id: str | None
    parameters: Parameters
    inputs: tuple[_Input, ...]
    outputs: tuple[RequestedOutput, ...] | None
    binary_data_output: bool

    def request(self, blobs: memoryview, *, framed: bool) -> InferRequest:
        """The request, binary inputs read from ``blobs`` in input order; ``framed``: the
        request has the header that says where its JSON ends. Each request gets its own
        parameter dicts (arrays are read-only, so a remembered header's may be shared)."""
        inputs = []
        offset = 0
        for item in self.inputs:
            data = item.data
            if data is None:
                data = _blob(blobs, offset, item.size, framed, item.datatype, item.count, item.name)
                offset += item.size
            parameters = dict(item.parameters)
            inputs.append(input_tensor(item.name, item.datatype, item.shape, data, parameters))
        if offset != len(blobs):
            raise ProtocolError(
                f"unexpected additional input data: {len(blobs) - offset} bytes follow the "
                "last binary input",
                field="body",
            )
        parameters = dict(self.parameters)
        return InferRequest(
            self.id, parameters, tuple(inputs), self.outputs, self.binary_data_output
        )


def _read_header(text: bytes | memoryview, max_elements: int, *, cut: bool = True) -> _Header:
    # ``cut``: large number arrays are read piece by piece (:mod:`.json_arrays`); a body
    # whose cut-out arrays are not all inputs' data is read again whole.
    lifted = lift(text) if cut else None
    doc = read_object(memoryview(text), lifted)
    request_id = doc.get("id")
    if request_id is not None:
        check_id(request_id)
    parameters = _parameters(doc.get("parameters"), "parameters")
    binary_output = _expect_bool(
        parameters.pop("binary_data_output", False), "parameters.binary_data_output"
    )
    inputs = _inputs(doc.get("inputs"), max_elements, json_may_hold_booleans(text), lifted)
    if lifted is not None and sum(i.lifted for i in inputs) != len(lifted.spans):
        return _read_header(text, max_elements, cut=False)
    return _Header(request_id, parameters, inputs, _outputs(doc.get("outputs")), binary_output)


# A binary request's JSON header is the same for every request of one shape (tritonclient
# and perf_analyzer send it so), so it is read and checked once and remembered: a header of
# at most this many bytes, the last this many headers (1 MiB at most). A header that fails
# its checks is not remembered, and raises again as any other would.
_REMEMBERED_HEADER_BYTES = 4096
_REMEMBERED_HEADERS = 256
_remembered_header = functools.lru_cache(maxsize=_REMEMBERED_HEADERS)(_read_header)


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
    with blame(name):
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
        inputs=(input_tensor(name, datatype, shape, data, {}),),
        outputs=None,
        binary_data_output=True,
    )


def parse_index_request(body: bytes) -> bool:
    """A repository index request's ``ready`` flag: true asks for the ready models only.

    The body is empty or ``{"ready": bool}`` (Triton's model repository extension); raises
    ``ProtocolError`` (400) for anything else.
    """
    if not body.strip():
        return False
    doc = read_object(memoryview(body))
    ready = doc.get("ready", False)
    return _expect_bool(ready, "ready")


def _inputs(
    value: Any, max_elements: int, booleans: bool, lifted: Lifted | None
) -> tuple[_Input, ...]:
    # Every input as the JSON says it, JSON data read; binary inputs' sizes, not yet read.
    if type(value) is not list:
        raise ProtocolError("Unable to parse 'inputs': expected an array", field="inputs")
    inputs: list[_Input] = []
    names: set[str] = set()
    total = 0
    for index, item in enumerate(value):
        where = f"inputs[{index}]"
        name, datatype, shape, params = _describe_input(item, where, names)
        count = math.prod(shape)
        total += count
        check_element_total(total, name, shape, where, max_elements)
        if "data" in item:
            value = item["data"]
            cut = lifted is not None and type(value) is str and value in lifted.spans
            with blame(name):
                if lifted is not None and cut:
                    data = _read_cut(lifted, value, datatype, count, name)
                else:
                    data = array_from_json(
                        value, datatype=datatype, count=count, name=name, booleans=booleans
                    )
            inputs.append(_Input(name, datatype, shape, count, params, data, 0, cut))
        else:
            size = _binary_size(params.pop("binary_data_size"), where, name)
            inputs.append(_Input(name, datatype, shape, count, params, None, size))
    return tuple(inputs)


def _read_cut(lifted: Lifted, marker: str, datatype: str, count: int, name: str) -> Array:
    # A cut-out array of numbers: it holds no booleans.
    def read(values: list[Any], first: int) -> Array:
        return array_from_json(
            values, datatype=datatype, count=None, name=name, booleans=False, first=first
        )

    return read_lifted(lifted, marker, count=count, name=name, read=read)


def _blob(
    blobs: memoryview, offset: int, size: int, framed: bool, datatype: str, count: int, name: str
) -> Array:
    # Input ``name``'s ``size`` bytes from ``offset`` of the blobs, decoded; ``framed``: the
    # request has the header that says where its JSON ends.
    if size and not framed:
        raise ProtocolError(
            f"must specify valid '{HEADER_LENGTH}' in request header and "
            "'binary_data_size' when passing inputs in binary data format",
            field=HEADER_LENGTH,
        )
    left = len(blobs) - offset
    if size > left:
        raise ProtocolError(
            f"unexpected size for input '{name}', expecting {size - left} additional bytes",
            field=name,
        )
    with blame(name):
        return array_from_wire(
            blobs[offset : offset + size], datatype=datatype, count=count, name=name
        )


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
    claim_name(name, taken, kind, where)
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
    with blame(f"{where}.shape"):
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
    refuse_shared_memory("input", name, where, params)


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
        check_requested_output(name, params, where)
        binary = params.pop("binary_data", None)
        if binary is not None:
            binary = _expect_bool(binary, f"{where}.parameters.binary_data")
        outputs.append(RequestedOutput(name=name, binary=binary, parameters=params))
    return tuple(outputs) or None  # Triton answers an empty list with every output


# ------------------------------------------------------------------ responses


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
    reads them (orjson would write ``null``). Raises ``ProtocolError``: a bad request for an
    output JSON cannot carry (BF16, non-UTF-8 BYTES), so the client should ask for it
    binary; an internal error for an array that does not fit its datatype or shape.
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
    text = dump_answer(header, entries)
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
