"""The v2 datatype table: names, the numpy dtypes carpool holds them in, and wire sizes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from carpool.datatypes import DATATYPES, datatype_of, element_size

NUMERIC = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}


def test_datatypes_map_every_v2_name_to_the_dtype_carpool_holds_it_in() -> None:
    expected: dict[str, np.dtype[Any]] = {name: np.dtype(t) for name, t in NUMERIC.items()}
    expected |= {"BF16": np.dtype(np.float32), "BYTES": np.dtype(object)}
    assert dict(DATATYPES) == expected
    with pytest.raises(TypeError):
        DATATYPES["FP8"] = np.dtype(np.uint8)  # type: ignore[index]  # read-only on purpose


@pytest.mark.parametrize(("name", "dtype"), NUMERIC.items())
def test_datatype_of_names_every_numeric_dtype(name: str, dtype: type) -> None:
    assert datatype_of(np.zeros(2, dtype=dtype)) == name


def test_datatype_of_ignores_byte_order() -> None:
    assert datatype_of(np.zeros(2, dtype=">i4")) == "INT32"
    assert datatype_of(np.zeros(2, dtype=">f8")) == "FP64"


@pytest.mark.parametrize("array", [np.array([b"a"]), np.array(["a"]), np.array([b"a"], object)])
def test_datatype_of_calls_object_bytes_and_str_arrays_bytes(array: np.ndarray[Any, Any]) -> None:
    assert datatype_of(array) == "BYTES"


def test_datatype_of_knows_ml_dtypes_bfloat16() -> None:
    import ml_dtypes

    assert datatype_of(np.zeros(2, dtype=ml_dtypes.bfloat16)) == "BF16"


@pytest.mark.parametrize("dtype", [np.complex64, "datetime64[s]", np.dtype("V4")])
def test_datatype_of_refuses_dtypes_without_a_v2_name(dtype: Any) -> None:
    with pytest.raises(TypeError, match="has no v2 datatype"):
        datatype_of(np.zeros(2, dtype=dtype))


def test_element_size_is_the_wire_size() -> None:
    sizes = {name: element_size(name) for name in DATATYPES}
    assert sizes == {
        "BOOL": 1,
        "UINT8": 1,
        "UINT16": 2,
        "UINT32": 4,
        "UINT64": 8,
        "INT8": 1,
        "INT16": 2,
        "INT32": 4,
        "INT64": 8,
        "FP16": 2,
        "FP32": 4,
        "FP64": 8,
        "BF16": 2,
        "BYTES": None,
    }
    with pytest.raises(ValueError, match="unknown datatype 'fp32'"):
        element_size("fp32")
