"""The v2 datatype names, the numpy dtypes carpool holds them in, and their sizes on the wire.
BF16 has no numpy dtype, so it is held as float32 and converted on the wire. Numpy only."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["DATATYPES", "FIXED_DTYPES", "STRING_KINDS", "datatype_of", "element_size"]

#: The v2 datatype names and the numpy dtype carpool holds each in (BF16 as float32).
DATATYPES: Mapping[str, np.dtype[Any]] = MappingProxyType(
    {
        "BOOL": np.dtype(np.bool_),
        "UINT8": np.dtype(np.uint8),
        "UINT16": np.dtype(np.uint16),
        "UINT32": np.dtype(np.uint32),
        "UINT64": np.dtype(np.uint64),
        "INT8": np.dtype(np.int8),
        "INT16": np.dtype(np.int16),
        "INT32": np.dtype(np.int32),
        "INT64": np.dtype(np.int64),
        "FP16": np.dtype(np.float16),
        "FP32": np.dtype(np.float32),
        "FP64": np.dtype(np.float64),
        "BF16": np.dtype(np.float32),
        "BYTES": np.dtype(np.object_),
    }
)

#: The datatypes of fixed element size, with their numpy dtypes (all but BF16 and BYTES).
FIXED_DTYPES = {name: dtype for name, dtype in DATATYPES.items() if name not in ("BF16", "BYTES")}
_BY_KIND = {(dtype.kind, dtype.itemsize): name for name, dtype in FIXED_DTYPES.items()}
STRING_KINDS = "OSUT"  # object, bytes, str, and numpy 2's StringDType


def datatype_of(array: npt.NDArray[Any]) -> str:
    """The v2 datatype name for an array's dtype; object, bytes and str arrays are BYTES.

    Raises ``TypeError`` for dtypes the protocol has no name for (complex, datetime, ...).
    """
    dtype = array.dtype
    if dtype.kind in STRING_KINDS:
        return "BYTES"
    if dtype.name == "bfloat16":
        return "BF16"
    name = _BY_KIND.get((dtype.kind, dtype.itemsize))
    if name is None:
        raise TypeError(
            f"numpy dtype {dtype} has no v2 datatype; use bool, (u)int8-64, float16/32/64, "
            "or an object/bytes/str array for BYTES"
        )
    return name


def element_size(datatype: str) -> int | None:
    """Bytes per element on the wire (BF16: 2); ``None`` for BYTES, whose elements vary.

    Raises ``ValueError`` for an unknown datatype name.
    """
    if datatype == "BYTES":
        return None
    if datatype == "BF16":
        return 2
    dtype = FIXED_DTYPES.get(datatype)
    if dtype is None:
        raise ValueError(f"unknown datatype {datatype!r}; expected one of {', '.join(DATATYPES)}")
    return dtype.itemsize
