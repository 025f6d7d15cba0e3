"""A ``ModelInferRequest`` read where its tensor bytes lie (:mod:`carpool.server.grpc.wire`):
decoded exactly as protobuf's whole parse decodes it, refused with the same words, and
without a copy of the tensors."""

from __future__ import annotations

import tracemalloc
from typing import Any

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from carpool.server.grpc import wire as grpc_wire
from carpool.server.grpc.codec import decode_infer_request
from carpool.server.grpc.wire import Received, read_infer_request
from carpool.server.messages import ProtocolError

LIMIT = 2**31


def _message(**fields: Any) -> Any:
    return pb.ModelInferRequest(model_name="m", model_version="2", id="r-1", **fields)


def _input(name: str, datatype: str, shape: list[int], **contents: Any) -> Any:
    tensor = pb.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=shape)
    for field, values in contents.items():
        getattr(tensor.contents, field).extend(values)
    tensor.parameters["p"].int64_param = 3
    return tensor


def _outcome(message: Any) -> Any:
    try:
        request = decode_infer_request(message, max_elements=LIMIT)
    except (ProtocolError, ValueError) as exc:
        return ("refused", str(exc), getattr(exc, "field", None))
    inputs = [
        (i.name, i.datatype, i.shape, i.data.dtype.str, i.data.tobytes(), i.parameters)
        for i in request.inputs
    ]
    return (request.id, request.parameters, inputs, request.outputs)


FLOATS = np.array([1.5, -0.0, np.inf, np.nan, 3e38], dtype=np.float32)
DOUBLES = np.array([1.5, -0.0, np.inf, np.nan, 1e300])
CASES = {
    "raw": _message(
        inputs=[_input("A", "FP32", [5]), _input("B", "INT8", [2])],
        raw_input_contents=[FLOATS.tobytes(), b"\x01\xff"],
    ),
    "typed floats": _message(
        inputs=[
            _input("A", "FP32", [1, 5], fp32_contents=FLOATS),
            _input("B", "FP64", [5], fp64_contents=DOUBLES),
            _input("C", "INT32", [2], int_contents=[7, -7]),
            _input("D", "BYTES", [2], bytes_contents=[b"x", b""]),
        ],
        outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="Y")],
    ),
    "a raw entry too few": _message(
        inputs=[_input("A", "FP32", [5]), _input("B", "FP32", [5])],
        raw_input_contents=[FLOATS.tobytes()],
    ),
    "raw and typed": _message(
        inputs=[_input("A", "FP32", [5], fp32_contents=FLOATS)],
        raw_input_contents=[FLOATS.tobytes()],
    ),
    "the wrong field": _message(inputs=[_input("A", "FP32", [5], fp64_contents=DOUBLES)]),
    "FP16 in fp32_contents": _message(inputs=[_input("A", "FP16", [5], fp32_contents=FLOATS)]),
    "too few": _message(inputs=[_input("A", "FP32", [6], fp32_contents=FLOATS)]),
    "two fields": _message(
        inputs=[_input("A", "FP32", [5], fp32_contents=FLOATS, fp64_contents=DOUBLES)]
    ),
    "empty raw": _message(inputs=[_input("A", "FP32", [0])], raw_input_contents=[b""]),
}


@pytest.fixture(autouse=True)
def _walk_every_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grpc_wire, "WALK_BYTES", 0)  # small messages are parsed whole


@pytest.mark.parametrize("case", sorted(CASES))
def test_read_as_received_decodes_as_the_whole_parse_does(case: str) -> None:
    message = CASES[case]
    data = message.SerializeToString()
    received = read_infer_request(data)
    assert isinstance(received, Received)
    assert (received.model_name, received.model_version, received.id) == ("m", "2", "r-1")
    assert _outcome(received) == _outcome(pb.ModelInferRequest.FromString(data))


def _field(number: int, wire: int, payload: bytes) -> bytes:
    tag = number << 3 | wire
    return bytes([tag]) + (bytes([len(payload)]) if wire == 2 else b"") + payload


@pytest.mark.parametrize(
    "data",
    [
        # floats one field each (unpacked, as proto2 writes them): parsed whole
        _field(1, 2, b"m")
        + _field(5, 2, _field(1, 2, b"A") + _field(2, 2, b"FP32") + _field(3, 2, b"\x02")
                 + _field(5, 2, _field(6, 5, b"\x00\x00\x80?") + _field(6, 5, b"\x00\x00\x00@"))),
        # contents twice, which protobuf merges
        _field(1, 2, b"m")
        + _field(5, 2, _field(1, 2, b"A") + _field(2, 2, b"FP32") + _field(3, 2, b"\x02")
                 + _field(5, 2, _field(6, 2, b"\x00\x00\x80?"))
                 + _field(5, 2, _field(6, 2, b"\x00\x00\x00@"))),
        # a raw entry, then the model name again (the last one counts)
        _field(1, 2, b"x") + _field(7, 2, b"\x00" * 4) + _field(1, 2, b"m")
        + _field(5, 2, _field(1, 2, b"A") + _field(2, 2, b"FP32") + _field(3, 2, b"\x01")),
    ],
)  # fmt: skip
def test_irregular_but_valid_messages_decode_as_the_whole_parse_does(data: bytes) -> None:
    received = read_infer_request(data)
    assert _outcome(received) == _outcome(pb.ModelInferRequest.FromString(data))
    assert received.model_name == "m"


@pytest.mark.parametrize(
    "data",
    [
        b"\x2a\x10\x0a",  # a field longer than the message
        _field(5, 2, _field(1, 2, b"A") + _field(5, 2, _field(6, 2, b"\x00\x00\x80"))),
        b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",  # a varint that never ends
    ],
)
def test_bytes_protobuf_refuses_are_refused_by_protobuf(data: bytes) -> None:
    with pytest.raises(DecodeError):
        pb.ModelInferRequest.FromString(data)
    with pytest.raises(DecodeError):
        read_infer_request(data)


@pytest.mark.parametrize("way", ["raw", "fp32_contents"])
def test_tensor_bytes_are_views_of_the_message_not_copies(way: str) -> None:
    values = np.arange(4_000_000, dtype=np.float32)
    tensor = _input("A", "FP32", [values.size])
    message = _message(inputs=[tensor])
    if way == "raw":
        message.raw_input_contents.append(values.tobytes())
    else:
        message.inputs[0].contents.fp32_contents.extend(values)
    data = message.SerializeToString()
    tracemalloc.start()
    try:
        (decoded,) = decode_infer_request(read_infer_request(data), max_elements=LIMIT).inputs
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert np.array_equal(decoded.data, values)
    # A view of the bytes received, aligned or not (as REST's binary tensors); a whole
    # parse copies each tensor once into protobuf's memory, and a raw one again as read.
    assert np.shares_memory(decoded.data, np.frombuffer(data, dtype=np.uint8))
    assert peak < values.nbytes / 100


def test_only_messages_of_walk_bytes_or_more_are_walked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grpc_wire, "WALK_BYTES", 64 * 1024)
    for size, walked in ((64 * 1024 - 100, False), (64 * 1024, True)):
        message = _message(inputs=[_input("A", "UINT8", [size])], raw_input_contents=[b"\0" * size])
        received = read_infer_request(message.SerializeToString())
        assert (received.raw is not None) == walked
        assert _outcome(received) == _outcome(message)
