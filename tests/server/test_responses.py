"""Response bodies: JSON and binary framing, every datatype, every refusal.

Bodies are decoded here independently, the way a client does: the JSON header, then the
``binary_data_size`` blobs in output order.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

from carpool.server.messages import OutputTensor, ProtocolError
from carpool.server.responses import encode_error, encode_infer_response

from .conftest import BF16, SAMPLES, output_tensor, wire


def split_response(body: bytes, header_length: int | None) -> tuple[dict[str, Any], list[bytes]]:
    """Decode a response the way a client does: JSON header, then blobs in output order."""
    if header_length is None:
        return json.loads(body), []
    header = json.loads(body[:header_length])
    blobs, offset = [], header_length
    for output in header["outputs"]:
        size = output.get("parameters", {}).get("binary_data_size")
        if size is not None:
            blobs.append(body[offset : offset + size])
            offset += size
    assert offset == len(body), "blobs must fill the body exactly"
    return header, blobs


# -- responses -----------------------------------------------------------------------------


def test_json_response_fields() -> None:
    body, length = encode_infer_response(
        model_name="m",
        model_version=None,
        request_id=None,
        outputs=[(output_tensor("Y", "INT32", np.array([[1, 2], [3, 4]], np.int32)), False)],
    )
    assert length is None
    assert json.loads(body) == {
        "model_name": "m",
        "outputs": [{"name": "Y", "datatype": "INT32", "shape": [2, 2], "data": [1, 2, 3, 4]}],
    }
    body, _ = encode_infer_response(
        model_name="m",
        model_version="3",
        request_id="",
        outputs=[],
        parameters={"sequence": "x"},
    )
    assert json.loads(body) == {
        "model_name": "m",
        "model_version": "3",
        "id": "",
        "parameters": {"sequence": "x"},
        "outputs": [],
    }


@pytest.mark.parametrize("datatype", SAMPLES)
def test_json_response_round_trips_every_datatype(datatype: str) -> None:
    array = SAMPLES[datatype]
    body, length = encode_infer_response(
        model_name="m",
        model_version=None,
        request_id="r",
        outputs=[(output_tensor("Y", datatype, array), False)],
    )
    header, blobs = split_response(body, length)
    assert (length, blobs, header["id"]) == (None, [], "r")
    (output,) = header["outputs"]
    assert (output["datatype"], output["shape"]) == (datatype, [2, 3])
    if datatype == "BYTES":
        assert output["data"] == [item.decode() for item in array.reshape(-1)]
    else:
        back = np.array(output["data"], dtype=array.dtype).reshape(2, 3)
        assert back.tobytes() == array.tobytes()  # bit-exact, signed zeros included
        kinds = {type(item) for item in output["data"]}
        assert kinds == (
            {bool} if datatype == "BOOL" else {int} if array.dtype.kind in "iu" else {float}
        )


@pytest.mark.parametrize("datatype", [*SAMPLES, "BF16"])
def test_binary_response_round_trips_every_datatype(datatype: str) -> None:
    array = BF16 if datatype == "BF16" else SAMPLES[datatype]
    body, length = encode_infer_response(
        model_name="m",
        model_version=None,
        request_id=None,
        outputs=[(output_tensor("Y", datatype, array), True)],
    )
    header, (blob,) = split_response(body, length)
    (output,) = header["outputs"]
    assert "data" not in output
    assert output["parameters"] == {"binary_data_size": len(blob)}
    assert blob == wire(datatype, array)


def test_binary_response_framing_keeps_output_order_and_mixes_json() -> None:
    a = np.arange(3, dtype=np.int64)
    b = np.array([[0.5, 1.5]], np.float32)
    c = np.array([b"ab", b""], dtype=object)
    body, length = encode_infer_response(
        model_name="m",
        model_version="1",
        request_id="r7",
        outputs=[
            (output_tensor("A", "INT64", a), True),
            (output_tensor("B", "FP32", b), False),
            (output_tensor("C", "BYTES", c), True),
        ],
    )
    assert length is not None
    header = json.loads(body[:length])
    assert [o["name"] for o in header["outputs"]] == ["A", "B", "C"]
    assert header["outputs"][1]["data"] == [0.5, 1.5]
    sizes = [o.get("parameters", {}).get("binary_data_size") for o in header["outputs"]]
    assert sizes == [24, None, 10]
    assert body[length:] == a.tobytes() + b"\x02\x00\x00\x00ab" + b"\x00\x00\x00\x00"


def test_empty_binary_output_still_announces_the_header() -> None:
    body, length = encode_infer_response(
        model_name="m",
        model_version=None,
        request_id=None,
        outputs=[(output_tensor("Y", "FP32", np.zeros((0, 4), np.float32)), True)],
    )
    assert length == len(body)
    assert json.loads(body)["outputs"][0]["parameters"] == {"binary_data_size": 0}


def test_nan_and_infinity_yield_a_body_pythons_json_parses() -> None:
    values = np.array([np.nan, np.inf, -np.inf, 1.5], np.float32)
    body, length = encode_infer_response(
        model_name="m",
        model_version=None,
        request_id=None,
        outputs=[
            (output_tensor("Y", "FP32", values), False),
            (output_tensor("Z", "INT8", np.array([1], np.int8)), False),
        ],
    )
    assert length is None
    data = json.loads(body)["outputs"][0]["data"]
    assert math.isnan(data[0])
    assert data[1:] == [math.inf, -math.inf, 1.5]
    assert json.loads(body)["outputs"][1]["data"] == [1]


def test_finite_float32_is_written_in_its_shortest_form() -> None:
    body, _ = encode_infer_response(
        model_name="m",
        model_version=None,
        request_id=None,
        outputs=[(output_tensor("Y", "FP32", np.array([0.1], np.float32)), False)],
    )
    assert b'"data":[0.1]' in body


@pytest.mark.parametrize(
    ("output", "field", "status", "message"),
    [
        (
            output_tensor("Y", "BYTES", np.array([b"\xff\xfe"], object)),
            "Y",
            400,
            "output 'Y' cannot be sent as JSON: element 0 is not UTF-8",
        ),
        (
            output_tensor("Y", "BF16", np.array([1.0], np.float32)),
            "Y",
            400,
            "BF16 has no JSON form",
        ),
        (
            output_tensor("Y", "INT32", np.array([1.5])),
            "Y",
            500,
            "a float64 array cannot be sent as INT32",
        ),
        (
            OutputTensor("Y", "FP32", (3,), np.zeros(2, np.float32)),
            "Y",
            500,
            "does not fit datatype 'FP32' and shape [3]",
        ),
        (
            OutputTensor("Y", "FP8", (2,), np.zeros(2, np.float32)),
            "Y",
            500,
            "does not fit datatype 'FP8'",
        ),
        (
            output_tensor("Y", "BYTES", np.array(["\ud800"], object)),
            "body",
            500,
            "cannot be encoded as JSON",
        ),
    ],
)
def test_response_refusals(output: OutputTensor, field: str, status: int, message: str) -> None:
    with pytest.raises(ProtocolError) as info:
        encode_infer_response(
            model_name="m", model_version=None, request_id=None, outputs=[(output, False)]
        )
    assert message in str(info.value)
    assert (info.value.field, info.value.status) == (field, status)


def test_json_refusals_tell_the_client_to_ask_for_binary() -> None:
    output = output_tensor("Y", "BYTES", np.array([b"\xff"], object))
    with pytest.raises(ProtocolError, match='"binary_data": true'):
        encode_infer_response(
            model_name="m", model_version=None, request_id=None, outputs=[(output, False)]
        )
    body, length = encode_infer_response(
        model_name="m", model_version=None, request_id=None, outputs=[(output, True)]
    )
    assert split_response(body, length)[1] == [b"\x01\x00\x00\x00\xff"]


@pytest.mark.parametrize("message", ["Exceeds maximum queue size", 'é \ud800 "quoted"', ""])
def test_encode_error(message: str) -> None:
    body = encode_error(message)
    assert json.loads(body) == {"error": message}
    body.decode("ascii")  # any str encodes
