"""``rest_codec``: REST's v2 bodies to records and back, every refusal with its field and
status.

Request bodies are built here without the code under test (``json.dumps`` plus blobs);
binary framing is the header length, then ``binary_data_size`` blobs in input order.
Response bodies are decoded here independently, the way a client does: the JSON header,
then the ``binary_data_size`` blobs in output order.
"""

from __future__ import annotations

import json
import math
import re
import struct
import tracemalloc
from typing import Any

import numpy as np
import pytest

from carpool.server.messages import (
    HEADER_LENGTH,
    InferRequest,
    OutputTensor,
    ProtocolError,
    RequestedOutput,
)
from carpool.server.rest.codec import (
    check_raw_content_type,
    encode_error,
    encode_infer_response,
    parse_header_length,
    parse_index_request,
    parse_infer_request,
    parse_raw_request,
)
from carpool.server.tensors import serialize_bf16_tensor
from server.conftest import BF16, SAMPLES, output_tensor, wire

LIMIT = 1 << 20


def request(doc: dict[str, Any], *blobs: bytes) -> tuple[bytes, int | None]:
    """A request body and its header length, built without the code under test."""
    head = json.dumps(doc).encode()
    if not blobs:
        return head, None
    return head + b"".join(blobs), len(head)


def parse(doc: dict[str, Any], *blobs: bytes, max_elements: int = LIMIT) -> InferRequest:
    body, length = request(doc, *blobs)
    return parse_infer_request(body, length, max_elements=max_elements)


def refused(doc: dict[str, Any], *blobs: bytes, max_elements: int = LIMIT) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        parse(doc, *blobs, max_elements=max_elements)
    return info.value


def json_input(name: str, datatype: str, array: np.ndarray[Any, Any]) -> dict[str, Any]:
    data = array.reshape(-1).tolist()
    if datatype == "BYTES":
        data = [item.decode() for item in data]
    return {"name": name, "datatype": datatype, "shape": list(array.shape), "data": data}


def binary_input(name: str, datatype: str, array: np.ndarray[Any, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "datatype": datatype,
        "shape": list(array.shape),
        "parameters": {"binary_data_size": len(wire(datatype, array))},
    }


# -- Inference-Header-Content-Length -------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"), [(None, None), ("0", 0), ("12", 12), (" 7 ", 7), ("+3", 3), ("20", 20)]
)
def test_parse_header_length(value: str | None, expected: int | None) -> None:
    assert parse_header_length(value, 20) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("abc", f"Unable to parse {HEADER_LENGTH}, got: abc"),
        ("1.5", f"Unable to parse {HEADER_LENGTH}, got: 1.5"),
        ("", f"Unable to parse {HEADER_LENGTH}, got: "),
        ("١٢", f"Unable to parse {HEADER_LENGTH}"),  # non-ASCII digits
        ("9" * 5000, f"Unable to parse {HEADER_LENGTH}, got: 9999"),  # no giant int()
        ("-1", r"inference header size should be in range \[0, 20\], got -1"),
        ("21", r"inference header size should be in range \[0, 20\], got 21"),
        (str(2**31), r"inference header size should be in range \[0, 20\], got 2147483648"),
    ],
)
def test_parse_header_length_refuses(value: str, message: str) -> None:
    with pytest.raises(ProtocolError, match=message) as info:
        parse_header_length(value, 20)
    assert (info.value.field, info.value.status) == (HEADER_LENGTH, 400)


# -- JSON requests -------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", SAMPLES)
def test_json_request_round_trips_every_datatype(datatype: str) -> None:
    array = SAMPLES[datatype]
    parsed = parse({"inputs": [json_input("X", datatype, array)]})
    (only,) = parsed.inputs
    assert (only.name, only.datatype, only.shape) == ("X", datatype, (2, 3))
    assert only.data.dtype == array.dtype
    assert only.data.shape == (2, 3)
    assert only.data.tolist() == array.tolist()
    assert not only.data.flags.writeable


def test_json_fp16_and_fp32_land_on_the_nearest_value() -> None:
    doc = {
        "inputs": [
            {"name": "H", "datatype": "FP16", "shape": [2], "data": [0.1, 1 / 3]},
            {"name": "F", "datatype": "FP32", "shape": [2], "data": [0.1, 1 / 3]},
        ]
    }
    half, single = parse(doc).inputs
    assert half.data.tolist() == np.array([0.1, 1 / 3], np.float16).tolist()
    assert single.data.tolist() == np.array([0.1, 1 / 3], np.float32).tolist()


def test_nested_and_flat_json_data_are_identical() -> None:
    flat = {"name": "X", "datatype": "FP32", "shape": [2, 2, 2], "data": list(range(8))}
    nested = dict(flat, data=[[[0, 1], [2, 3]], [[4, 5], [6, 7]]])
    a, b = parse({"inputs": [flat]}).inputs[0], parse({"inputs": [nested]}).inputs[0]
    assert a.data.shape == b.data.shape == (2, 2, 2)
    assert np.array_equal(a.data, b.data)


def test_bytes_json_data_become_utf8_bytes_objects() -> None:
    doc = {"inputs": [{"name": "S", "datatype": "BYTES", "shape": [3], "data": ["", "é", "日"]}]}
    data = parse(doc).inputs[0].data
    assert data.dtype == object
    assert data.tolist() == [b"", "é".encode(), "日".encode()]


def test_request_fields_id_parameters_and_outputs() -> None:
    doc = {
        "id": "req-1",
        "parameters": {"priority": 2, "timeout": 1500, "tag": "a", "ratio": 0.5, "flag": True},
        "inputs": [
            {"name": "X", "datatype": "INT32", "shape": [1], "data": [1], "parameters": {"k": 1}}
        ],
        "outputs": [
            {"name": "A"},
            {"name": "B", "parameters": {"binary_data": True}},
            {"name": "C", "parameters": {"binary_data": False, "custom": "x"}},
        ],
    }
    parsed = parse(doc)
    assert parsed.id == "req-1"
    assert parsed.parameters == {
        "priority": 2,
        "timeout": 1500,
        "tag": "a",
        "ratio": 0.5,
        "flag": True,
    }
    assert parsed.binary_data_output is False
    assert parsed.inputs[0].parameters == {"k": 1}
    assert parsed.outputs == (
        RequestedOutput("A", None, {}),
        RequestedOutput("B", True, {}),
        RequestedOutput("C", False, {"custom": "x"}),
    )


def test_absent_and_null_optional_fields() -> None:
    parsed = parse({"inputs": []})
    assert (parsed.id, parsed.parameters, parsed.inputs, parsed.outputs) == (None, {}, (), None)
    assert parsed.binary_data_output is False
    nulls = parse({"id": None, "parameters": None, "inputs": [], "outputs": None})
    assert (nulls.id, nulls.parameters, nulls.outputs) == (None, {}, None)


def test_empty_outputs_list_means_all_outputs() -> None:
    assert parse({"inputs": [], "outputs": []}).outputs is None


def test_binary_data_output_is_lifted_out_of_parameters() -> None:
    parsed = parse({"inputs": [], "parameters": {"binary_data_output": True, "x": 1}})
    assert parsed.binary_data_output is True
    assert parsed.parameters == {"x": 1}


# -- binary requests -----------------------------------------------------------------------


@pytest.mark.parametrize("datatype", [*SAMPLES, "BF16"])
def test_binary_request_round_trips_every_datatype(datatype: str) -> None:
    array = BF16 if datatype == "BF16" else SAMPLES[datatype]
    parsed = parse({"inputs": [binary_input("X", datatype, array)]}, wire(datatype, array))
    (only,) = parsed.inputs
    assert (only.datatype, only.shape, only.parameters) == (datatype, (2, 3), {})
    assert only.data.dtype == (np.float32 if datatype == "BF16" else array.dtype)
    assert only.data.tolist() == array.tolist()
    assert not only.data.flags.writeable


def test_bf16_binary_input_is_float32_rounded_to_bf16_precision() -> None:
    values = np.array([1.0 + 2**-9, 1 / 3], np.float32)  # not representable in BF16
    doc: dict[str, Any] = {"inputs": [{"name": "X", "datatype": "BF16", "shape": [2]}]}
    doc["inputs"][0]["parameters"] = {"binary_data_size": 4}
    got = parse(doc, serialize_bf16_tensor(values)).inputs[0].data
    assert got.tolist() == [1.0, 0.333984375]  # nearest BF16 values
    assert np.allclose(got, values, rtol=2**-8)


def test_mixed_json_and_binary_inputs_take_blobs_in_input_order() -> None:
    a = np.arange(4, dtype=np.int32)
    b = np.array([b"xy", b""], dtype=object)
    doc = {
        "inputs": [
            binary_input("A", "INT32", a),
            {"name": "J", "datatype": "FP64", "shape": [1], "data": [2.5]},
            binary_input("B", "BYTES", b),
        ]
    }
    parsed = parse(doc, wire("INT32", a), wire("BYTES", b))
    assert [i.name for i in parsed.inputs] == ["A", "J", "B"]
    assert parsed.inputs[0].data.tolist() == [0, 1, 2, 3]
    assert parsed.inputs[1].data.tolist() == [2.5]
    assert parsed.inputs[2].data.tolist() == [b"xy", b""]


def test_binary_inputs_are_zero_copy_views_of_the_body() -> None:
    array = np.arange(8, dtype=np.float64)
    for pad in range(8):  # every alignment of the blob: a view each time
        doc = {"inputs": [binary_input("X", "FP64", array)], "pad": " " * pad}
        body, length = request(doc, array.tobytes())
        buffer = bytearray(body)
        data = parse_infer_request(memoryview(buffer), length, max_elements=LIMIT).inputs[0].data
        assert np.shares_memory(data, np.frombuffer(buffer, dtype=np.uint8))
        assert data.tolist() == array.tolist()


def test_a_repeated_binary_header_reads_each_requests_own_bytes() -> None:
    # The second parse of a header is remembered, not re-read: each request still gets its
    # own data and its own parameter dicts, and the same fields as the first.
    doc = {
        "id": "same",
        "parameters": {"priority": 2, "binary_data_output": True},
        "inputs": [{**binary_input("X", "INT32", np.zeros(3, np.int32)), "parameters": {
            "binary_data_size": 12, "tag": "t"}}],
        "outputs": [{"name": "Y", "parameters": {"binary_data": False}}],
    }  # fmt: skip
    first, second = (parse(doc, np.array([i, i + 1, i + 2], np.int32).tobytes()) for i in (1, 10))
    assert first.inputs[0].data.tolist() == [1, 2, 3]
    assert second.inputs[0].data.tolist() == [10, 11, 12]
    for got in (first, second):
        assert (got.id, got.parameters, got.binary_data_output) == ("same", {"priority": 2}, True)
        assert got.inputs[0].parameters == {"tag": "t"}
        assert got.outputs is not None
        assert got.outputs[0].binary is False
    assert first.parameters is not second.parameters
    assert first.inputs[0].parameters is not second.inputs[0].parameters


def test_a_repeated_binary_header_with_other_sizes_is_refused_as_the_first_was() -> None:
    doc = {"inputs": [binary_input("X", "FP32", np.zeros(2, np.float32))]}
    assert parse(doc, bytes(8)).inputs[0].data.tolist() == [0.0, 0.0]
    short = refused(doc, bytes(4))
    assert (short.field, short.detail) == ("X", "unexpected size for input 'X', expecting 4 "
                                           "additional bytes")  # fmt: skip
    long = refused(doc, bytes(12))
    assert long.field == "body"
    assert "4 bytes follow the last binary input" in long.detail
    over = refused(doc, bytes(8), max_elements=1)  # the limit is part of what is remembered
    assert over.status == 413


def test_zero_size_binary_input_needs_no_header() -> None:
    doc: dict[str, Any] = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [0, 3]}]}
    doc["inputs"][0]["parameters"] = {"binary_data_size": 0}
    body = json.dumps(doc).encode()
    data = parse_infer_request(body, None, max_elements=LIMIT).inputs[0].data
    assert data.shape == (0, 3)
    assert data.dtype == np.float32


# -- refusals ------------------------------------------------------------------------------


def input_doc(**fields: Any) -> dict[str, Any]:
    item: dict[str, Any] = {"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}
    item.update(fields)
    return {"inputs": [{k: v for k, v in item.items() if v is not ...}]}


@pytest.mark.parametrize(
    ("doc", "field", "message"),
    [
        ({}, "inputs", "Unable to parse 'inputs'"),
        ({"inputs": {"name": "x"}}, "inputs", "Unable to parse 'inputs': expected an array"),
        ({"inputs": [3]}, "inputs[0]", r"Unable to parse 'inputs\[0\]': expected an object"),
        (input_doc(name=...), "inputs[0].name", r"Unable to parse 'inputs\[0\].name'"),
        (input_doc(name=7), "inputs[0].name", r"Unable to parse 'inputs\[0\].name'"),
        (input_doc(datatype="FP8"), "inputs[0].datatype", "invalid datatype 'FP8' for input"),
        (input_doc(datatype="fp32"), "inputs[0].datatype", "invalid datatype 'fp32'"),
        (input_doc(datatype=...), "inputs[0].datatype", "invalid datatype None"),
        (input_doc(shape=[-2]), "inputs[0].shape", "Unable to parse 'shape' of input 'INPUT0'"),
        (input_doc(shape=[True]), "inputs[0].shape", "Unable to parse 'shape'"),
        (input_doc(shape=[2.0]), "inputs[0].shape", "Unable to parse 'shape'"),
        (input_doc(shape="2"), "inputs[0].shape", "Unable to parse 'shape'"),
        (input_doc(shape=...), "inputs[0].shape", "Unable to parse 'shape'"),
        (input_doc(data=..., parameters={}), "inputs[0]", "But no field is set"),
        (
            input_doc(parameters={"binary_data_size": 8}),
            "inputs[0]",
            "Input must set only one of the following fields: 'data', 'binary_data_size' in "
            "'parameters', 'shared_memory_region' in 'parameters'. But set 'data' "
            "'binary_data_size'",
        ),
        (
            input_doc(
                data=..., parameters={"shared_memory_region": "r", "shared_memory_byte_size": 8}
            ),
            "inputs[0].parameters",
            "shared memory is not supported by this server",
        ),
        (
            input_doc(data=..., parameters={"binary_data_size": -1}),
            "inputs[0].parameters.binary_data_size",
            "Unable to parse 'binary_data_size'",
        ),
        (
            input_doc(data=..., parameters={"binary_data_size": "8"}),
            "inputs[0].parameters.binary_data_size",
            "Unable to parse 'binary_data_size'",
        ),
        (
            input_doc(data=..., parameters={"binary_data_size": True}),
            "inputs[0].parameters.binary_data_size",
            "Unable to parse 'binary_data_size'",
        ),
        (
            input_doc(parameters={"nested": {"a": 1}}),
            "inputs[0].parameters.nested",
            "must be a string, number or boolean",
        ),
        (input_doc(parameters=[1]), "inputs[0].parameters", "expected an object"),
        (
            input_doc(data=["1", 2]),
            "INPUT0",
            "Unable to parse 'data' of input 'INPUT0': FP32 needs numbers; element 0 is a string",
        ),
        (input_doc(data=[1.0]), "INPUT0", "it holds 1 elements but the shape needs 2"),
        (
            input_doc(datatype="INT8", data=[1, 300]),
            "INPUT0",
            r"INT8 needs integers in \[-128, 127\]; got 300",
        ),
        (input_doc(datatype="BOOL", data=[1, 0]), "INPUT0", "BOOL needs true/false"),
        (input_doc(datatype="BF16"), "INPUT0", "receiving BF16 data via JSON is not supported"),
        (
            input_doc(datatype="BYTES", data=["a", None]),
            "INPUT0",
            "BYTES need strings; element 1 is null",
        ),
        ({"id": 5, "inputs": []}, "id", "Unable to parse 'id': expected a string"),
        (
            {"parameters": {"a": [1]}, "inputs": []},
            "parameters.a",
            "must be a string, number or boolean",
        ),
        (
            {"parameters": {"a": None}, "inputs": []},
            "parameters.a",
            "must be a string, number or boolean",
        ),
        ({"parameters": "x", "inputs": []}, "parameters", "Unable to parse 'parameters'"),
        (
            {"parameters": {"binary_data_output": 1}, "inputs": []},
            "parameters.binary_data_output",
            "Unable to parse 'binary_data_output': expected true or false",
        ),
        ({"inputs": [], "outputs": {"name": "a"}}, "outputs", "Unable to parse 'outputs'"),
        ({"inputs": [], "outputs": ["a"]}, "outputs[0]", "expected an object"),
        (
            {"inputs": [], "outputs": [{}]},
            "outputs[0].name",
            r"Unable to parse 'outputs\[0\].name'",
        ),
        (
            {"inputs": [], "outputs": [{"name": "A", "parameters": {"binary_data": "yes"}}]},
            "outputs[0].parameters.binary_data",
            "Unable to parse 'binary_data'",
        ),
        (
            {"inputs": [], "outputs": [{"name": "A", "parameters": {"shared_memory_region": "r"}}]},
            "outputs[0].parameters",
            "shared memory is not supported by this server",
        ),
        (
            {"inputs": [], "outputs": [{"name": "A", "parameters": {"classification": 3}}]},
            "outputs[0].parameters.classification",
            "classification extension is not supported",
        ),
    ],
)
def test_refusals_name_the_field(doc: dict[str, Any], field: str, message: str) -> None:
    error = refused(doc)
    assert error.field == field
    assert error.status == 400
    assert re.search(message, str(error)), f"{message!r} not in {str(error)!r}"


def test_duplicate_output_names_use_tritons_message() -> None:
    doc = {"inputs": [], "outputs": [{"name": "OUTPUT0"}, {"name": "OUTPUT0"}]}
    error = refused(doc)
    assert str(error) == "output 'OUTPUT0' already exists in request"
    assert error.field == "outputs[1].name"


def test_duplicate_input_names_are_refused() -> None:
    item = {"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.0]}
    error = refused({"inputs": [item, item]})
    assert str(error) == "input 'INPUT0' already exists in request"
    assert error.field == "inputs[1].name"


@pytest.mark.parametrize(
    "body",
    [
        b"{",
        b"",
        b"\xff\xfe",
        b'{"inputs": []} x',
        b'{"inputs": [nan]}',
        b'{"inputs": [NaN] x',
        b'{"a": Infinityx}',
        b"[" * 100_000 + b"NaN" + b"]" * 100_000,  # a nesting bomb on the stdlib's path
    ],
)
def test_malformed_json_is_refused(body: bytes) -> None:
    with pytest.raises(ProtocolError, match="failed to parse the request JSON buffer") as info:
        parse_infer_request(body, None, max_elements=LIMIT)
    assert info.value.field == "body"


@pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64"])
def test_json_takes_nan_and_infinity_as_triton_does(datatype: str) -> None:
    """perf_analyzer sends random FP32 bit patterns as JSON: bare NaN and Infinity tokens."""
    body = (
        b'{"inputs": [{"name": "X", "datatype": "%s", "shape": [4], '
        b'"data": [NaN, Infinity, -Infinity, 1.5]}]}' % datatype.encode()
    )
    (tensor,) = parse_infer_request(body, None, max_elements=LIMIT).inputs
    assert np.isnan(tensor.data[0])
    assert tensor.data[1:].tolist() == [np.inf, -np.inf, 1.5]
    assert tensor.data.dtype == np.dtype(datatype.replace("FP", "float"))


def test_an_id_that_cannot_be_written_back_is_refused_before_the_model_runs() -> None:
    """The stdlib, which reads bodies with NaN, takes a lone surrogate in the id that no
    encoder writes back: a 400 naming the id, not a 500 after the model ran."""
    body = b'{"id": "a\\ud800b", "inputs": [{"name": "X", "datatype": "FP32", "shape": [1], '
    body += b'"data": [NaN]}]}'
    with pytest.raises(ProtocolError, match="lone UTF-16 surrogate") as info:
        parse_infer_request(body, None, max_elements=LIMIT)
    assert (info.value.field, info.value.status) == ("id", 400)
    fine = body.replace(b"\\ud800", "\u00e9t\u00e9".encode())
    assert parse_infer_request(fine, None, max_elements=LIMIT).id == "a\u00e9t\u00e9b"


def test_json_with_nan_still_refuses_a_finite_value_too_large_for_its_datatype() -> None:
    body = b'{"inputs": [{"name": "X", "datatype": "FP32", "shape": [2], "data": [NaN, 1e39]}]}'
    with pytest.raises(ProtocolError, match="a value is out of range for FP32") as info:
        parse_infer_request(body, None, max_elements=LIMIT)
    assert info.value.field == "X"
    huge = b'{"inputs": [{"name": "X", "datatype": "FP32", "shape": [2], "data": [NaN, 1%s]}]}'
    with pytest.raises(ProtocolError, match="a value is out of range for FP32"):
        parse_infer_request(huge % (b"0" * 400), None, max_elements=LIMIT)


@pytest.mark.parametrize("body", [b"[]", b'"inputs"', b"3", b"null"])
def test_a_request_that_is_not_an_object_is_refused(body: bytes) -> None:
    with pytest.raises(ProtocolError, match="must be a JSON object"):
        parse_infer_request(body, None, max_elements=LIMIT)


# -- sizes and limits ----------------------------------------------------------------------


def test_huge_shapes_are_refused_before_allocating() -> None:
    doc = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [2**40, 2**40], "data": [1]}]}
    tracemalloc.start()
    try:
        error = refused(doc)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert "causes total element count to exceed maximum size" in str(error)
    assert (error.field, error.status) == ("inputs[0].shape", 400)


def test_over_max_elements_is_413_and_counts_every_input() -> None:
    one = {"name": "A", "datatype": "UINT8", "shape": [2**20, 2**20], "data": []}
    error = refused({"inputs": [one]}, max_elements=1000)
    assert (error.field, error.status) == ("inputs[0].shape", 413)
    assert "over this server's limit of 1000" in str(error)
    a = {"name": "A", "datatype": "UINT8", "shape": [600], "data": [0] * 600}
    b = {"name": "B", "datatype": "UINT8", "shape": [600], "data": [0] * 600}
    error = refused({"inputs": [a, b]}, max_elements=1000)
    assert (error.field, error.status) == ("inputs[1].shape", 413)
    assert "brings the request to 1200 elements" in str(error)
    assert len(parse({"inputs": [a]}, max_elements=600).inputs) == 1


def test_max_elements_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_elements must be >= 1"):
        parse_infer_request(b"{}", None, max_elements=0)


def test_binary_size_must_match_the_shape() -> None:
    doc: dict[str, Any] = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [4]}]}
    doc["inputs"][0]["parameters"] = {"binary_data_size": 12}
    error = refused(doc, b"\x00" * 12)
    assert str(error) == "input byte size mismatch for input 'X'. Expected 16, got 12"
    assert error.field == "X"


def test_a_short_body_is_refused_with_the_missing_byte_count() -> None:
    array = np.arange(4, dtype=np.float32)
    error = refused({"inputs": [binary_input("X", "FP32", array)]}, array.tobytes()[:10])
    assert str(error) == "unexpected size for input 'X', expecting 6 additional bytes"
    assert error.field == "X"


def test_leftover_bytes_are_refused() -> None:
    array = np.arange(4, dtype=np.float32)
    error = refused({"inputs": [binary_input("X", "FP32", array)]}, array.tobytes() + b"xyz")
    assert str(error).startswith("unexpected additional input data")
    assert "3 bytes" in str(error)
    assert error.field == "body"
    error = refused({"inputs": [json_input("X", "FP32", array)]}, b"tail")
    assert str(error).startswith("unexpected additional input data")


def test_binary_data_without_the_header_is_refused() -> None:
    array = np.arange(4, dtype=np.float32)
    body = json.dumps({"inputs": [binary_input("X", "FP32", array)]}).encode()
    with pytest.raises(ProtocolError) as info:  # without the header, the body is all JSON
        parse_infer_request(body, None, max_elements=LIMIT)
    assert f"must specify valid '{HEADER_LENGTH}' in request header" in str(info.value)
    assert info.value.field == HEADER_LENGTH


@pytest.mark.parametrize("length", [0, -1, 10_000])
def test_header_length_out_of_range_is_refused(length: int) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_infer_request(b'{"inputs": []}', length, max_elements=LIMIT)
    assert info.value.field == HEADER_LENGTH


@pytest.mark.parametrize(
    ("datatype", "blob", "message"),
    [
        ("BOOL", b"\x00\x02", "BOOL data of input 'X' must be bytes 0 or 1"),
        ("BYTES", b"\x01\x00\x00\x00ab", "Unable to parse BYTES data of input 'X'"),
        ("BYTES", b"\x09\x00\x00\x00ab", "Unable to parse BYTES data of input 'X'"),
        ("BF16", b"\x00\x00\x00", "input byte size mismatch for input 'X'. Expected 4, got 3"),
    ],
)
def test_bad_binary_data_is_refused(datatype: str, blob: bytes, message: str) -> None:
    doc: dict[str, Any] = {
        "inputs": [{"name": "X", "datatype": datatype, "shape": [2 if datatype != "BYTES" else 1]}]
    }
    doc["inputs"][0]["parameters"] = {"binary_data_size": len(blob)}
    error = refused(doc, blob)
    assert message in str(error)
    assert error.field == "X"


# -- raw binary requests -------------------------------------------------------------------


def test_raw_request_is_one_batch1_input_with_every_output_binary() -> None:
    array = np.arange(6, dtype=np.float32)
    parsed = parse_raw_request(
        array.tobytes(), name="INPUT0", datatype="FP32", shape_without_batch=[-1, 2]
    )
    (only,) = parsed.inputs
    assert (only.name, only.datatype, only.shape) == ("INPUT0", "FP32", (1, 3, 2))
    assert only.data.tolist() == [[[0, 1], [2, 3], [4, 5]]]
    assert parsed.binary_data_output is True
    assert (parsed.id, parsed.parameters, parsed.outputs) == (None, {}, None)


def test_raw_request_without_a_batch_dimension() -> None:
    parsed = parse_raw_request(
        b"\x01\x00\x02\x00", name="X", datatype="INT16", shape_without_batch=[2], batched=False
    )
    assert parsed.inputs[0].shape == (2,)
    assert parsed.inputs[0].data.tolist() == [1, 2]


def test_raw_bytes_request_is_the_element_itself() -> None:
    parsed = parse_raw_request(
        "héllo".encode(), name="TEXT", datatype="BYTES", shape_without_batch=[1]
    )
    assert parsed.inputs[0].shape == (1, 1)
    assert parsed.inputs[0].data.tolist() == [["héllo".encode()]]


def test_raw_bf16_request() -> None:
    body = struct.pack("<2H", 0x3F80, 0xC000)
    parsed = parse_raw_request(body, name="X", datatype="BF16", shape_without_batch=[2])
    assert parsed.inputs[0].data.tolist() == [[1.0, -2.0]]


@pytest.mark.parametrize(
    ("datatype", "dims", "body", "message"),
    [
        (
            "BYTES",
            [2],
            b"ab",
            "For BYTE datatype raw input 'X', the model must have input shape [1]",
        ),
        ("FP32", [-1, -1], b"\x00" * 16, "more than one variable-sized dimension"),
        ("FP32", [4], b"\x00" * 12, "input byte size mismatch for input 'X'. Expected 16, got 12"),
        ("FP32", [-1, 2], b"\x00" * 12, "12 bytes do not fill shape [-1, 2]"),
    ],
)
def test_raw_request_refusals(datatype: str, dims: list[int], body: bytes, message: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_raw_request(body, name="X", datatype=datatype, shape_without_batch=dims)
    assert message in str(info.value)
    assert (info.value.field, info.value.status) == ("X", 400)


@pytest.mark.parametrize(
    ("body", "ready"),
    [
        (b"", False),
        (b"  ", False),
        (b"{}", False),
        (b'{"ready": true}', True),
        (b'{"ready": false}', False),
    ],
)
def test_parse_index_request(body: bytes, ready: bool) -> None:
    assert parse_index_request(body) is ready


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"ready": {}}', "Unable to parse 'ready': expected true or false"),
        (b'{"ready": 1}', "Unable to parse 'ready': expected true or false"),
        (b"[]", "the request body must be a JSON object"),
        (b"{", "failed to parse the request JSON buffer"),
    ],
)
def test_parse_index_request_refuses(body: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=re.escape(message)) as caught:
        parse_index_request(body)
    assert caught.value.status == 400


@pytest.mark.parametrize("content_type", [None, "application/octet-stream", "text/plain"])
def test_a_raw_body_may_have_any_type_but_json(content_type: str | None) -> None:
    check_raw_content_type(content_type)


@pytest.mark.parametrize("content_type", ["application/json", "Application/JSON; charset=utf-8"])
def test_a_raw_body_that_says_json_is_refused(content_type: str) -> None:
    with pytest.raises(ProtocolError, match="makes the whole body raw binary") as caught:
        check_raw_content_type(content_type)
    assert (caught.value.status, caught.value.field) == (400, HEADER_LENGTH)


# ------------------------------------------------------------------ responses


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
