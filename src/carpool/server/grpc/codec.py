"""The v2 gRPC messages (Triton's own, tritonclient's generated classes) to carpool's records and
back. Responses always use ``raw_output_contents``, the only place tritonclient reads outputs
from; refusals are :class:`ProtocolError`, as for REST. Pure; imported only when the gRPC port
is on."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb

from carpool.datatypes import DATATYPES, FIXED_DTYPES
from carpool.server.grpc.wire import Received, varint
from carpool.server.messages import (
    Array,
    InferInput,
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
from carpool.server.tensors import array_from_wire, array_to_wire, check_shape

__all__ = [
    "EMPTY_FINAL",
    "FINAL",
    "decode_infer_request",
    "empty_final_response",
    "encode_infer_response",
    "model_config",
    "model_metadata",
    "model_statistics",
    "repository_index",
    "server_metadata",
]

# The typed field of InferTensorContents that carries each datatype; FP16 and BF16 have
# none (raw_input_contents only), as in Triton.
CONTENTS = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


# A streamed request's parameter asking for an empty last response (Triton's decoupled
# models), and every streamed response's, true on the last of its request's.
EMPTY_FINAL = "triton_enable_empty_final_response"
FINAL = "triton_final_response"


def decode_infer_request(message: Any, *, max_elements: int) -> InferRequest:
    """A ``ModelInferRequest`` as the record REST's parser makes.

    Raw contents, if any, hold one entry per input in order, and then no input has typed
    contents (Triton's rule). ``max_elements`` bounds the element count summed over the
    inputs, checked before anything is allocated. Raises ``ProtocolError``: a bad request,
    or content too large over ``max_elements``.
    """
    typed: Mapping[int, tuple[str, memoryview]] | None = None
    raw_entries: tuple[memoryview, ...] | None = None
    if isinstance(message, Received):  # tensor bytes lifted out of the message as received
        raw_entries, typed, message = message.raw, message.typed, message.message
    raw = list(message.raw_input_contents) if raw_entries is None else list(raw_entries)
    if raw and len(raw) != len(message.inputs):
        raise ProtocolError(
            f"raw_input_contents holds {len(raw)} entries for {len(message.inputs)} inputs; "
            "it must hold one per input, in order",
            field="raw_input_contents",
        )
    names: set[str] = set()
    inputs: list[InferInput] = []
    total = 0
    for index, tensor in enumerate(message.inputs):
        where = f"inputs[{index}]"
        name, shape = _describe_input(tensor, where, names)
        count = math.prod(shape)
        total += count
        check_element_total(total, name, shape, where, max_elements)
        data = _input_data(
            tensor, raw[index] if raw else None, count, typed.get(index) if typed else None
        )
        params = parameters(tensor.parameters, f"{where}.parameters")
        inputs.append(input_tensor(name, tensor.datatype, shape, data, params))
    params = parameters(message.parameters, "parameters")
    if not isinstance(params.pop(EMPTY_FINAL, False), bool):  # the stream's, not the model's
        raise ProtocolError(
            f"parameter '{EMPTY_FINAL}' must be a bool_param", field=f"parameters.{EMPTY_FINAL}"
        )
    return InferRequest(
        id=message.id or None,
        parameters=params,
        inputs=tuple(inputs),
        outputs=_outputs(message.outputs),
        binary_data_output=True,  # no meaning over gRPC: outputs are always raw
    )


def empty_final_response(message: Any) -> bool:
    """Whether a ``ModelInferRequest`` asks for an empty last response on its stream."""
    if EMPTY_FINAL not in message.parameters:
        return False
    return message.parameters[EMPTY_FINAL].bool_param is True


def parameters(values: Mapping[str, Any], field: str) -> Parameters:
    """A ``map<string, InferParameter>`` as plain values (uint64 and int64 both int)."""
    out: Parameters = {}
    for key, parameter in values.items():
        kind = parameter.WhichOneof("parameter_choice")
        if kind is None:
            raise ProtocolError(f"parameter '{key}' has no value", field=f"{field}.{key}")
        out[key] = getattr(parameter, kind)
    return out


def _describe_input(tensor: Any, where: str, names: set[str]) -> tuple[str, tuple[int, ...]]:
    name = tensor.name
    claim_name(name, names, "input", where)
    if tensor.datatype not in DATATYPES:
        raise ProtocolError(
            f"invalid datatype {tensor.datatype!r} for input '{name}', expected one of "
            + ", ".join(DATATYPES),
            field=f"{where}.datatype",
        )
    refuse_shared_memory("input", name, where, tensor.parameters)
    with blame(f"{where}.shape"):
        shape = check_shape(list(tensor.shape), name=name)
    return name, shape


def _input_data(
    tensor: Any, raw: bytes | memoryview | None, count: int, lifted: tuple[str, memoryview] | None
) -> Array:
    name, datatype = tensor.name, tensor.datatype
    if raw is not None:
        if tensor.HasField("contents") or lifted is not None:
            raise ProtocolError(
                f"input '{name}' sets 'contents' while raw_input_contents is used; send "
                "every input one way",
                field=name,
            )
        with blame(name):
            return array_from_wire(raw, datatype=datatype, count=count, name=name)
    with blame(name):
        if lifted is not None:
            return _lifted_contents(*lifted, datatype=datatype, count=count, name=name)
        return typed_contents(tensor.contents, datatype=datatype, count=count, name=name)


def typed_contents(contents: Any, *, datatype: str, count: int, name: str) -> Array:
    """A flat array of ``count`` elements from the typed field ``datatype`` travels in.

    Integers must lie in the datatype's range (nothing wraps). Raises ``ValueError`` (a
    400 once blamed): FP16 and BF16 have no typed field, another field than the
    datatype's is set, or the element count does not fit the shape.
    """
    given = [f for f in set(CONTENTS.values()) if len(getattr(contents, f))]
    field = _contents_field(datatype, name, given)
    values = getattr(contents, field)
    _check_contents_count(field, len(values), count, name)
    if datatype == "BYTES":  # no list of them first: each element is all it costs
        return np.fromiter(values, dtype=object, count=count)
    dtype = FIXED_DTYPES[datatype]
    if datatype in ("FP32", "FP64"):
        return _fixed_width(contents, field, dtype, count)
    if dtype.kind in "iu" and count:  # varints: read one by one, never as a list
        wide_type = np.uint64 if datatype == "UINT64" else np.int64
        wide = np.fromiter(values, dtype=wide_type, count=count)
        info = np.iinfo(dtype)
        low, high = int(wide.min()), int(wide.max())
        if low < info.min or high > info.max:
            raise ValueError(
                f"Unable to parse 'contents' of input '{name}': {datatype} needs integers in "
                f"[{info.min}, {info.max}]; got {low if low < info.min else high}"
            )
        return wide.astype(dtype)
    return np.fromiter(values, dtype=dtype, count=count)


def _lifted_contents(
    field: str, data: memoryview, *, datatype: str, count: int, name: str
) -> Array:
    """Packed FP32 or FP64 contents lifted out of the message as received
    (:mod:`.grpc_wire`): a view of the bytes grpc received (as REST's binary tensors),
    checked as :func:`typed_contents` checks them."""
    expected = _contents_field(datatype, name, [field])
    dtype = FIXED_DTYPES[datatype]
    wire = dtype.newbyteorder("<")
    _check_contents_count(expected, len(data) // wire.itemsize, count, name)
    return np.frombuffer(data, dtype=wire).astype(dtype, copy=False)


def _contents_field(datatype: str, name: str, given: list[str]) -> str:
    # The typed field ``datatype`` travels in, refusing any other among the ``given``.
    field = CONTENTS.get(datatype)
    if field is None:
        raise ValueError(
            f"input '{name}': {datatype} has no typed contents field; send it in raw_input_contents"
        )
    others = [f for f in given if f != field]
    if others:
        raise ValueError(
            f"input '{name}' is {datatype}, which travels in '{field}', but sets {sorted(others)}"
        )
    return field


def _check_contents_count(field: str, held: int, count: int, name: str) -> None:
    if held != count:
        raise ValueError(
            f"Unable to parse 'contents' of input '{name}': '{field}' holds {held} "
            f"elements but the shape needs {count}"
        )


def _fixed_width(contents: Any, field: str, dtype: np.dtype[Any], count: int) -> Array:
    """FP32 or FP64 contents as they travel: a packed field is the values' little-endian
    bytes, so the contents, serialized again (a copy at memcpy speed, the only field set),
    are the array's buffer. Read element by element, the field would cost a Python float
    each (a 16 MiB message: 14x its size in memory) and seconds."""
    data = contents.SerializeToString()
    number = contents.DESCRIPTOR.fields_by_name[field].number
    try:
        tag, at = varint(data, 0, len(data))
        length, at = varint(data, at, len(data))
    except ValueError:  # nothing set: the field is empty
        tag = length = at = 0
    wire = dtype.newbyteorder("<")
    framed = tag == (number << 3 | 2) and length == len(data) - at
    if not count or not framed or length != count * wire.itemsize:
        return np.fromiter(getattr(contents, field), dtype=dtype, count=count)
    return np.frombuffer(data, dtype=wire, offset=at).astype(dtype, copy=False)


def _outputs(requested: Sequence[Any]) -> tuple[RequestedOutput, ...] | None:
    names: set[str] = set()
    outputs: list[RequestedOutput] = []
    for index, output in enumerate(requested):
        where = f"outputs[{index}]"
        claim_name(output.name, names, "output", where)
        params = parameters(output.parameters, f"{where}.parameters")
        check_requested_output(output.name, params, where)
        params.pop("binary_data", None)  # REST's; over gRPC every output is raw
        outputs.append(RequestedOutput(name=output.name, binary=True, parameters=params))
    return tuple(outputs) or None  # none named: every output, as in Triton


def encode_infer_response(
    *,
    model_name: str,
    model_version: str | None,
    request_id: str | None,
    outputs: Sequence[OutputTensor],
) -> Any:
    """A ``ModelInferResponse`` with every output in ``raw_output_contents``, in order.

    Raises ``ProtocolError`` (500) for an array that does not fit its datatype or shape.
    """
    response = pb.ModelInferResponse(
        model_name=model_name, model_version=model_version or "", id=request_id or ""
    )
    for tensor in outputs:
        name, datatype = tensor.name, tensor.datatype
        check_output_fits(tensor)
        with blame(name):
            blob = array_to_wire(tensor.data, datatype=datatype, name=name)
        response.outputs.add(name=name, datatype=datatype, shape=tensor.shape)
        response.raw_output_contents.append(bytes(blob))
    return response


# ------------------------------------------------------------------ documents -> messages


def _parse(doc: Mapping[str, Any], message: Any) -> Any:
    # The JSON documents REST sends, as their messages; keys the message lacks (carpool's
    # additions to Triton's statistics, say) are left out.
    return json_format.ParseDict(doc, message, ignore_unknown_fields=True)


def server_metadata(doc: Mapping[str, Any]) -> Any:
    return _parse(doc, pb.ServerMetadataResponse())


def model_metadata(doc: Mapping[str, Any]) -> Any:
    return _parse(doc, pb.ModelMetadataResponse())


def model_config(doc: Mapping[str, Any]) -> Any:
    """A ``ModelConfigResponse``; the queue limit moves to where Triton's proto keeps it,
    and a version that is not a number (Triton's are) leaves the version policy out."""
    config = dict(doc)
    batching = dict(config.get("dynamic_batching", {}))
    if batching:
        policy = dict(batching.get("default_queue_policy", {}))
        policy["max_queue_size"] = batching.pop("max_queue_size", 0)
        batching["default_queue_policy"] = policy
        config["dynamic_batching"] = batching
    versions = config.get("version_policy", {}).get("specific", {}).get("versions", [])
    if not all(str(v).isdigit() for v in versions):
        config.pop("version_policy")
    return _parse({"config": config}, pb.ModelConfigResponse())


def model_statistics(docs: Sequence[Mapping[str, Any]]) -> Any:
    return _parse({"model_stats": list(docs)}, pb.ModelStatisticsResponse())


def repository_index(entries: Sequence[Mapping[str, Any]]) -> Any:
    return _parse({"models": list(entries)}, pb.RepositoryIndexResponse())
