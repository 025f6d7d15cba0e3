"""tritonclient's own request encoder and response decoder against carpool's parser and
encoder: what the real client sends parses, and what carpool answers, the client reads."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from carpool.server.messages import OutputTensor, RequestedOutput, wants_binary
from carpool.server.rest.codec import encode_infer_response, parse_infer_request
from server.conftest import BF16, SAMPLES, output_tensor

LIMIT = 1 << 20


def triton_array(datatype: str) -> np.ndarray[Any, Any]:
    if datatype == "BF16":
        import ml_dtypes

        return BF16.astype(ml_dtypes.bfloat16)
    return SAMPLES[datatype]


# tritonclient refuses to send BF16 as JSON, so that pair is not a case.
TRITON_CASES = [(d, b) for d in [*SAMPLES, "BF16"] for b in (True, False) if d != "BF16" or b]


@pytest.mark.parametrize(("datatype", "binary"), TRITON_CASES)
def test_tritonclient_request_and_response_round_trip(datatype: str, binary: bool) -> None:
    import tritonclient.http as httpclient

    array = triton_array(datatype)
    given = httpclient.InferInput("INPUT0", list(array.shape), datatype)
    given.set_data_from_numpy(array, binary_data=binary)
    wanted = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary or datatype == "BF16")]
    body, json_size = httpclient.InferenceServerClient.generate_request_body(
        [given], outputs=wanted, request_id="abc", priority=3, timeout=5000
    )
    parsed = parse_infer_request(body, json_size, max_elements=LIMIT)
    assert parsed.id == "abc"
    assert parsed.parameters == {"priority": 3, "timeout": 5000}
    (only,) = parsed.inputs
    assert (only.name, only.datatype, only.shape) == ("INPUT0", datatype, (2, 3))
    expected = array.astype(np.float32) if datatype == "BF16" else array
    assert only.data.tolist() == expected.tolist()
    (requested,) = parsed.outputs or ()
    assert requested == RequestedOutput("OUTPUT0", binary or datatype == "BF16", {})

    reply = OutputTensor("OUTPUT0", only.datatype, only.shape, only.data)
    out_body, header_length = encode_infer_response(
        model_name="m",
        model_version="1",
        request_id=parsed.id,
        outputs=[(reply, wants_binary(parsed, requested))],
    )
    result = httpclient.InferenceServerClient.parse_response_body(
        out_body, header_length=header_length
    )
    got = result.as_numpy("OUTPUT0")
    assert result.get_response()["id"] == "abc"
    if datatype == "BYTES" and not binary:  # tritonclient gives str for JSON BYTES
        assert got.tolist() == [[item.decode() for item in row] for row in array]
    else:
        assert got.dtype == array.dtype
        if array.dtype == object:
            assert got.reshape(array.shape).tolist() == array.tolist()
        else:  # bit-exact, signed zeros included
            assert got.reshape(array.shape).tobytes() == array.tobytes()


def test_tritonclient_default_asks_for_every_output_binary() -> None:
    import tritonclient.http as httpclient

    given = httpclient.InferInput("INPUT0", [2], "INT32")
    given.set_data_from_numpy(np.array([5, 6], np.int32))
    body, json_size = httpclient.InferenceServerClient.generate_request_body([given])
    parsed = parse_infer_request(body, json_size, max_elements=LIMIT)
    assert parsed.outputs is None
    assert parsed.binary_data_output is True
    assert parsed.id is None
    assert wants_binary(parsed, None) is True


def test_tritonclient_reads_nan_from_a_json_response() -> None:
    import tritonclient.http as httpclient

    values = np.array([np.nan, np.inf, -1.0], np.float32)
    body, length = encode_infer_response(
        model_name="m",
        model_version=None,
        request_id=None,
        outputs=[(output_tensor("Y", "FP32", values), False)],
    )
    got = httpclient.InferenceServerClient.parse_response_body(body, header_length=length)
    assert np.array_equal(got.as_numpy("Y"), values, equal_nan=True)
