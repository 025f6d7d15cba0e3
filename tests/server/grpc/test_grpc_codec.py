"""``grpc_codec``: Triton's gRPC messages to carpool's records and back, no server.

Requests are built the way tritonclient.grpc builds them (its ``InferInput`` and
``_get_inference_request``), and by hand for the typed ``contents`` fields it never sends.
"""

from __future__ import annotations

import tracemalloc
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc._utils import _get_inference_request
from tritonclient.utils import deserialize_bytes_tensor

from carpool.datatypes import DATATYPES
from carpool.server.grpc.codec import (
    CONTENTS,
    decode_infer_request,
    encode_infer_response,
    model_config,
    model_statistics,
    repository_index,
)
from carpool.server.messages import ProtocolError
from server.conftest import BF16, SAMPLES, output_tensor, wire

LIMIT = 2**31


def tritonclient_request(inputs: list[Any], **kwargs: Any) -> Any:
    """The ``ModelInferRequest`` tritonclient.grpc sends for ``inputs``."""
    options: dict[str, Any] = {
        "model_name": "m",
        "model_version": "",
        "request_id": "",
        "outputs": None,
        "sequence_id": 0,
        "sequence_start": False,
        "sequence_end": False,
        "priority": 0,
        "timeout": None,
        "parameters": None,
    }
    options.update(kwargs)
    return _get_inference_request(inputs=inputs, **options)


def raw_input(name: str, datatype: str, array: np.ndarray[Any, Any]) -> Any:
    tensor = triton.InferInput(name, list(array.shape), datatype)
    if datatype == "BF16":
        tensor._raw_content = wire("BF16", array)  # tritonclient wants ml_dtypes for BF16
        tensor._input.ClearField("contents")
    else:
        tensor.set_data_from_numpy(array)
    return tensor


@pytest.mark.parametrize("datatype", [*sorted(SAMPLES), "BF16"])
def test_raw_inputs_of_every_datatype_decode_as_sent(datatype: str) -> None:
    array = BF16 if datatype == "BF16" else SAMPLES[datatype]
    message = tritonclient_request([raw_input("X", datatype, array)], request_id="r1")
    request = decode_infer_request(message, max_elements=LIMIT)
    (tensor,) = request.inputs
    assert (request.id, tensor.name, tensor.datatype, tensor.shape) == (
        "r1",
        "X",
        datatype,
        array.shape,
    )
    assert not tensor.data.flags.writeable
    if datatype == "BYTES":
        assert tensor.data.tolist() == array.tolist()
    else:
        assert np.array_equal(tensor.data, array)
    assert request.outputs is None  # every output


@pytest.mark.parametrize("datatype", sorted(CONTENTS))
def test_typed_contents_of_every_datatype_decode_as_sent(datatype: str) -> None:
    array = SAMPLES[datatype]
    message = pb.ModelInferRequest(model_name="m")
    tensor = message.inputs.add(name="X", datatype=datatype, shape=array.shape)
    getattr(tensor.contents, CONTENTS[datatype]).extend(array.reshape(-1).tolist())
    (decoded,) = decode_infer_request(message, max_elements=LIMIT).inputs
    if datatype == "BYTES":
        assert decoded.data.tolist() == array.tolist()
    else:
        assert decoded.data.dtype == array.dtype
        assert np.array_equal(decoded.data, array)


@pytest.mark.parametrize("datatype", ["FP32", "FP64"])
def test_float_contents_are_read_as_their_bytes_bit_for_bit(datatype: str) -> None:
    dtype = np.float32 if datatype == "FP32" else np.float64
    special = [np.nan, -np.inf, np.inf, -0.0, 0.0, 1e-45, -3.5, 2.0**100]
    array = np.array(special + list(range(1000)), dtype=dtype)
    message = pb.ModelInferRequest(model_name="m")
    tensor = message.inputs.add(name="X", datatype=datatype, shape=[array.size])
    getattr(tensor.contents, CONTENTS[datatype]).extend(array.tolist())
    (decoded,) = decode_infer_request(message, max_elements=LIMIT).inputs
    assert decoded.data.dtype == dtype
    assert decoded.data.tobytes() == array.tobytes()


@pytest.mark.parametrize("datatype", ["FP32", "INT32", "BYTES"])
def test_typed_contents_cost_their_array_not_a_python_object_per_element(datatype: str) -> None:
    # The array itself, and for floats the serialized contents it is a view of; a list of
    # Python numbers first (24-32 bytes each) cost ~9x the message.
    count = 1_000_000
    message = pb.ModelInferRequest(model_name="m")
    tensor = message.inputs.add(name="X", datatype=datatype, shape=[count])
    field = getattr(tensor.contents, CONTENTS[datatype])
    field.extend([b"ab"] * count if datatype == "BYTES" else np.arange(count).astype(np.int32))
    tracemalloc.start()
    try:
        (decoded,) = decode_infer_request(message, max_elements=LIMIT).inputs
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    bound = {  # what the decoding must allocate, per element
        "FP32": 4 + 4,  # the serialized contents, and the array (a view of them)
        "INT32": 8 + 4,  # read as int64 (no wrapping), then the array
        "BYTES": 8 + 35,  # the array's pointers, and each element as a bytes object
    }[datatype]
    assert decoded.data.size == count
    assert peak < 1.2 * bound * count


def refusal(message: Any, max_elements: int = LIMIT) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        decode_infer_request(message, max_elements=max_elements)
    return info.value


def typed(datatype: str, shape: list[int], field: str, values: list[Any]) -> Any:
    message = pb.ModelInferRequest(model_name="m")
    tensor = message.inputs.add(name="X", datatype=datatype, shape=shape)
    getattr(tensor.contents, field).extend(values)
    return message


@pytest.mark.parametrize(
    ("message", "field", "words"),
    [
        (typed("INT8", [1], "int_contents", [200]), "X", "INT8 needs integers in [-128, 127]"),
        (typed("UINT16", [1], "uint_contents", [70000]), "X", "got 70000"),
        (typed("FP32", [3], "fp32_contents", [1.0]), "X", "holds 1 elements but the shape needs 3"),
        (typed("FP32", [1], "int_contents", [1]), "X", "travels in 'fp32_contents'"),
        (typed("FP16", [1], "fp32_contents", [1.0]), "X", "FP16 has no typed contents field"),
        (typed("FP99", [1], "fp32_contents", [1.0]), "inputs[0].datatype", "invalid datatype"),
        (typed("FP32", [-1], "fp32_contents", [1.0]), "inputs[0].shape", "Unable to parse 'shape'"),
    ],
    ids=["int8-range", "uint16-range", "count", "wrong-field", "fp16", "datatype", "shape"],
)
def test_typed_contents_refused_naming_the_field(message: Any, field: str, words: str) -> None:
    error = refusal(message)
    assert (error.status, error.field) == (400, field)
    assert words in str(error)


def test_raw_contents_must_cover_every_input_and_only_them() -> None:
    x = raw_input("X", "FP32", np.ones((1, 2), np.float32))
    y = raw_input("Y", "FP32", np.ones((1, 2), np.float32))
    message = tritonclient_request([x, y])
    del message.raw_input_contents[1]
    assert refusal(message).field == "raw_input_contents"
    both = tritonclient_request([x])
    both.inputs[0].contents.fp32_contents.extend([1.0, 1.0])
    error = refusal(both)
    assert (error.field, "sets 'contents'" in str(error)) == ("X", True)
    short = tritonclient_request([x])
    short.raw_input_contents[0] = b"\0" * 4
    assert "input byte size mismatch for input 'X'. Expected 8, got 4" in str(refusal(short))


def test_duplicates_shared_memory_and_the_element_limit_are_refused() -> None:
    x = raw_input("X", "FP32", np.ones((2, 3), np.float32))
    assert "already exists" in str(refusal(tritonclient_request([x, x])))
    message = tritonclient_request([x])
    message.inputs[0].parameters["shared_memory_region"].string_param = "r"
    assert "shared memory is not supported" in str(refusal(message))
    error = refusal(tritonclient_request([x]), max_elements=5)
    assert (error.status, error.field) == (413, "inputs[0].shape")


def test_parameters_and_requested_outputs_come_through() -> None:
    x = raw_input("X", "FP32", np.ones((1, 1), np.float32))
    outputs = [triton.InferRequestedOutput("B"), triton.InferRequestedOutput("A")]
    message = tritonclient_request(
        [x], outputs=outputs, priority=2, timeout=1500, parameters={"custom": "yes", "k": 1.5}
    )
    request = decode_infer_request(message, max_elements=LIMIT)
    assert request.parameters == {"priority": 2, "timeout": 1500, "custom": "yes", "k": 1.5}
    assert [(o.name, o.binary) for o in request.outputs or ()] == [("B", True), ("A", True)]
    assert "already exists" in str(refusal(tritonclient_request([x], outputs=outputs * 2)))


def test_sequence_parameters_arrive_for_admit_to_refuse() -> None:
    x = raw_input("X", "FP32", np.ones((1, 1), np.float32))
    message = tritonclient_request([x], sequence_id=7, sequence_start=True)
    parameters = decode_infer_request(message, max_elements=LIMIT).parameters
    assert (parameters["sequence_id"], parameters["sequence_start"]) == (7, True)


@pytest.mark.parametrize("datatype", [*sorted(SAMPLES), "BF16"])
def test_outputs_are_raw_in_order_as_tritonclient_reads_them(datatype: str) -> None:
    array = BF16 if datatype == "BF16" else SAMPLES[datatype]
    response = encode_infer_response(
        model_name="m",
        model_version="1",
        request_id="r",
        outputs=[output_tensor("OUT", datatype, array), output_tensor("N", "INT32", np.arange(3))],
    )
    assert (response.model_name, response.model_version, response.id) == ("m", "1", "r")
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
        ("OUT", datatype, list(array.shape)),
        ("N", "INT32", [3]),
    ]
    assert not any(o.HasField("contents") for o in response.outputs)
    assert response.raw_output_contents[0] == wire(datatype, array)
    result = triton.InferResult(response)
    got = result.as_numpy("OUT")
    if datatype == "BYTES":
        assert deserialize_bytes_tensor(response.raw_output_contents[0]).tolist() == (
            array.reshape(-1).tolist()
        )
        assert got.tolist() == array.tolist()
    elif datatype != "BF16":  # tritonclient reads BF16 only with ml_dtypes' help
        assert np.array_equal(got, array)
    assert result.as_numpy("N").tolist() == [0, 1, 2]


def test_an_output_unlike_its_datatype_is_a_server_error() -> None:
    with pytest.raises(ProtocolError) as info:
        encode_infer_response(
            model_name="m",
            model_version=None,
            request_id=None,
            outputs=[output_tensor("OUT", "INT32", np.array([0.5]))],
        )
    assert (info.value.status, info.value.field) == (500, "OUT")


def test_documents_become_tritons_messages() -> None:
    config = model_config(
        {
            "name": "m",
            "max_batch_size": 8,
            "version_policy": {"specific": {"versions": ["v2"]}},  # not a number: left out
            "input": [{"name": "X", "data_type": "TYPE_STRING", "dims": [-1]}],
            "dynamic_batching": {"policy": "eager", "max_queue_size": 5},
        }
    ).config
    assert (config.name, config.max_batch_size, config.input[0].dims) == ("m", 8, [-1])
    assert not config.HasField("version_policy")
    assert config.dynamic_batching.default_queue_policy.max_queue_size == 5
    stats = model_statistics([{"name": "m", "inference_count": 9, "pending": 3}]).model_stats
    assert (stats[0].name, stats[0].inference_count) == ("m", 9)
    index = repository_index([{"name": "m", "version": "1", "state": "READY", "reason": ""}])
    assert [(m.name, m.state) for m in index.models] == [("m", "READY")]


def test_every_datatype_has_a_typed_field_but_the_16_bit_floats() -> None:
    assert set(CONTENTS) == set(DATATYPES) - {"FP16", "BF16"}
