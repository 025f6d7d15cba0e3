"""The error table end to end: every way a request can go wrong, sent over raw HTTP (httpx)
to a real server. Each gets its status, an error body that is exactly
``{"error": "<message>"}``, and a server that is still live afterwards.

tritonclient refuses to send most of these, so the bodies are written by hand. The table
itself is :mod:`carpool.server.statuses` (unit-tested in ``test_statuses.py``).
"""

from __future__ import annotations

import gzip
import json
import socket
import zlib
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from server.conftest import Launcher, Server, float_request, json_tensor, wait_until

BODY_LIMIT = 65536
QUEUE_LIMIT = 2
NEGATIVE = "model error: ValueError: negative input is not allowed"


@pytest.fixture(scope="module")
def server(serve_module: Launcher, tmp_path_factory: pytest.TempPathFactory) -> Server:
    config = tmp_path_factory.mktemp("config") / "carpool.toml"
    config.write_text("[models.pair]\npriority_levels = 3\n")
    return serve_module(
        "models:pair",
        "models:identity",
        "models:flaky",
        "models:wrong_rows",
        "models:wrong_shape",
        "--config",
        str(config),
        "--max-body-bytes",
        str(BODY_LIMIT),
    )


@pytest.fixture(scope="module")
def limited(serve_module: Launcher) -> Server:
    """A gated model whose queue holds QUEUE_LIMIT rows."""
    return serve_module(
        "models:gated", "--max-batch-size", "8", "--max-queue-size", str(QUEUE_LIMIT)
    )


def assert_error(server: Server, response: httpx.Response, status: int, message: str) -> str:
    """``response`` is ``status`` with an error JSON containing ``message``; server still live."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = json.loads(response.content)
    assert list(body) == ["error"], body
    error = body["error"]
    assert isinstance(error, str)
    assert error
    assert message in error
    assert server.is_live()
    return error


def pair_request(**extra: Any) -> dict[str, Any]:
    return {
        "inputs": [
            json_tensor("INPUT0", "FP32", [1, 4], [1.0, 2.0, 3.0, 4.0]),
            json_tensor("INPUT1", "INT64", [1, 4], [1, 2, 3, 4]),
        ],
        **extra,
    }


def int_request(*rows: list[int], **extra: Any) -> dict[str, Any]:
    flat = [v for row in rows for v in row]
    return {"inputs": [json_tensor("INPUT0", "INT64", [len(rows), len(rows[0])], flat)], **extra}


def test_pair_request_is_valid(server: Server) -> None:
    response = server.infer("pair", pair_request())
    assert response.status_code == 200, response.text
    assert [o["data"] for o in response.json()["outputs"]] == [[2, 4, 6, 8], [2, 4, 6, 8]]


# ---------------------------------------------------------------- request body and JSON


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"inputs": [', "failed to parse the request JSON"),
        (b"", "failed to parse the request JSON"),
        (b"\xff\xfe", "failed to parse the request JSON"),
        (b"[1, 2]", "the request body must be a JSON object"),
        (b"{}", "Unable to parse 'inputs': expected an array"),
        (b'{"inputs": {"name": "INPUT0"}}', "Unable to parse 'inputs': expected an array"),
        (b'{"inputs": [1]}', "Unable to parse 'inputs[0]': expected an object"),
        (b'{"id": 5, "inputs": []}', "Unable to parse 'id': expected a string"),
    ],
    ids=["truncated", "empty", "not-utf8", "array", "no-inputs", "inputs-object", "input-int",
         "id-int"],
)  # fmt: skip
def test_malformed_body_is_400(server: Server, body: bytes, message: str) -> None:
    response = server.http.post("/v2/models/pair/infer", content=body)
    assert_error(server, response, 400, message)


def test_missing_required_input_is_400(server: Server) -> None:
    doc = pair_request()
    del doc["inputs"][1]
    error = assert_error(server, server.infer("pair", doc), 400, "")
    assert error == (
        "expected 2 inputs but got 1 inputs for model 'pair'. Got input(s) ['INPUT0'], "
        "but missing required input(s) ['INPUT1']"
    )


def test_unknown_input_name_is_400(server: Server) -> None:
    doc = pair_request()
    doc["inputs"].append(json_tensor("EXTRA", "FP32", [1, 1], [0.0]))
    assert_error(server, server.infer("pair", doc), 400, "unexpected inference input(s) ['EXTRA']")
    renamed = {"inputs": [json_tensor("X", "FP32", [1, 1], [0.0])]}
    assert_error(server, server.infer("identity", renamed), 400, "['X']")


def test_duplicate_input_name_is_400(server: Server) -> None:
    doc = pair_request()
    doc["inputs"][1] = dict(doc["inputs"][0])
    assert_error(server, server.infer("pair", doc), 400, "input 'INPUT0' already exists")


def test_wrong_datatype_is_400(server: Server) -> None:
    doc = pair_request()
    doc["inputs"][1] = json_tensor("INPUT1", "FP32", [1, 4], [1.0, 2.0, 3.0, 4.0])
    assert_error(
        server,
        server.infer("pair", doc),
        400,
        "inference input 'INPUT1' data-type is 'FP32', but model 'pair' expects 'INT64'",
    )


@pytest.mark.parametrize(
    ("datatype", "data", "message"),
    [
        ("INT64", [1.5, 2, 3, 4], "INT64 needs integers"),
        ("INT64", ["1", 2, 3, 4], "INT64 needs integers"),
        ("INT64", [2**63, 2, 3, 4], "INT64 needs integers in"),
        ("INT64", [True, 2, 3, 4], "INT64 needs integers"),
    ],
    ids=["float", "string", "overflow", "bool"],
)
def test_data_of_the_wrong_json_type_is_400(
    server: Server, datatype: str, data: list[Any], message: str
) -> None:
    doc = pair_request()
    doc["inputs"][1] = json_tensor("INPUT1", datatype, [1, 4], data)
    assert_error(server, server.infer("pair", doc), 400, message)


@pytest.mark.parametrize("data", [[1, 2, 3], [1, 2, 3, 4, 5], [[1, 2], [3]]])
def test_data_count_not_matching_shape_is_400(server: Server, data: list[Any]) -> None:
    doc = pair_request()
    doc["inputs"][1] = json_tensor("INPUT1", "INT64", [1, 4], data)
    assert_error(server, server.infer("pair", doc), 400, "INPUT1")


def test_shape_not_matching_the_declared_model_is_400(server: Server) -> None:
    doc = pair_request()
    doc["inputs"][0] = json_tensor("INPUT0", "FP32", [1, 5], [0.0] * 5)
    assert_error(
        server,
        server.infer("pair", doc),
        400,
        "unexpected shape for input 'INPUT0' for model 'pair'. Expected [-1,4], got [1,5]",
    )
    doc["inputs"][0] = json_tensor("INPUT0", "FP32", [4], [0.0] * 4)  # no batch dimension
    assert_error(server, server.infer("pair", doc), 400, "'INPUT0'")


def test_inputs_disagreeing_on_rows_is_400(server: Server) -> None:
    doc = pair_request()
    doc["inputs"][0] = json_tensor("INPUT0", "FP32", [2, 4], [0.0] * 8)
    assert_error(server, server.infer("pair", doc), 400, "inputs disagree on the batch size")


def test_zero_rows_is_400(server: Server) -> None:
    doc = {"inputs": [json_tensor("INPUT0", "FP32", [0, 3], [])]}
    assert_error(server, server.infer("identity", doc), 400, "batch dimension must be at least 1")


@pytest.mark.parametrize("shape", [[-1, 4], [1, -4], [1.0, 4], ["1", 4], [True, 4], "14", None])
def test_bad_shape_is_400(server: Server, shape: Any) -> None:
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": shape, "data": [0.0] * 4}]}
    assert_error(server, server.infer("identity", doc), 400, "Unable to parse 'shape'")


@pytest.mark.parametrize("datatype", ["FP8", "fp32", "STRING", "", None, 7])
def test_unknown_datatype_is_400(server: Server, datatype: Any) -> None:
    doc = {"inputs": [{"name": "INPUT0", "datatype": datatype, "shape": [1], "data": [0]}]}
    assert_error(server, server.infer("identity", doc), 400, "invalid datatype")


def test_duplicate_output_names_are_400(server: Server) -> None:
    doc = pair_request(outputs=[{"name": "SUM"}, {"name": "SUM"}])
    assert_error(server, server.infer("pair", doc), 400, "output 'SUM' already exists in request")


def test_unknown_output_is_400(server: Server) -> None:
    doc = pair_request(outputs=[{"name": "NOPE"}])
    assert_error(
        server, server.infer("pair", doc), 400, "unexpected inference output 'NOPE' for model"
    )


def test_data_and_binary_size_both_set_is_400(server: Server) -> None:
    doc = {"inputs": [json_tensor("INPUT0", "FP32", [1], [1.0])]}
    doc["inputs"][0]["parameters"] = {"binary_data_size": 4}
    body = json.dumps(doc).encode()
    response = server.http.post(
        "/v2/models/identity/infer",
        content=body + b"\0\0\0\0",
        headers={"Inference-Header-Content-Length": str(len(body))},
    )
    assert_error(server, response, 400, "Input must set only one of the following fields")


# ---------------------------------------------------------------- parameters


@pytest.mark.parametrize("name", ["sequence_id", "sequence_start", "sequence_end"])
@pytest.mark.parametrize("value", [1, "session", True])
def test_sequence_parameters_are_400(server: Server, name: str, value: Any) -> None:
    response = server.infer("pair", pair_request(parameters={name: value}))
    assert_error(server, response, 400, f"parameter '{name}': model 'pair' is stateless")


@pytest.mark.parametrize("priority", [0, 1, 3])
def test_priority_within_levels_is_accepted(server: Server, priority: int) -> None:
    response = server.infer("pair", pair_request(parameters={"priority": priority}))
    assert response.status_code == 200, response.text


def test_priority_beyond_levels_is_400(server: Server) -> None:
    response = server.infer("pair", pair_request(parameters={"priority": 4}))
    assert_error(server, response, 400, "parameter 'priority' must be in [0, 3]")


@pytest.mark.parametrize("name", ["priority", "timeout"])
@pytest.mark.parametrize("value", [-1, 1.5, "1", True])
def test_priority_and_timeout_of_the_wrong_type_are_400(
    server: Server, name: str, value: Any
) -> None:
    response = server.infer("pair", pair_request(parameters={name: value}))
    assert_error(server, response, 400, f"parameter '{name}' must be a non-negative integer")


@pytest.mark.parametrize("value", [[1], {"a": 1}, None])
def test_parameter_values_must_be_scalars(server: Server, value: Any) -> None:
    response = server.infer("pair", pair_request(parameters={"custom": value}))
    assert_error(server, response, 400, "'custom' must be a string, number or boolean")


def test_custom_parameters_are_accepted(server: Server) -> None:
    response = server.infer("pair", pair_request(parameters={"custom": "x", "n": 1.5}))
    assert response.status_code == 200, response.text


# ---------------------------------------------------------------- routes and methods


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v2/models/nope/infer"),
        ("GET", "/v2/models/nope"),
        ("GET", "/v2/models/nope/ready"),
        ("GET", "/v2/models/nope/config"),
        ("GET", "/v2/models/nope/stats"),
        ("GET", "/v2/models/nope/versions/1"),
    ],
)
def test_unknown_model_is_404(server: Server, method: str, path: str) -> None:
    response = server.http.request(method, path, json=pair_request())
    error = assert_error(server, response, 404, "")
    assert error == "Request for unknown model: 'nope' is not found"


@pytest.mark.parametrize("suffix", ["/infer", "", "/ready", "/config", "/stats"])
def test_unknown_version_is_404(server: Server, suffix: str) -> None:
    method = "POST" if suffix == "/infer" else "GET"
    path = f"/v2/models/pair/versions/7{suffix}"
    response = server.http.request(method, path, json=pair_request())
    error = assert_error(server, response, 404, "")
    assert error == "Request for unknown model: 'pair' version '7' is not found"


def test_explicit_version_is_served(server: Server) -> None:
    response = server.http.post("/v2/models/pair/versions/1/infer", json=pair_request())
    assert response.status_code == 200, response.text
    assert response.json()["model_version"] == "1"


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("GET", "/v2/models/pair/infer", "POST"),
        ("PUT", "/v2/models/pair/infer", "POST"),
        ("POST", "/v2/health/live", "GET"),
        ("POST", "/v2/health/ready", "GET"),
        ("DELETE", "/v2", "GET"),
        ("POST", "/v2/models/pair", "GET"),
        ("POST", "/v2/models/pair/ready", "GET"),
        ("POST", "/v2/models/pair/config", "GET"),
        ("PATCH", "/v2/models/stats", "GET"),
        ("PUT", "/metrics", "GET"),
    ],
)
def test_wrong_method_is_405(server: Server, method: str, path: str, allowed: str) -> None:
    response = server.http.request(method, path)
    error = assert_error(server, response, 405, "")
    assert error == "Method Not Allowed"
    assert response.headers["allow"] == allowed


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/v0/models/pair",  # /v1 is OpenAI's (test_openai.py)
        "/v3",
        "/v2/nothing",
        "/v2/health",
        "/v2/health/dead",
        "/v2/models",
        "/v2/models/pair/infer/more",
        "/v2/models/pair/bogus",
        "/v2/models/pair/versions/1/bogus",
        "/metrics/more",
    ],
)
def test_unknown_path_is_404(server: Server, path: str) -> None:
    for method in ("GET", "POST"):
        response = server.http.request(method, path)
        assert_error(server, response, 404, "Not Found")


def test_http_1_0_without_host(server: Server) -> None:
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.0\r\n\r\n")
        response = b""
        while chunk := sock.recv(65536):
            response += chunk
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0].split(b" ")[1] == b"200"
    assert json.loads(body) == {"live": True}


# ---------------------------------------------------------------- sizes


def test_body_over_the_limit_is_413(server: Server) -> None:
    response = server.http.post("/v2/models/pair/infer", content=b" " * (BODY_LIMIT + 1))
    assert_error(server, response, 413, f"exceeds the limit of {BODY_LIMIT} bytes")


def test_streamed_body_over_the_limit_is_413(server: Server) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer encoding
        for _ in range(4):
            yield b" " * (BODY_LIMIT // 2)

    response = server.http.post("/v2/models/pair/infer", content=chunks())
    assert_error(server, response, 413, f"exceeds the limit of {BODY_LIMIT} bytes")


def test_body_at_the_limit_is_accepted(server: Server) -> None:
    body = json.dumps(pair_request()).encode()
    response = server.http.post(
        "/v2/models/pair/infer", content=body + b" " * (BODY_LIMIT - len(body))
    )
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("shape", [[2**40, 2**40], [2**62, 4], [2**63, 1], [2**64]])
def test_element_count_overflow_is_400(server: Server, shape: list[int]) -> None:
    doc = {"inputs": [json_tensor("INPUT0", "FP32", shape, [1.0])]}
    response = server.infer("identity", doc)
    message = "Unable to parse 'shape'" if shape == [2**64] else "exceed maximum size"
    assert_error(server, response, 400, message)


def test_element_count_over_the_server_limit_is_413(server: Server) -> None:
    doc = {"inputs": [json_tensor("INPUT0", "FP32", [2**31 + 1], [1.0])]}
    assert_error(server, server.infer("identity", doc), 413, "over this server's limit")


# ---------------------------------------------------------------- binary framing


def binary_body(*, size: int = 8) -> bytes:
    doc = {
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "FP32",
                "shape": [1, 2],
                "parameters": {"binary_data_size": size},
            }
        ]
    }
    return json.dumps(doc).encode()


def post_binary(server: Server, content: bytes, header: str | None) -> httpx.Response:
    headers = {} if header is None else {"Inference-Header-Content-Length": header}
    return server.http.post("/v2/models/identity/infer", content=content, headers=headers)


def test_binary_request_is_valid(server: Server) -> None:
    head = binary_body()
    response = post_binary(server, head + b"\0" * 8, str(len(head)))
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("abc", "Unable to parse Inference-Header-Content-Length, got: abc"),
        ("", "Unable to parse Inference-Header-Content-Length"),
        ("12.5", "Unable to parse Inference-Header-Content-Length"),
        ("0x10", "Unable to parse Inference-Header-Content-Length"),
        ("-5", "inference header size should be in range"),
        ("100000", "inference header size should be in range"),
        (str(2**31), "inference header size should be in range"),
        ("9" * 20, "inference header size should be in range"),
        ("9" * 40, "Unable to parse Inference-Header-Content-Length"),
    ],
)
def test_bad_header_length_is_400(server: Server, header: str, message: str) -> None:
    head = binary_body()
    assert_error(server, post_binary(server, head + b"\0" * 8, header), 400, message)


def test_fewer_bytes_than_declared_is_400(server: Server) -> None:
    head = binary_body()
    response = post_binary(server, head + b"\0" * 5, str(len(head)))
    assert_error(
        server, response, 400, "unexpected size for input 'INPUT0', expecting 3 additional bytes"
    )


def test_trailing_bytes_are_400(server: Server) -> None:
    head = binary_body()
    response = post_binary(server, head + b"\0" * 11, str(len(head)))
    assert_error(server, response, 400, "unexpected additional input data: 3 bytes")


def test_binary_size_not_matching_shape_is_400(server: Server) -> None:
    head = binary_body(size=12)
    response = post_binary(server, head + b"\0" * 12, str(len(head)))
    assert_error(
        server, response, 400, "input byte size mismatch for input 'INPUT0'. Expected 8, got 12"
    )


def test_binary_input_without_the_header_is_400(server: Server) -> None:
    response = post_binary(server, binary_body(), None)
    assert_error(server, response, 400, "must specify valid 'Inference-Header-Content-Length'")


def test_header_shorter_than_the_json_is_400(server: Server) -> None:
    head = binary_body()
    response = post_binary(server, head + b"\0" * 8, str(len(head) - 3))
    assert_error(server, response, 400, "failed to parse the request JSON")


def test_raw_binary_request(server: Server) -> None:
    """Header length 0: the body is the one input's bytes (a batch of one row)."""
    import numpy as np

    x = np.array([1.5, -2.0, 3.25], np.float32)
    response = post_binary(server, x.tobytes(), "0")
    assert response.status_code == 200, response.text
    split = int(response.headers["inference-header-content-length"])
    header = json.loads(response.content[:split])
    assert header["outputs"][0]["shape"] == [1, 3]
    assert np.frombuffer(response.content[split:], np.float32).tolist() == x.tolist()
    multi = server.http.post(
        "/v2/models/pair/infer",
        content=b"\0" * 16,
        headers={"Inference-Header-Content-Length": "0"},
    )
    assert_error(server, multi, 400, "raw binary request needs a model with exactly 1 input")


# ---------------------------------------------------------------- the model misbehaves


def test_model_exception_fails_only_the_requests_that_caused_it(
    server: Server, threads: ThreadPoolExecutor
) -> None:
    """A held request keeps the worker busy while good and bad requests queue into one
    window; when it ends they run as one batch, and only the bad ones get 500."""
    good = {i: int_request([10 * i, 10 * i + 1]) for i in range(4)}
    bad = {i: int_request([5, -i - 1]) for i in range(2)}
    with server.gate_closed("flaky"):
        held = threads.submit(server.infer_alone, "flaky", int_request([100, 101]))
        server.wait_started("flaky", 1)
        futures: dict[str, Future[httpx.Response]] = {}
        for i in range(4):
            futures[f"good{i}"] = threads.submit(server.infer_alone, "flaky", good[i])
            if i < 2:
                futures[f"bad{i}"] = threads.submit(server.infer_alone, "flaky", bad[i])
        wait_until(lambda: server.stats("flaky")["pending"] == 7, "7 flaky requests pending")
        # A malformed request in the same window is refused at the door, never queued.
        malformed = {"inputs": [json_tensor("INPUT0", "INT64", [1, 2], [1])]}
        assert_error(server, server.infer("flaky", malformed), 400, "INPUT0")
        assert server.stats("flaky")["pending"] == 7
    assert held.result().json()["outputs"][0]["data"] == [101, 102]
    for i in range(4):
        response = futures[f"good{i}"].result()
        assert response.status_code == 200, response.text
        assert response.json()["outputs"][0]["data"] == [10 * i + 1, 10 * i + 2]
    for i in range(2):
        error = assert_error(server, futures[f"bad{i}"].result(), 500, "")
        assert error == NEGATIVE
    assert server.batches_started("flaky")[:2] == [1, 6]  # the six shared one batch
    after = server.infer("flaky", int_request([7, 8]))
    assert after.json()["outputs"][0]["data"] == [8, 9]
    stats = server.stats("flaky")
    assert stats["inference_stats"]["success"]["count"] == 6
    assert stats["inference_stats"]["fail"]["count"] == 2
    assert stats["pending"] == 0


def test_wrong_row_count_is_500_and_the_server_keeps_serving(server: Server) -> None:
    response = server.infer("wrong_rows", int_request([1, 2], [3, 4]))
    error = assert_error(server, response, 500, "model error: ")
    assert "returned 3 rows" in error
    assert "a batch of 2 rows" in error
    assert "Traceback" not in error
    again = server.infer("identity", int_request([1, 2]))
    assert again.status_code == 200


def test_output_not_matching_its_declared_shape_is_500(server: Server) -> None:
    """Metadata promises OUTPUT0 rows of [4]; a model returning rows of [3] broke that
    promise, which is the server's error to report, not a 200 contradicting the metadata."""
    doc = {"inputs": [json_tensor("INPUT0", "FP32", [2, 4], [0.5] * 8)]}
    error = assert_error(server, server.infer("wrong_shape", doc), 500, "model error: ")
    assert "OUTPUT0" in error
    assert server.infer("identity", int_request([1, 2])).status_code == 200


def test_refused_requests_are_counted_by_outcome(server: Server) -> None:
    """Every infer request shows up in ``carpool_requests_total`` under its outcome,
    including those refused before the body was parsed."""

    def count(outcome: str) -> float:
        pattern = f'carpool_requests_total{{model="pair",outcome="{outcome}",protocol="http"}} '
        for line in server.metrics().splitlines():
            if line.startswith(pattern):
                return float(line.split()[-1])
        return 0.0

    before = {o: count(o) for o in ("success", "invalid", "too_large")}
    assert server.infer("pair", pair_request()).status_code == 200
    assert server.infer("pair", {"inputs": 1}).status_code == 400
    framing = server.http.post(
        "/v2/models/pair/infer", content=b"{}", headers={"Inference-Header-Content-Length": "x"}
    )
    assert framing.status_code == 400
    large = server.http.post("/v2/models/pair/infer", content=b" " * (BODY_LIMIT + 1))
    assert large.status_code == 413
    after = {o: count(o) for o in before}
    assert {o: after[o] - before[o] for o in before} == {
        "success": 1,
        "invalid": 2,
        "too_large": 1,
    }


# ---------------------------------------------------------------- queue limits


def test_queue_full_is_503_at_once(limited: Server, threads: ThreadPoolExecutor) -> None:
    with limited.gate_closed("gated"):
        held = threads.submit(limited.infer_alone, "gated", float_request(0.0))
        limited.wait_queued("gated", pending=1, queued_rows=0)
        queued = [
            threads.submit(limited.infer_alone, "gated", float_request(v)) for v in (1.0, 2.0)
        ]
        limited.wait_queued("gated", pending=3, queued_rows=QUEUE_LIMIT)
        # answered while the model is still blocked: refused at the door, not after it
        for doc in (
            float_request(3.0),
            {"inputs": [json_tensor("INPUT0", "FP32", [3, 1], [1, 2, 3])]},
        ):
            response = limited.infer("gated", doc)
            assert_error(limited, response, 503, "Exceeds maximum queue size")
            assert response.headers["retry-after"] == "1"
        assert limited.stats("gated")["pending"] == 3
    for future, value in zip([held, *queued], (0.0, 1.0, 2.0), strict=True):
        response = future.result()
        assert response.status_code == 200, response.text
        assert response.json()["outputs"][0]["data"] == [value]
    stats = limited.stats("gated")
    assert (stats["pending"], stats["queued_rows"]) == (0, 0)


def test_request_timeout_expires_while_queued(limited: Server, threads: ThreadPoolExecutor) -> None:
    started = len(limited.batches_started("gated"))
    with limited.gate_closed("gated"):
        held = threads.submit(limited.infer_alone, "gated", float_request(5.0))
        limited.wait_started("gated", started + 1)
        # 20 ms, in microseconds as Triton's `timeout` parameter is; the gate holds far longer
        response = limited.infer("gated", float_request(6.0, parameters={"timeout": 20_000}))
        assert_error(limited, response, 503, "Request timeout expired")
        assert response.headers["retry-after"] == "1"
    assert held.result().json()["outputs"][0]["data"] == [5.0]
    assert len(limited.batches_started("gated")) == started + 1  # it never ran


def test_default_timeout_applies_and_cannot_be_extended(
    serve: Launcher, threads: ThreadPoolExecutor
) -> None:
    # The held request is subject to the default too: 250 ms leaves it ample time to start.
    server = serve("models:gated", "--default-timeout-ms", "250")
    config = server.get_json("/v2/models/gated/config")["dynamic_batching"]
    assert config["default_queue_policy"] == {
        "timeout_action": "REJECT",
        "default_timeout_microseconds": 250_000,
        "allow_timeout_override": True,
    }
    with server.gate_closed("gated"):
        held = threads.submit(server.infer_alone, "gated", float_request(1.0))
        server.wait_started("gated", 1)
        # none, 0 (Triton: none) and 10 minutes all mean the default 250 ms
        for parameters in ({}, {"timeout": 0}, {"timeout": 600_000_000}):
            response = server.infer("gated", float_request(2.0, parameters=parameters))
            assert_error(
                server, response, 503, "Request timeout expired: timeout_ms=250 passed while queued"
            )
    # carpool's deadlines also cover a running batch (README: stage "running")
    assert_error(server, held.result(), 503, "timeout_ms=250 passed while its batch was running")
    assert server.batches_started("gated") == [1]


def test_a_client_that_disconnects_while_queued_is_withdrawn(
    limited: Server, threads: ThreadPoolExecutor
) -> None:
    """Its request leaves the queue and never runs; nobody waits for an answer no one reads."""
    started = len(limited.batches_started("gated"))
    with limited.gate_closed("gated"):
        held = threads.submit(limited.infer_alone, "gated", float_request(7.0))
        limited.wait_queued("gated", pending=1, queued_rows=0)
        body = json.dumps(float_request(8.0)).encode()
        head = (
            "POST /v2/models/gated/infer HTTP/1.1\r\nHost: x\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        with socket.create_connection(("127.0.0.1", limited.port)) as sock:
            sock.sendall(head.encode() + body)
            limited.wait_queued("gated", pending=2, queued_rows=1)
        wait_until(
            lambda: limited.stats("gated")["pending"] == 1, "the request to be withdrawn", 5.0
        )
    assert held.result().json()["outputs"][0]["data"] == [7.0]
    assert len(limited.batches_started("gated")) == started + 1


def test_pipelined_requests_of_a_client_that_leaves_are_withdrawn(
    limited: Server, threads: ThreadPoolExecutor
) -> None:
    """Two requests pipelined on one connection, then the connection closes while the first
    waits in the queue: it is withdrawn, and the second never reaches the model."""
    started = len(limited.batches_started("gated"))
    with limited.gate_closed("gated"):
        held = threads.submit(limited.infer_alone, "gated", float_request(7.0))
        limited.wait_queued("gated", pending=1, queued_rows=0)
        pipelined = b""
        for value in (8.0, 9.0):
            body = json.dumps(float_request(value)).encode()
            pipelined += (
                "POST /v2/models/gated/infer HTTP/1.1\r\nHost: x\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode() + body
        with socket.create_connection(("127.0.0.1", limited.port)) as sock:
            sock.sendall(pipelined)
            limited.wait_queued("gated", pending=2, queued_rows=1)
        wait_until(
            lambda: limited.stats("gated")["pending"] == 1, "the request to be withdrawn", 5.0
        )
    assert held.result().json()["outputs"][0]["data"] == [7.0]
    assert len(limited.batches_started("gated")) == started + 1  # 8.0 and 9.0 never ran
    assert limited.stats("gated")["pending"] == 0


# ---------------------------------------------------------------- compressed bodies


def test_a_gzip_bomb_is_stopped_at_the_body_limit(server: Server) -> None:
    bomb = gzip.compress(b" " * (BODY_LIMIT * 64))  # ~4 MiB of spaces in a few KiB
    assert len(bomb) < BODY_LIMIT
    response = server.http.post(
        "/v2/models/pair/infer", content=bomb, headers={"Content-Encoding": "gzip"}
    )
    assert_error(server, response, 413, "(after decompression)")


@pytest.mark.parametrize(
    ("encoding", "content", "status", "message"),
    [
        ("br", b"{}", 415, "Content-Encoding 'br' is not supported"),
        ("gzip", b"not gzip at all", 400, "cannot decompress the gzip body"),
        ("gzip", gzip.compress(b'{"inputs": []}')[:-4], 400, "cannot decompress the gzip body"),
        ("deflate", zlib.compress(b"{") + b"trailing", 400, "cannot decompress the deflate"),
    ],
)
def test_bad_compressed_bodies(
    server: Server, encoding: str, content: bytes, status: int, message: str
) -> None:
    response = server.http.post(
        "/v2/models/pair/infer", content=content, headers={"Content-Encoding": encoding}
    )
    assert_error(server, response, status, message)


def test_nan_and_infinity_travel_as_json_tokens_both_ways(server: Server) -> None:
    """Triton's JSON takes and gives bare NaN/Infinity (perf_analyzer's JSON mode sends them);
    an ordinary body still goes through orjson, and the answer writes them the same way."""
    body = (
        b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], '
        b'"data": [NaN, Infinity, -Infinity, 2.5]}]}'
    )
    response = server.http.post("/v2/models/identity/infer", content=body)
    assert response.status_code == 200, response.text
    assert b'"data":[NaN,Infinity,-Infinity,2.5]' in response.content.replace(b" ", b"")
    (output,) = json.loads(response.content)["outputs"]
    assert str(output["data"]) == "[nan, inf, -inf, 2.5]"


def test_rows_and_texts_per_request_are_capped_with_errors_naming_the_setting(
    serve: Launcher, tmp_path: Path
) -> None:
    config = tmp_path / "carpool.toml"
    config.write_text("[server]\nmax_client_batch_size = 3\n[models.lengths]\nopenai = true\n")
    server = serve(
        "models:add_one", "models:lengths", "--max-batch-size", "4", "--config", str(config)
    )
    rows = {"inputs": [json_tensor("INPUT0", "FP32", [17, 1], [1.0] * 17)]}
    response = server.infer("add_one", rows)
    assert response.status_code == 400
    assert response.json() == {
        "error": "inference request batch-size must be <= 16 for 'add_one': it holds 17 rows; "
        "send fewer, or raise max_rows_per_request (--max-rows-per-request)"
    }
    rows["inputs"][0].update(shape=[16, 1], data=[1.0] * 16)
    assert server.infer("add_one", rows).json()["outputs"][0]["data"] == [2.0] * 16
    texts = {"model": "lengths", "input": ["a", "bb", "ccc", "dddd"]}
    response = httpx.post(f"{server.url}/v1/embeddings", json=texts)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "too_many_inputs"
    assert "--max-client-batch-size" in response.json()["error"]["message"]
    texts["input"] = texts["input"][:3]
    assert httpx.post(f"{server.url}/v1/embeddings", json=texts).status_code == 200
    assert server.is_live()


@pytest.mark.parametrize("name", ["Inference-Header-Content-Length", "Content-Encoding"])
def test_a_body_header_sent_twice_is_400(server: Server, name: str) -> None:
    body = json.dumps(float_request(1.0)).encode()
    head = (
        f"POST /v2/models/identity/infer HTTP/1.1\r\nHost: c\r\nContent-Length: {len(body)}\r\n"
        f"{name}: {len(body)}\r\n{name}: 0\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(head + body)
        received = b""
        while b"\r\n\r\n" not in received or not received.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    status_line, _, rest = received.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 400 ")
    message = json.loads(rest.partition(b"\r\n\r\n")[2])["error"]
    assert message == f"the {name.lower()} header came more than once; send it once"
    assert server.is_live()
