"""Round trips of the v2 codecs, searched by Hypothesis: every datatype, every small shape
(zero-sized dimensions included), both wire forms; encode then decode is the identity.

Three levels: the tensor codecs (:mod:`carpool.server.tensors`) both ways; request bodies
built by the bench's encoder and by tritonclient's, parsed by :mod:`carpool.server.rest.codec`;
response bodies from :mod:`carpool.server.rest.codec`, read back by tritonclient. Bounded
(``max_examples``) and derandomized, so every run searches the same examples.
"""

from __future__ import annotations

import json
import math
from typing import Any

import ml_dtypes
import numpy as np
import orjson
import pytest
import tritonclient.http as triton
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tritonclient.http._utils import _get_inference_request

from carpool.bench.targets.payload import InputSpec, RequestSpec, encode
from carpool.datatypes import DATATYPES, FIXED_DTYPES
from carpool.server.messages import HEADER_LENGTH, OutputTensor
from carpool.server.rest.codec import (
    encode_infer_response,
    parse_header_length,
    parse_infer_request,
)
from carpool.server.tensors import array_from_json, array_from_wire, array_to_json, array_to_wire

Array = np.ndarray[Any, Any]
EXAMPLES = 200  # per test; a datatype is drawn per example, so each sees ~14 of its own
BOUNDED = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None)
# JSON carries neither BF16 nor NaN/Infinity as input data, nor FP16 through tritonclient.
NO_JSON = {"BF16"}
shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=4)


def tensors(datatype: str, *, finite: bool, utf8: bool = False) -> st.SearchStrategy[Array]:
    """Arrays carpool holds ``datatype`` in: BYTES as object arrays of bytes, BF16 as
    float32 whose low 16 bits are zero (exactly representable in BF16)."""
    if datatype == "BYTES":
        element = st.text(max_size=6).map(str.encode) if utf8 else st.binary(max_size=6)
        return shapes.flatmap(
            lambda shape: st.lists(element, min_size=math.prod(shape), max_size=math.prod(shape))
            .map(lambda items: _objects(items, shape))
        )  # fmt: skip
    if datatype == "BF16":
        bits = hnp.arrays(np.uint16, shapes).map(lambda a: a.astype(np.uint32) << 16)
        floats = bits.map(lambda a: a.view(np.float32))
        return floats.filter(lambda a: bool(np.isfinite(a).all())) if finite else floats
    dtype = FIXED_DTYPES[datatype]
    elements = (
        st.floats(width=dtype.itemsize * 8, allow_nan=False, allow_infinity=False)
        if dtype.kind == "f" and finite
        else None
    )
    return hnp.arrays(dtype, shapes, elements=elements)


def _objects(items: list[bytes], shape: tuple[int, ...]) -> Array:
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out.reshape(shape)


def same(actual: Array, expected: Array, datatype: str) -> None:
    """Equal element for element; floats bit for bit (-0.0 is not 0.0), any NaN for a NaN."""
    assert actual.shape == expected.shape
    if datatype == "BYTES":
        assert [bytes(x) for x in actual.reshape(-1)] == list(expected.reshape(-1))
    elif expected.dtype.kind == "f":
        width = f"u{expected.dtype.itemsize}"
        got = np.ascontiguousarray(actual, dtype=expected.dtype)
        nan = np.isnan(expected)
        np.testing.assert_array_equal(np.isnan(got), nan)
        np.testing.assert_array_equal(got[~nan].view(width), expected[~nan].view(width))
    else:
        np.testing.assert_array_equal(actual.astype(expected.dtype), expected)


@st.composite
def tensor_cases(draw: st.DrawFn, *, json: bool) -> tuple[str, Array]:
    choices = [d for d in DATATYPES if not (json and d in NO_JSON)]
    datatype = draw(st.sampled_from(choices))
    return datatype, draw(tensors(datatype, finite=json, utf8=json))


# -- tensor codecs -------------------------------------------------------------------------


@BOUNDED
@given(tensor_cases(json=False))
def test_wire_round_trip(case: tuple[str, Array]) -> None:
    datatype, array = case
    blob = bytes(array_to_wire(array, datatype=datatype, name="T"))
    back = array_from_wire(blob, datatype=datatype, count=array.size, name="T")
    same(back.reshape(array.shape), array, datatype)


@BOUNDED
@given(tensor_cases(json=True))
def test_json_round_trip(case: tuple[str, Array]) -> None:
    datatype, array = case
    data = array_to_json(array, datatype=datatype, name="T")
    text = orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY)  # as the server writes it
    back = array_from_json(orjson.loads(text), datatype=datatype, count=array.size, name="T")
    same(back.reshape(array.shape), array, datatype)


# -- request bodies -------------------------------------------------------------------------


def _parse(body: bytes, headers: dict[str, str]) -> dict[str, Array]:
    length = parse_header_length(headers.get(HEADER_LENGTH), len(body))
    request = parse_infer_request(body, length, max_elements=2**31)
    return {tensor.name: tensor.data for tensor in request.inputs}


@BOUNDED
@given(tensor_cases(json=False), tensor_cases(json=True), st.booleans())
def test_bench_requests_round_trip(
    first: tuple[str, Array], second: tuple[str, Array], binary: bool
) -> None:
    binary = binary or not _json_safe(first[1], first[0], finite=True)
    spec = RequestSpec(
        (InputSpec("A", first[0], first[1].shape[1:]), InputSpec("B", second[0], ()))
    )
    body, headers = encode({"A": first[1], "B": second[1]}, spec, binary=binary)
    parsed = _parse(body, headers)
    same(parsed["A"], first[1], first[0])
    same(parsed["B"], second[1], second[0])


@BOUNDED
@given(tensor_cases(json=False), st.booleans())
def test_tritonclient_requests_round_trip(case: tuple[str, Array], binary: bool) -> None:
    datatype, array = case
    binary = binary or not _json_safe(array, datatype, finite=True)
    wire_array = array.astype(ml_dtypes.bfloat16) if datatype == "BF16" else array
    tensor = triton.InferInput("T", list(array.shape), datatype)
    tensor.set_data_from_numpy(wire_array, binary_data=binary)
    body, json_length = _get_inference_request([tensor], "", None, 0, False, False, 0, None, None)
    headers = {} if json_length is None else {HEADER_LENGTH: str(json_length)}
    same(_parse(body if isinstance(body, bytes) else body.encode(), headers)["T"], array, datatype)


# -- response bodies ------------------------------------------------------------------------


@BOUNDED
@given(tensor_cases(json=False), st.booleans(), st.text(max_size=8))
def test_responses_round_trip_through_tritonclient(
    case: tuple[str, Array], binary: bool, request_id: str
) -> None:
    datatype, array = case
    binary = binary or not _json_safe(array, datatype)
    body, json_length = encode_infer_response(
        model_name="m",
        model_version="1",
        request_id=request_id,
        outputs=[(OutputTensor("T", datatype, array.shape, array), binary)],
    )
    result = triton.InferResult.from_response_body(body, header_length=json_length)
    assert result.get_response()["id"] == request_id
    back = result.as_numpy("T")
    if datatype == "BF16":
        back = back.astype(np.float32)
    elif datatype == "BYTES" and not binary:
        back = np.array([s.encode() for s in back.reshape(-1)], dtype=object).reshape(back.shape)
    same(back, array, datatype)


def _json_safe(array: Array, datatype: str, *, finite: bool = False) -> bool:
    # What JSON carries exactly: UTF-8 text; numbers, but not BF16; with ``finite``, no NaN
    # or Infinity (an input's JSON has none; an output's has them, as Python's json reads).
    if datatype == "BF16":
        return False
    if datatype == "BYTES":
        try:
            [bytes(x).decode() for x in array.reshape(-1)]
        except UnicodeDecodeError:
            return False
    return not (finite and array.dtype.kind == "f" and not np.isfinite(array).all())


@pytest.mark.parametrize("datatype", ["FP32", "FP64", "FP16"])
def test_nan_and_infinity_outputs_reach_tritonclient_as_json(datatype: str) -> None:
    array = np.array([[np.nan, np.inf, -np.inf, -0.0]], dtype=FIXED_DTYPES[datatype])
    body, json_length = encode_infer_response(
        model_name="m",
        model_version=None,
        request_id=None,
        outputs=[(OutputTensor("T", datatype, array.shape, array), False)],
    )
    assert json_length is None
    assert json.loads(body)["outputs"][0]["data"][1] == math.inf
    same(triton.InferResult.from_response_body(body).as_numpy("T"), array, datatype)
