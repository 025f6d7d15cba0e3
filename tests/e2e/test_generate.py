"""Step-wise models over REST on a real ``carpool serve``: Triton's generate extension
(``generate`` whole, ``generate_stream`` as server-sent events over raw httpx), ``infer``
answered whole, errors before and after the first event, a client that closes its stream
freeing the slot, and the metrics, statistics and config a step-wise model shows."""

from __future__ import annotations

import json
import re
import threading
from typing import Any

import httpx
import pytest

from server.conftest import Launcher, Server, json_tensor, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(serve_module: Launcher) -> Server:
    return serve_module("step_models:words")


def events(response: httpx.Response) -> list[dict[str, Any]]:
    """The ``data:`` events of a server-sent event stream, each as JSON."""
    text = response.read().decode()
    assert text.endswith("\n\n"), text
    chunks = [c for c in text.split("\n\n") if c]
    assert all(c.startswith("data: ") for c in chunks), text
    return [json.loads(c[len("data: ") :]) for c in chunks]


def metric(server: Server, name: str) -> float:
    text = server.http.get("/metrics").text
    found = re.search(rf'^{name}{{model="words"}} (\S+)$', text, re.M)
    assert found is not None, text
    return float(found.group(1))


def test_generate_answers_the_whole_text(server: Server) -> None:
    response = server.http.post(
        "/v2/models/words/generate", json={"text_input": "one two three", "id": "7"}
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {
        "model_name": "words",
        "model_version": "1",
        "id": "7",
        "text_output": "one two three",
    }


def test_generate_stream_sends_an_event_per_step(server: Server) -> None:
    with server.http.stream(
        "POST", "/v2/models/words/versions/1/generate_stream", json={"text_input": "a b c"}
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
        got = events(response)
    assert [e["text_output"] for e in got] == ["a", "b", "c"]
    assert {(e["model_name"], e["model_version"]) for e in got} == {("words", "1")}


def test_infer_on_a_step_wise_model_answers_each_row_whole(server: Server) -> None:
    body = {"inputs": [json_tensor("text_input", "BYTES", [2, 1], ["x y z", "p q"])]}
    response = server.http.post("/v2/models/words/infer", json=body)
    assert response.status_code == 200, response.text
    (output,) = response.json()["outputs"]
    assert output == {
        "name": "text_output",
        "datatype": "BYTES",
        "shape": [2, 1],
        "data": ["x y z", "p q"],
    }


def test_parameters_reach_the_model_and_a_bad_one_is_a_400(server: Server) -> None:
    ok = server.http.post(
        "/v2/models/words/generate", json={"text_input": "a b", "parameters": {"delay_ms": 1}}
    )
    assert ok.json()["text_output"] == "a b"
    as_field = server.http.post(
        "/v2/models/words/generate", json={"text_input": "a", "delay_ms": -1}
    )
    assert as_field.status_code == 400
    assert as_field.json() == {"error": "delay_ms must be a number >= 0, got -1"}
    streamed = server.http.post(
        "/v2/models/words/generate_stream", json={"text_input": " ", "parameters": {}}
    )
    assert streamed.status_code == 400
    assert streamed.json() == {"error": "text_input holds no word"}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"[1]", "the body must be a JSON object"),
        (b"{", "the body is not JSON"),
        (b'{"parameters": 3}', "parameters must be a JSON object"),
    ],
)
def test_bad_bodies_are_400s(server: Server, body: bytes, message: str) -> None:
    response = server.http.post("/v2/models/words/generate", content=body)
    assert response.status_code == 400
    assert message in response.json()["error"]


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
    with server.http.stream("POST", "/v2/models/words/generate_stream", json=body) as response:
        first = next(response.iter_lines())
        assert first == 'data: {"model_name":"words","model_version":"1","text_output":"w0"}'
        assert metric(server, "carpool_active_sequences") == 1.0
    wait_until(
        lambda: metric(server, "carpool_active_sequences") == 0.0,
        "the closed stream's slot freed",
        within=10.0,
    )
    assert (
        server.http.post("/v2/models/words/generate", json={"text_input": "ok"}).status_code == 200
    )


def test_streams_share_steps(server: Server) -> None:
    before = server.http.get("/v2/models/words/stats").json()["model_stats"][0]
    results: list[list[str]] = [[] for _ in range(4)]

    def one(i: int) -> None:
        body = {"text_input": " ".join(f"s{i}w{j}" for j in range(20)), "delay_ms": 5}
        with httpx.stream("POST", f"{server.url}/v2/models/words/generate_stream", json=body) as r:
            results[i] = [e["text_output"] for e in events(r)]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [[f"s{i}w{j}" for j in range(20)] for i in range(4)]
    after = server.http.get("/v2/models/words/stats").json()["model_stats"][0]
    assert after["inference_count"] - before["inference_count"] == 4
    steps = after["execution_count"] - before["execution_count"]
    assert 20 <= steps < 80  # 80 outputs in fewer steps: the sequences shared them


def test_config_metadata_and_metrics_of_a_step_wise_model(server: Server) -> None:
    config = server.http.get("/v2/models/words/config").json()
    assert config["model_transaction_policy"] == {"decoupled": True}
    assert config["parameters"]["max_sequences"] == {"string_value": "4"}
    assert "dynamic_batching" not in config
    server.http.post("/v2/models/words/generate", json={"text_input": "m n"})
    text = server.http.get("/metrics").text
    for name in (
        "carpool_time_to_first_output_seconds_count",
        "carpool_time_per_output_seconds_count",
        "carpool_step_sequences_count",
    ):
        found = re.search(rf'^{name}{{model="words"}} (\S+)$', text, re.M)
        assert found is not None, name
        assert float(found.group(1)) >= 1, name
    assert metric(server, "carpool_active_sequences") == 0.0


def test_generate_on_an_unknown_model_is_a_404(server: Server) -> None:
    response = server.http.post("/v2/models/nope/generate_stream", json={"text_input": "a"})
    assert response.status_code == 404


def test_sigterm_lets_short_streams_finish_and_ends_long_ones_with_an_error_event(
    serve: Launcher,
) -> None:
    server = serve("step_models:words", "--drain-timeout", "1.5")
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


def test_keys_guard_the_generate_routes(serve: Launcher) -> None:
    server = serve("step_models:words", "--api-key", "sesame")
    body = {"text_input": "a b"}
    refused = server.http.post("/v2/models/words/generate_stream", json=body)
    assert refused.status_code == 401
    with server.http.stream(
        "POST",
        "/v2/models/words/generate_stream",
        json=body,
        headers={"authorization": "Bearer sesame"},
    ) as response:
        assert [e["text_output"] for e in events(response)] == ["a", "b"]
