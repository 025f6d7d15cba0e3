"""The v2 records and their error: ``ProtocolError``, ``wants_binary`` and ``blame``."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest

from carpool.errors import CarpoolError
from carpool.server.messages import (
    InferRequest,
    ProtocolError,
    RequestedOutput,
    blame,
    wants_binary,
)

# -- ProtocolError -------------------------------------------------------------------------


def test_protocol_error_is_a_carpool_value_error_with_field_and_status() -> None:
    error = ProtocolError("bad shape", field="inputs[0].shape")
    assert isinstance(error, CarpoolError)
    assert isinstance(error, ValueError)
    assert (str(error), error.field, error.status) == ("bad shape", "inputs[0].shape", 400)


@pytest.mark.parametrize(
    "clone", [lambda e: pickle.loads(pickle.dumps(e)), copy.copy, copy.deepcopy]
)
def test_protocol_error_survives_pickling_and_copying(clone: Any) -> None:
    error = ProtocolError("too big", field="INPUT0", status=413)
    again = clone(error)
    assert type(again) is ProtocolError
    assert (str(again), again.field, again.status) == ("too big", "INPUT0", 413)


# -- wants_binary --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_level", "per_output", "expected"),
    [
        (False, None, False),
        (True, None, True),
        (True, False, False),
        (False, True, True),
        (True, True, True),
        (False, False, False),
    ],
)
def test_wants_binary_per_output_overrides_request(
    request_level: bool, per_output: bool | None, expected: bool
) -> None:
    parsed = InferRequest(None, {}, (), None, request_level)
    assert wants_binary(parsed, RequestedOutput("Y", per_output, {})) is expected
    assert wants_binary(parsed, None) is request_level


# -- blame ---------------------------------------------------------------------------------


def test_blame_turns_a_codec_value_error_into_a_400_naming_the_field() -> None:
    with pytest.raises(ProtocolError) as info, blame("INPUT0"):
        raise ValueError("bad data")
    assert (str(info.value), info.value.field, info.value.status) == ("bad data", "INPUT0", 400)
    assert info.value.__cause__ is None
    assert info.value.__suppress_context__


def test_blame_turns_a_codec_type_error_into_a_500() -> None:
    with pytest.raises(ProtocolError) as info, blame("OUTPUT0"):
        raise TypeError("a complex128 array cannot be sent as FP32")
    assert (info.value.field, info.value.status) == ("OUTPUT0", 500)


def test_blame_keeps_a_protocol_error_and_lets_other_errors_through() -> None:
    original = ProtocolError("too big", field="body", status=413)
    with pytest.raises(ProtocolError) as info, blame("INPUT0"):
        raise original
    assert info.value is original
    with pytest.raises(KeyError), blame("INPUT0"):
        raise KeyError("x")
