"""The v2 records and their error: ``ProtocolError``, ``wants_binary`` and ``blame``."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import numpy as np
import pytest

from carpool.errors import CarpoolError
from carpool.server.messages import (
    InferRequest,
    ProtocolError,
    RequestedOutput,
    blame,
    check_requested_output,
    claim_name,
    input_tensor,
    refuse_shared_memory,
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


# -- the checks every decoder shares ------------------------------------------------------


def test_input_tensor_shapes_the_data_read_only() -> None:
    tensor = input_tensor("X", "INT32", (2, 2), np.arange(4, dtype=np.int32), {"k": 1})
    assert (tensor.shape, tensor.data.shape, tensor.parameters) == ((2, 2), (2, 2), {"k": 1})
    assert not tensor.data.flags.writeable


def test_a_second_tensor_of_one_name_is_refused_in_triton_s_words() -> None:
    taken: set[str] = set()
    claim_name("X", taken, "output", "outputs[0]")
    with pytest.raises(ProtocolError) as info:
        claim_name("X", taken, "output", "outputs[1]")
    assert (info.value.detail, info.value.field) == (
        "output 'X' already exists in request",
        "outputs[1].name",
    )


def test_shared_memory_and_classification_are_refused_naming_the_field() -> None:
    refuse_shared_memory("input", "X", "inputs[0]", {"binary_data_size": 4})  # no region: fine
    with pytest.raises(ProtocolError) as info:
        refuse_shared_memory("input", "X", "inputs[0]", {"shared_memory_region": "r"})
    assert info.value.field == "inputs[0].parameters"
    assert "shared memory is not supported by this server (input 'X')" in info.value.detail
    check_requested_output("Y", {"binary_data": True}, "outputs[0]")
    with pytest.raises(ProtocolError) as info:
        check_requested_output("Y", {"shared_memory_region": "r"}, "outputs[0]")
    assert "(output 'Y')" in info.value.detail
    with pytest.raises(ProtocolError) as info:
        check_requested_output("Y", {"classification": 2}, "outputs[0]")
    assert info.value.field == "outputs[0].parameters.classification"
