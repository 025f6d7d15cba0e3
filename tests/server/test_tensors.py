"""The v2 tensor codecs: BYTES and BF16 layouts, JSON data, exact outcomes."""

from __future__ import annotations

import re
import struct
from typing import Any

import numpy as np
import pytest

from carpool.datatypes import FIXED_DTYPES
from carpool.server.tensors import (
    array_from_json,
    array_from_wire,
    array_to_json,
    array_to_wire,
    check_shape,
    deserialize_bf16_tensor,
    deserialize_bytes_tensor,
    json_may_hold_booleans,
    raw_shape,
    serialize_bf16_tensor,
    serialize_bytes_tensor,
)

# Every fixed-size datatype (their numpy types are pinned in tests/test_datatypes.py).
NUMERIC = FIXED_DTYPES


def bits_of(value: float) -> int:
    return int(np.array([value], dtype=np.float32).view(np.uint32)[0])


def float_from_bits(bits: int) -> float:
    return float(np.array([bits], dtype=np.uint32).view(np.float32)[0])


# -- BYTES ---------------------------------------------------------------------------------


def test_bytes_tensor_layout_is_length_prefixed_little_endian_row_major() -> None:
    array = np.array([[b"", "é"], [b"\x00\xff", "ab"]], dtype=object)
    expected = (
        b"\x00\x00\x00\x00"
        + b"\x02\x00\x00\x00\xc3\xa9"
        + b"\x02\x00\x00\x00\x00\xff"
        + b"\x02\x00\x00\x00ab"
    )
    assert serialize_bytes_tensor(array) == expected
    assert (
        serialize_bytes_tensor(array.T)
        == (  # row-major order of the transposed view
            b"\x00\x00\x00\x00" + b"\x02\x00\x00\x00\x00\xff" + b"\x02\x00\x00\x00\xc3\xa9"
            b"\x02\x00\x00\x00ab"
        )
    )
    back = deserialize_bytes_tensor(expected, 4)
    assert back.dtype == object
    assert back.tolist() == [b"", "é".encode(), b"\x00\xff", b"ab"]


def test_serialize_bytes_tensor_refuses_other_objects() -> None:
    with pytest.raises(TypeError, match="BYTES element 1 is int"):
        serialize_bytes_tensor(np.array([b"a", 3], dtype=object))


@pytest.mark.parametrize(
    ("buf", "count", "message"),
    [
        (b"\x01\x00\x00\x00abcd", 2, "ends inside the length prefix of element 1"),
        (b"\x05\x00\x00\x00abc", 1, "element 0 declares 5 bytes, 3 remain"),
        (b"\x01\x00\x00\x00ab", 1, "1 bytes remain after the last of 1 elements"),
        (b"", 1, "1 BYTES elements need at least 4 bytes, got 0"),
    ],
)
def test_deserialize_bytes_tensor_must_consume_exactly_the_buffer(
    buf: bytes, count: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        deserialize_bytes_tensor(buf, count)


def test_deserialize_bytes_tensor_checks_count_before_allocating() -> None:
    # 10**12 object slots would need 8 TB; the size check comes first.
    with pytest.raises(ValueError, match="need at least 4000000000000 bytes"):
        deserialize_bytes_tensor(b"\x00" * 8, 10**12)


# -- BF16 ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value_bits", "bf16"),
    [
        (bits_of(1.0), 0x3F80),
        (bits_of(-0.0), 0x8000),
        (0x3F808000, 0x3F80),  # exactly halfway, lower neighbour even: round down
        (0x3F818000, 0x3F82),  # exactly halfway, lower neighbour odd: round up
        (0x3F808001, 0x3F81),  # just above halfway: round up
        (0x3F807FFF, 0x3F80),  # just below halfway: round down
        (0x7F7FFFFF, 0x7F80),  # the largest float32 rounds to infinity
        (bits_of(float("inf")), 0x7F80),
        (bits_of(float("-inf")), 0xFF80),
    ],
)
def test_bf16_encoding_rounds_to_nearest_even(value_bits: int, bf16: int) -> None:
    encoded = serialize_bf16_tensor(np.array([float_from_bits(value_bits)], dtype=np.float32))
    assert encoded == struct.pack("<H", bf16)


def test_bf16_keeps_nan_a_nan_even_where_rounding_would_carry() -> None:
    nans = np.array([0x7FFFFFFF, 0xFFFFFFFF, 0x7FC00000], dtype=np.uint32).view(np.float32)
    back = deserialize_bf16_tensor(serialize_bf16_tensor(nans))
    assert np.isnan(back).all()


def test_bf16_decoding_is_exact_widening() -> None:
    buf = struct.pack("<4H", 0x3F80, 0xC040, 0x0001, 0x7F80)
    back = deserialize_bf16_tensor(buf)
    assert back.dtype == np.float32
    assert back.view(np.uint32).tolist() == [0x3F800000, 0xC0400000, 0x00010000, 0x7F800000]


def test_bf16_round_trip_is_exact_for_bf16_representable_values() -> None:
    values = np.array([1.0, -2.5, 0.15625, 3.0e38, 1.0e-38], dtype=np.float32)
    values = deserialize_bf16_tensor(serialize_bf16_tensor(values))  # now representable
    assert np.array_equal(deserialize_bf16_tensor(serialize_bf16_tensor(values)), values)


def test_bf16_encoding_matches_ml_dtypes() -> None:
    import ml_dtypes

    rng = np.random.default_rng(7)
    values = rng.standard_normal(10_000).astype(np.float32) * 1e3
    ours = serialize_bf16_tensor(values)
    theirs = values.astype(ml_dtypes.bfloat16).view(np.uint16).astype("<u2").tobytes()
    assert ours == theirs
    # and an ml_dtypes array is sent as its own bits
    assert serialize_bf16_tensor(values.astype(ml_dtypes.bfloat16)) == theirs


# -- JSON data -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("datatype", "data", "expected"),
    [
        ("BOOL", [True, False], np.array([True, False])),
        ("UINT8", [0, 255], np.array([0, 255], np.uint8)),
        ("UINT16", [0, 65535], np.array([0, 65535], np.uint16)),
        ("UINT32", [0, 2**32 - 1], np.array([0, 2**32 - 1], np.uint32)),
        ("UINT64", [2**64 - 1, 0], np.array([2**64 - 1, 0], np.uint64)),
        ("INT8", [-128, 127], np.array([-128, 127], np.int8)),
        ("INT16", [-(2**15), 2**15 - 1], np.array([-(2**15), 2**15 - 1], np.int16)),
        ("INT32", [-(2**31), 2**31 - 1], np.array([-(2**31), 2**31 - 1], np.int32)),
        ("INT64", [-(2**63), 2**63 - 1], np.array([-(2**63), 2**63 - 1], np.int64)),
        ("FP16", [0.1, 2], np.array([0.1, 2], np.float16)),
        ("FP32", [0.1, -3], np.array([0.1, -3], np.float32)),
        ("FP64", [0.1, 1e300], np.array([0.1, 1e300], np.float64)),
        ("BYTES", ["", "héllo"], np.array([b"", "héllo".encode()], object)),
    ],
)
def test_array_from_json_takes_each_datatype_exactly(
    datatype: str, data: list[Any], expected: np.ndarray[Any, Any]
) -> None:
    got = array_from_json(data, datatype=datatype, count=2, name="X")
    assert got.dtype == expected.dtype
    assert got.tolist() == expected.tolist()


def test_array_from_json_nested_equals_flat() -> None:
    flat = array_from_json([1, 2, 3, 4, 5, 6], datatype="INT32", count=6, name="X")
    nested = array_from_json([[1, 2, 3], [4, 5, 6]], datatype="INT32", count=6, name="X")
    ragged = array_from_json([[1], [2, [3, 4]], 5, [[6]]], datatype="INT32", count=6, name="X")
    assert flat.tolist() == nested.tolist() == ragged.tolist() == [1, 2, 3, 4, 5, 6]


def test_array_from_json_flattens_deep_nesting_without_recursion() -> None:
    data: Any = [7]
    for _ in range(5000):
        data = [data]
    assert array_from_json(data, datatype="INT64", count=1, name="X").tolist() == [7]


def test_array_from_json_empty() -> None:
    got = array_from_json([], datatype="FP32", count=0, name="X")
    assert got.dtype == np.float32
    assert got.size == 0


@pytest.mark.parametrize(
    ("datatype", "data", "message"),
    [
        ("FP32", ["1.0", 2], "FP32 needs numbers; element 0 is a string"),
        ("FP32", [1.0, None], "FP32 needs numbers; element 1 is null"),
        ("FP32", [1.0, True], "FP32 needs numbers; element 1 is a boolean"),
        ("FP32", [1.0, {"a": 1}], "FP32 needs numbers; element 1 is an object"),
        ("FP32", [1e39, 0], "a value is out of range for FP32"),
        ("FP16", [70000, 0], "a value is out of range for FP16"),
        ("INT8", [1, 300], r"INT8 needs integers in \[-128, 127\]; got 300"),
        ("INT8", [-129, 0], r"INT8 needs integers in \[-128, 127\]; got -129"),
        ("UINT8", [-1, 0], r"UINT8 needs integers in \[0, 255\]; got -1"),
        ("INT8", [-129, -300], r"INT8 needs integers in .*; got -129"),  # the first, not the least
        ("UINT32", [-1, 0.0], r"UINT32 needs integers in .*; got -1"),  # before the float
        ("INT64", [-1, 2**64 - 1], r"INT64 needs integers in .*; got 18446744073709551615"),
        ("INT32", [1, 2.5], "INT32 needs integers .*; element 1 is 2.5"),
        ("INT32", [True, False], "INT32 needs integers .*; element 0 is a boolean"),
        ("INT32", ["1", "2"], "INT32 needs integers .*; element 0 is a string"),
        ("BOOL", [1, 0], "BOOL needs true/false; element 0 is a number"),
        ("BOOL", [True, "x"], "BOOL needs true/false; element 1 is a string"),
        ("BYTES", ["a", 1], "BYTES need strings; element 1 is a number"),
        ("FP32", [1, 2, 3], "it holds 3 elements but the shape needs 2"),
        ("FP32", [[1], [2, 3]], "it holds 3 elements but the shape needs 2"),
        ("FP32", {"a": 1}, "expected an array, got an object"),
        ("FP32", "12", "expected an array, got a string"),
    ],
)
def test_array_from_json_refuses_what_does_not_fit(datatype: str, data: Any, message: str) -> None:
    with pytest.raises(ValueError, match=f"Unable to parse 'data' of input 'X': {message}"):
        array_from_json(data, datatype=datatype, count=2, name="X")


def test_array_from_json_refuses_bf16() -> None:
    with pytest.raises(ValueError, match="receiving BF16 data via JSON is not supported"):
        array_from_json([1.0], datatype="BF16", count=1, name="X")


@pytest.mark.parametrize(
    ("datatype", "array", "expected"),
    [
        ("BOOL", np.array([[True], [False]]), [True, False]),
        ("UINT64", np.array([[2**64 - 1, 1]], np.uint64), [2**64 - 1, 1]),
        ("INT8", np.array([[-128, 127]], np.int8), [-128, 127]),
        ("FP16", np.array([0.1, 1], np.float16), [float(np.float16(0.1)), 1.0]),
        ("FP32", np.array([0.5, -1], np.float64), [0.5, -1.0]),  # same-kind cast
        ("FP64", np.array([[1, 2], [3, 4]]).T.astype(np.float64), [1.0, 3.0, 2.0, 4.0]),
    ],
)
def test_array_to_json_is_flat_row_major(
    datatype: str, array: np.ndarray[Any, Any], expected: list[Any]
) -> None:
    data = array_to_json(array, datatype=datatype, name="Y")
    assert isinstance(data, np.ndarray)
    assert data.ndim == 1
    assert data.flags.c_contiguous
    assert data.tolist() == expected


def test_array_to_json_decodes_bytes_to_str() -> None:
    array = np.array([b"", "é".encode(), "x"], dtype=object)
    assert array_to_json(array, datatype="BYTES", name="Y") == ["", "é", "x"]


@pytest.mark.parametrize(
    ("datatype", "array", "error", "message"),
    [
        ("BYTES", np.array([b"\xff"], object), ValueError, "element 0 is not UTF-8"),
        ("BF16", np.array([1.0], np.float32), ValueError, "BF16 has no JSON form"),
        ("BYTES", np.array([1, 2]), TypeError, "a int64 array cannot be sent as BYTES"),
        ("BYTES", np.array([b"a", 2], object), TypeError, "BYTES element 1 is int"),
        ("INT32", np.array([1.5]), TypeError, "a float64 array cannot be sent as INT32"),
        ("BOOL", np.array([1]), TypeError, "a int64 array cannot be sent as BOOL"),
        ("FP32", np.array([1j]), TypeError, "a complex128 array cannot be sent as FP32"),
    ],
)
def test_array_to_json_refuses_what_json_or_the_datatype_cannot_carry(
    datatype: str, array: np.ndarray[Any, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=f"output 'Y'.*{message}"):
        array_to_json(array, datatype=datatype, name="Y")


def test_non_utf8_bytes_advise_binary_data() -> None:
    with pytest.raises(ValueError, match='"binary_data": true'):
        array_to_json(np.array([b"\xff"], object), datatype="BYTES", name="Y")


# -- binary data ---------------------------------------------------------------------------


@pytest.mark.parametrize(("datatype", "dtype"), NUMERIC.items())
def test_binary_round_trip_for_every_numeric_datatype(datatype: str, dtype: type) -> None:
    array: np.ndarray[Any, Any] = np.arange(6).reshape(2, 3).astype(dtype)
    wire = array_to_wire(array, datatype=datatype, name="Y")
    assert bytes(wire) == array.astype(np.dtype(dtype).newbyteorder("<")).tobytes()
    back = array_from_wire(wire, datatype=datatype, count=6, name="X")
    assert back.tolist() == array.reshape(-1).tolist()


def test_array_to_wire_writes_little_endian_row_major() -> None:
    array = np.array([[1, 2], [3, 4]], dtype=">i4").T
    assert bytes(array_to_wire(array, datatype="INT32", name="Y")) == struct.pack("<4i", 1, 3, 2, 4)


def test_array_to_wire_bf16_and_bytes() -> None:
    assert array_to_wire(np.array([1.0, -2.0]), datatype="BF16", name="Y") == struct.pack(
        "<2H", 0x3F80, 0xC000
    )
    assert array_to_wire(np.array(["ab"]), datatype="BYTES", name="Y") == b"\x02\x00\x00\x00ab"
    with pytest.raises(TypeError, match="a bool array cannot be sent as BF16"):
        array_to_wire(np.array([True]), datatype="BF16", name="Y")


def test_array_from_wire_is_a_zero_copy_view() -> None:
    buf = bytearray(np.arange(4, dtype=np.float32).tobytes())
    array = array_from_wire(memoryview(buf), datatype="FP32", count=4, name="X")
    assert np.shares_memory(array, np.frombuffer(buf, dtype=np.uint8))
    assert array.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_array_from_wire_views_misaligned_data_too() -> None:
    # A copy here would double what a large body costs; the model gets a stacked batch.
    buf = b"\x00" + np.arange(4, dtype=np.float64).tobytes()
    array = array_from_wire(memoryview(buf)[1:], datatype="FP64", count=4, name="X")
    assert not array.flags.aligned
    assert np.shares_memory(array, np.frombuffer(buf, dtype=np.uint8))
    assert array.tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize(
    ("datatype", "buf", "count", "message"),
    [
        ("FP32", b"\x00" * 12, 4, "input byte size mismatch for input 'X'. Expected 16, got 12"),
        ("BF16", b"\x00" * 3, 2, "input byte size mismatch for input 'X'. Expected 4, got 3"),
        ("BOOL", b"\x00\x02", 2, "BOOL data of input 'X' must be bytes 0 or 1"),
        ("BYTES", b"\x09\x00\x00\x00a", 1, "Unable to parse BYTES data of input 'X': element 0"),
    ],
)
def test_array_from_wire_refuses_bad_data(
    datatype: str, buf: bytes, count: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        array_from_wire(buf, datatype=datatype, count=count, name="X")


# -- shapes --------------------------------------------------------------------------------


def test_check_shape_accepts_non_negative_ints() -> None:
    assert check_shape([2, 0, 3], name="X") == (2, 0, 3)
    assert check_shape([], name="X") == ()
    assert check_shape([0, 2**59], name="X") == (0, 2**59)


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ([2, -1], "Unable to parse 'shape' of input 'X'"),
        ([True, 2], "Unable to parse 'shape' of input 'X'"),
        ([2.0], "Unable to parse 'shape' of input 'X'"),
        ("2", "Unable to parse 'shape' of input 'X'"),
        (None, "Unable to parse 'shape' of input 'X'"),
        ([1] * 33, "expected at most 32 non-negative integers"),
        ([2**40, 2**40], "causes total element count to exceed maximum size"),
        ([0, 2**62], "causes total element count to exceed maximum size"),  # numpy refuses it
    ],
)
def test_check_shape_refuses(shape: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_shape(shape, name="X")


@pytest.mark.parametrize(
    ("dims", "datatype", "nbytes", "expected"),
    [
        ([4], "FP32", 16, [4]),
        ([-1, 2], "FP32", 24, [3, 2]),
        ([2, -1], "UINT8", 0, [2, 0]),
        ([1], "BYTES", 5, [1]),
        ([1, 1], "BYTES", 0, [1, 1]),
    ],
)
def test_raw_shape(dims: list[int], datatype: str, nbytes: int, expected: list[int]) -> None:
    assert raw_shape(dims, datatype=datatype, nbytes=nbytes, name="X") == expected


@pytest.mark.parametrize(
    ("dims", "datatype", "nbytes", "message"),
    [
        (
            [2],
            "BYTES",
            4,
            r"For BYTE datatype raw input 'X', the model must have input shape \[1\]",
        ),
        ([-1], "BYTES", 4, r"the model must have input shape \[1\]"),
        ([-1, -1], "FP32", 16, "more than one variable-sized dimension"),
        ([-1, 2], "FP32", 20, "20 bytes do not fill shape"),
        ([-1, 0], "FP32", 0, "can not be deduced"),
    ],
)
def test_raw_shape_refuses(dims: list[int], datatype: str, nbytes: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        raw_shape(dims, datatype=datatype, nbytes=nbytes, name="X")


@pytest.mark.parametrize("datatype", ["FP32", "FP64"])
@pytest.mark.parametrize(
    "data",
    [
        [0.5, -1.25, 3, 0, 1e-40],
        [[1.0, 2.0], [3.0, 4.0]],
        [float("nan"), float("inf"), -float("inf"), 1.0],
        [2**24 + 1, -(2**31), 7],
        [],
    ],
    ids=["mixed", "nested", "non-finite", "integers", "empty"],
)
def test_numbers_without_booleans_read_as_the_checked_path_reads_them(
    datatype: str, data: list[Any]
) -> None:
    count = len(data) * (len(data[0]) if data and type(data[0]) is list else 1)
    fast = array_from_json(data, datatype=datatype, count=count, name="x", booleans=False)
    checked = array_from_json(data, datatype=datatype, count=count, name="x")
    assert fast.dtype == checked.dtype
    assert fast.shape == checked.shape == (count,)
    np.testing.assert_array_equal(fast, checked)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([1.0, "2"], "FP32 needs numbers; element 1 is a string"),
        ([1.0, None], "FP32 needs numbers; element 1 is null"),
        ([1.0, {"a": 1}], "FP32 needs numbers; element 1 is an object"),
        ([[1.0], 2.0], "it holds 2 elements but the shape needs 3"),
        ([1e300, 1.0], "a value is out of range for FP32"),
        ([1e300, float("inf")], "a value is out of range for FP32"),
        ([2**1100, 1.0], "a value is out of range for FP32"),
    ],
)
def test_numbers_without_booleans_refuse_what_the_checked_path_refuses(
    data: list[Any], message: str
) -> None:
    count = 3 if type(data[0]) is list else len(data)
    with pytest.raises(ValueError, match=re.escape(message)):
        array_from_json(data, datatype="FP32", count=count, name="x", booleans=False)


@pytest.mark.parametrize(
    ("text", "may"),
    [
        (b'{"data": [1.0, 2.0]}', False),
        (b'{"parameters": {"binary_data_output": false}, "data": [1.0]}', False),  # tritonclient
        (b'{"id": "is true", "data": [1]}', False),  # inside a string, after a space
        (b'{"id": "[true", "data": [1]}', True),  # a string may fool it: the checked path
        (b'{"data": [true]}', True),
        (b'{"data": [1.0,\n  false]}', True),
        (b'{"a": true, "data": [[0.5], [ true ]]}', True),
        (b"", False),
    ],
)
def test_json_may_hold_booleans_only_where_an_array_could(text: bytes, may: bool) -> None:
    assert json_may_hold_booleans(text) is may
    assert json_may_hold_booleans(memoryview(text)) is may
