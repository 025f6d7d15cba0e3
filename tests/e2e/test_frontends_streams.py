"""A step-wise model on ``carpool serve --frontends 2``, its StepBatcher the main process's:
generate_stream (an event per step, through either front end) and gRPC's ModelStreamInfer (a
response per step), infer and generate answered whole, parameters and their 400s, a model's
error as an event, a closed stream's slot freed, metrics and statistics, and the drain: each
as one process does."""

from __future__ import annotations

import json
import re
import threading
from typing import Any

import grpc
import httpx
import pytest
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from e2e.test_frontends import FRONTENDS, connections, front_ends
from e2e.test_generate import events
from e2e.test_grpc_streams import flagged, request, streamed
from server.conftest import Launcher, Server, json_tensor, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(serve_module: Launcher) -> Server:
    return serve_module("step_models:words", *FRONTENDS, grpc=True)


def metric(server: Server, name: str) -> float:
    text = server.http.get("/metrics").text
    found = re.search(rf'^{name}{{model="words"}} (\S+)$', text, re.M)
    assert found is not None, text
    return float(found.group(1))


def sse(raw: bytes) -> list[dict[str, Any]]:
    chunks = [c for c in raw.decode().split("\n\n") if c]
    assert all(c.startswith("data: ") for c in chunks), raw
    return [json.loads(c[len("data: ") :]) for c in chunks]


def test_each_front_end_streams_one_event_per_step(server: Server) -> None:
    assert sorted(front_ends(server)) == [1, 2]
    for index in (1, 2):
        (conn,) = connections(server, index, 1)
        body = json.dumps({"text_input": f"front {index} end"})
        conn.request("POST", "/v2/models/words/generate_stream", body)
        response = conn.getresponse()
        assert response.status == 200
        assert response.getheader("content-type") == "text/event-stream; charset=utf-8"
        got = sse(response.read())
        assert [e.get("text_output", e) for e in got] == ["front", str(index), "end"]
        assert {(e["model_name"], e["model_version"]) for e in got} == {("words", "1")}


def test_grpc_streams_a_response_per_step_through_the_front_ends(server: Server) -> None:
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        responses = streamed(stub, request("x", "a b c", delay_ms=1))
        (broken,) = streamed(stub, request("y", "boom"))
    assert [flagged(r) for r in responses] == [
        ("x", ["a"], False),
        ("x", ["b"], False),
        ("x", ["c"], True),
    ]
    assert broken.error_message == "model error: ValueError: the word 'boom' breaks its sequence"


def test_parameters_reach_the_model_and_a_bad_one_is_a_400(server: Server) -> None:
    ok = server.http.post(
        "/v2/models/words/generate", json={"text_input": "a b", "parameters": {"delay_ms": 1}}
    )
    assert ok.json()["text_output"] == "a b"
    for route in ("generate", "generate_stream"):
        bad = server.http.post(
            f"/v2/models/words/{route}", json={"text_input": "a", "delay_ms": -1}
        )
        assert bad.status_code == 400
        assert bad.json() == {"error": "delay_ms must be a number >= 0, got -1"}
    empty = server.http.post("/v2/models/words/generate_stream", json={"text_input": " "})
    assert empty.status_code == 400
    assert empty.json() == {"error": "text_input holds no word"}


def test_infer_and_generate_answer_whole(server: Server) -> None:
    body = {"inputs": [json_tensor("text_input", "BYTES", [2, 1], ["x y z", "p q"])]}
    response = server.http.post("/v2/models/words/infer", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"] == [
        {"name": "text_output", "datatype": "BYTES", "shape": [2, 1], "data": ["x y z", "p q"]}
    ]
    whole = server.http.post("/v2/models/words/generate", json={"text_input": "one two", "id": "7"})
    assert whole.json() == {
        "model_name": "words",
        "model_version": "1",
        "id": "7",
        "text_output": "one two",
    }


def test_an_error_after_the_first_event_arrives_as_an_event(server: Server) -> None:
    with server.http.stream(
        "POST", "/v2/models/words/generate_stream", json={"text_input": "a boom c"}
    ) as response:
        assert response.status_code == 200
        got = events(response)
    assert got == [
        {"model_name": "words", "model_version": "1", "text_output": "a"},
        {"error": "model error: ValueError: the word 'boom' breaks its sequence"},
    ]


def test_a_client_that_closes_its_stream_frees_the_slot(server: Server) -> None:
    long = " ".join(f"w{i}" for i in range(2000))
    body = {"text_input": long, "parameters": {"delay_ms": 5}}
    with httpx.stream("POST", f"{server.url}/v2/models/words/generate_stream", json=body) as r:
        lines = r.iter_lines()  # held: a dropped iterator closes the connection when collected
        first = next(lines)
        assert first == 'data: {"model_name":"words","model_version":"1","text_output":"w0"}'
        assert metric(server, "carpool_active_sequences") == 1.0
    wait_until(
        lambda: metric(server, "carpool_active_sequences") == 0.0,
        "the closed stream's slot freed",
        within=10.0,
    )
    after = server.http.post("/v2/models/words/generate", json={"text_input": "ok"})
    assert after.json()["text_output"] == "ok"


def test_metrics_and_statistics_count_as_one_process_does(serve: Launcher) -> None:
    server = serve("step_models:words", *FRONTENDS)
    for index in (1, 2):  # a stream through each front end
        (conn,) = connections(server, index, 1)
        conn.request("POST", "/v2/models/words/generate_stream", json.dumps({"text_input": "a b"}))
        assert [e["text_output"] for e in sse(conn.getresponse().read())] == ["a", "b"]
    whole = server.http.post("/v2/models/words/generate", json={"text_input": "c d e"})
    assert whole.status_code == 200
    refused = server.http.post(
        "/v2/models/words/generate", json={"text_input": "f", "delay_ms": -1}
    )
    assert refused.status_code == 400
    body = {"inputs": [json_tensor("text_input", "BYTES", [2, 1], ["x y", "p"])]}
    assert server.http.post("/v2/models/words/infer", json=body).status_code == 200
    for index in (1, 2):  # whichever front end is asked: 5 sequences, a refusal is no failure
        (conn,) = connections(server, index, 1)
        conn.request("GET", "/v2/models/words/stats")
        stats = json.loads(conn.getresponse().read())["model_stats"][0]
        assert stats["inference_count"] == 5
        assert stats["inference_stats"]["success"]["count"] == 5
        assert stats["inference_stats"]["fail"]["count"] == 0
    for protocol, outcome, count in (
        ("generate", "success", 3),
        ("generate", "invalid", 1),
        ("http", "success", 1),
    ):
        labels = {"model": "words", "outcome": outcome, "protocol": protocol}
        assert server.metric("carpool_requests_total", **labels) == count
    assert server.metric("carpool_time_to_first_output_seconds_count", model="words") == 5
    assert server.metric("carpool_time_per_output_seconds_count", model="words") == 5
    assert server.metric("carpool_active_sequences", model="words") == 0


def test_sigterm_lets_short_streams_finish_and_ends_long_ones_with_an_error_event(
    serve: Launcher,
) -> None:
    server = serve("step_models:words", *FRONTENDS, "--drain-timeout", "1.5")
    short = {"text_input": "a b c", "parameters": {"delay_ms": 100}}
    long = {"text_input": " ".join(f"w{i}" for i in range(500)), "parameters": {"delay_ms": 100}}
    got: dict[str, list[dict[str, Any]]] = {}

    def read(name: str, body: dict[str, Any]) -> None:
        with httpx.stream("POST", f"{server.url}/v2/models/words/generate_stream", json=body) as r:
            got[name] = events(r)

    readers = [
        threading.Thread(target=read, args=item) for item in (("short", short), ("long", long))
    ]
    for reader in readers:
        reader.start()
    wait_until(
        lambda: metric(server, "carpool_active_sequences") == 2.0, "both aboard", within=10.0
    )
    server.terminate()
    for reader in readers:
        reader.join(30)
    assert [e["text_output"] for e in got["short"]] == ["a", "b", "c"]
    *words, last = got["long"]
    assert [e["text_output"] for e in words] == [f"w{i}" for i in range(len(words))]
    assert "error" in last
    assert server.wait_exit() == 0
