"""The fault matrix (docs/reliability.md): each fault a test with an exact expected outcome.

Every case ends in :func:`assert_accounting`: the server is live, and for every model
``/metrics`` satisfies received = completed + failed + expired + cancelled + rejected +
in flight. Every client request's outcome is recorded (its status, or ``CLOSED`` for a
connection error) and each request has exactly one; where the server counted the same
requests by outcome, the two counts are compared. An answer is counted once: under its
model (``carpool_requests_total``), or, when it has none (refused before its model was
known, or no inference at all), the server's (``carpool_server_requests_total``).

Faults already covered elsewhere are referenced, not repeated: header and body timeouts
(slowloris) in ``test_connection_limits.py``, NaN and Inf in ``test_error_responses.py`` and
``test_rest_codec.py``, drain past its deadline in ``test_shutdown.py``.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import struct
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

from server.conftest import Launcher, Server, float_request, json_tensor, wait_until

from .test_frontends import connections

OUTCOMES = ("completed", "failed", "expired", "cancelled", "rejected")
CLOSED = "connection error"  # a request that got no HTTP answer, only a broken connection
MAX_BODY = 1_000_000  # a nesting bomb of depth 100,000 fits
SOCKET_TIMEOUT_S = 30.0
_SAMPLE = re.compile(r'^(carpool_\w+)\{model="([^"]+)"(?:,outcome="([^"]+)")?[^}]*\} (\S+)$', re.M)
_OWN = re.compile(
    r'^carpool_server_requests_total\{outcome="([^"]+)",protocol="(\w+)"\} (\S+)$', re.M
)


def scrape(server: Server) -> dict[str, Counter[str]]:
    """Per model: the batcher's ``received``, its outcomes, ``in_flight``, and the server's
    answers by outcome (``http:success``, ... summed over nothing else)."""
    counts: dict[str, Counter[str]] = {}
    for name, model, outcome, value in _SAMPLE.findall(server.metrics()):
        count = counts.setdefault(model, Counter())
        number = int(float(value))
        if name == "carpool_batcher_received_total":
            count["received"] += number
        elif name == "carpool_batcher_requests_total":
            count[outcome] += number
        elif name == "carpool_requests_in_flight":
            count["in_flight"] += number
        elif name == "carpool_requests_total":
            count[f"answered:{outcome}"] += number
    return counts


def assert_accounting(server: Server) -> dict[str, Counter[str]]:
    """The server is live and every model's requests are accounted for exactly."""
    assert server.is_live()
    counts = scrape(server)
    assert counts, "no model in /metrics"
    for model, count in counts.items():
        parts = sum(count[o] for o in OUTCOMES) + count["in_flight"]
        assert count["received"] == parts, f"{model}: {dict(count)}"
    return counts


def delta(
    after: dict[str, Counter[str]], before: dict[str, Counter[str]], model: str
) -> Counter[str]:
    """What changed for ``model`` between two scrapes, zeros left out."""
    change = Counter(after[model])
    change.subtract(before.get(model, Counter()))
    return nonzero(change)


def nonzero(counts: Counter[str]) -> Counter[str]:
    return Counter({key: n for key, n in counts.items() if n})


@pytest.fixture(scope="module")
def server(serve_module: Launcher) -> Server:
    models = ["models:wrong_dtype", "models:not_numbers", "models:expand", "models:add_one"]
    return serve_module(*models, "models:upper", "--max-body-bytes", str(MAX_BODY))


def connect(server: Server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=SOCKET_TIMEOUT_S)
    sock.settimeout(SOCKET_TIMEOUT_S)
    return sock


def request_head(model: str, length: int, **headers: str) -> bytes:
    lines = [f"POST /v2/models/{model}/infer HTTP/1.1", "Host: carpool"]
    lines += [f"Content-Length: {length}", "Content-Type: application/json"]
    lines += [f"{key.replace('_', '-')}: {value}" for key, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def send(server: Server, model: str, doc: Any) -> socket.socket:
    """A connection that has sent one whole JSON request to ``model``."""
    body = json.dumps(doc).encode()
    sock = connect(server)
    sock.sendall(request_head(model, len(body)) + body)
    return sock


def status_of(sock: socket.socket) -> int | str:
    """The status of the response on ``sock`` (read through its head), or ``CLOSED``."""
    head = b""
    try:
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(65536)
            if not chunk:
                return CLOSED
            head += chunk
    except ConnectionError:
        return CLOSED
    finally:
        sock.close()
    return int(head.split(b" ", 2)[1])


def outcome_of(call: Any) -> int | str:
    try:
        response: httpx.Response = call()
    except httpx.TransportError:
        return CLOSED
    return response.status_code


# -- a model's wrong output -----------------------------------------------------------------


def test_a_float64_output_declared_fp32_is_cast(server: Server) -> None:
    before = scrape(server)
    values = (1.5, -2.0, 0.25)  # exact in FP32 and FP64
    for value in values:
        response = server.infer("wrong_dtype", float_request(value))
        assert response.status_code == 200, response.text
        (output,) = response.json()["outputs"]
        assert (output["datatype"], output["data"]) == ("FP32", [value * 2])
    change = delta(assert_accounting(server), before, "wrong_dtype")
    assert change == {"received": 3, "completed": 3, "answered:success": 3}


def test_a_non_numeric_output_declared_fp32_fails_only_its_own_request(
    server: Server, threads: ThreadPoolExecutor
) -> None:
    """One batch of two: the row the model answered with a string gets a 500 naming the
    model and output; its neighbour in the batch gets its number. The batcher completed both
    (the model returned); the server answered one 500."""
    before = scrape(server)
    started = len(server.batches_started("not_numbers"))
    with server.gate_closed("not_numbers"):
        first = threads.submit(server.infer_alone, "not_numbers", float_request(1.0))
        server.wait_started("not_numbers", started + 1)
        good = threads.submit(server.infer_alone, "not_numbers", float_request(2.0))
        bad = threads.submit(server.infer_alone, "not_numbers", float_request(-1.0))
        server.wait_queued("not_numbers", pending=3, queued_rows=2)
    assert first.result().json()["outputs"][0]["data"] == [2.0]
    assert good.result().json()["outputs"][0]["data"] == [4.0]
    assert bad.result().status_code == 500
    assert bad.result().json() == {
        "error": "model error: model 'not_numbers' returned output 'OUTPUT0' of object that "
        "is not FP32: could not convert string to float: 'not a number'"
    }
    assert server.batches_started("not_numbers")[started:] == [1, 2]
    change = delta(assert_accounting(server), before, "not_numbers")
    assert change == {
        "received": 3, "completed": 3, "answered:success": 2, "answered:error": 1
    }  # fmt: skip


# -- clients that go away or stop reading ---------------------------------------------------


def test_a_client_that_disconnects_mid_body_reaches_no_model(server: Server) -> None:
    before = scrape(server)
    body = json.dumps(float_request(1.0)).encode()
    with connect(server) as sock:
        sock.sendall(request_head("add_one", len(body)) + body[: len(body) // 2])
    wait_until(
        lambda: delta(scrape(server), before, "add_one")["answered:client_closed"] == 1,
        "the disconnect to be counted",
    )
    assert server.infer("add_one", float_request(1.0)).json()["outputs"][0]["data"] == [2.0]
    change = delta(assert_accounting(server), before, "add_one")
    assert change == {
        "received": 1,
        "completed": 1,
        "answered:success": 1,
        "answered:client_closed": 1,
    }


def test_a_client_that_disconnects_mid_response_costs_only_its_response(
    server: Server,
) -> None:
    """expand answers megabytes of JSON; the client reads the first bytes and closes."""
    before = scrape(server)
    sock = send(server, "expand", float_request(1.0))
    assert sock.recv(1024).startswith(b"HTTP/1.1 200 OK\r\n")
    sock.close()
    response = server.infer("expand", float_request(3.0))
    assert response.status_code == 200
    assert response.json()["outputs"][0]["data"][:2] == [3.0, 3.0]
    change = delta(assert_accounting(server), before, "expand")
    assert change == {"received": 2, "completed": 2, "answered:success": 2}


def test_a_client_that_stops_reading_does_not_hold_up_the_others(server: Server) -> None:
    """The stalled response waits in its connection's buffers; other requests are served."""
    before = scrape(server)
    stalled = send(server, "expand", float_request(1.0))
    try:
        wait_until(
            lambda: delta(scrape(server), before, "expand")["completed"] == 1,
            "the stalled client's request to complete",
        )
        for value in (1.0, 2.0, 3.0):
            response = server.infer("add_one", float_request(value))
            assert response.json()["outputs"][0]["data"] == [value + 1]
        assert delta(assert_accounting(server), before, "add_one")["completed"] == 3
    finally:
        stalled.close()
    change = delta(assert_accounting(server), before, "expand")
    assert change == {"received": 1, "completed": 1, "answered:success": 1}


# -- hostile bodies -------------------------------------------------------------------------

DEPTH = 100_000


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(
            b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": '
            + b"[" * DEPTH
            + b"1"
            + b"]" * DEPTH
            + b"}]}",
            id="in-data",
        ),
        pytest.param(b"[" * DEPTH + b"]" * DEPTH, id="top-level"),
        pytest.param(b'{"inputs": ' + b"[" * DEPTH + b"]" * DEPTH + b"}", id="in-inputs"),
    ],
)
def test_a_json_nesting_bomb_is_400(server: Server, body: bytes) -> None:
    before = scrape(server)
    response = server.http.post("/v2/models/add_one/infer", content=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"].startswith("failed to parse the request JSON buffer: ")
    change = delta(assert_accounting(server), before, "add_one")
    assert change == {"answered:invalid": 1}  # refused before the batcher


def test_a_bytes_element_longer_than_the_body_is_400(server: Server) -> None:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "TEXT",
                    "datatype": "BYTES",
                    "shape": [1, 1],
                    "parameters": {"binary_data_size": 9},
                }
            ]
        }
    ).encode()
    raw = struct.pack("<I", 1_000_000) + b"hello"  # says a megabyte, holds 5 bytes
    before = scrape(server)
    response = server.http.post(
        "/v2/models/upper/infer",
        content=header + raw,
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert response.status_code == 400, response.text
    assert "TEXT" in response.json()["error"]
    change = delta(assert_accounting(server), before, "upper")
    assert change == {"answered:invalid": 1}


def test_a_body_over_max_body_bytes_is_413(server: Server) -> None:
    before = scrape(server)
    data = [0.0] * (MAX_BODY // 4)
    doc = {"inputs": [json_tensor("INPUT0", "FP32", [len(data), 1], data)]}
    response = server.infer("add_one", doc)
    assert response.status_code == 413, response.text
    assert list(response.json()) == ["error"]
    change = delta(assert_accounting(server), before, "add_one")
    assert change == {"answered:too_large": 1}


# -- overload, signals ----------------------------------------------------------------------

QUEUE = 8


def test_a_cancellation_storm_during_2x_overload(serve: Launcher) -> None:
    """Capacity is one request running, one staged as the next batch and QUEUE queued;
    twice that arrive. The surplus is refused at once (503), then half of the queued clients
    close their connections. Every request has one outcome, and the server counted each one
    as the clients saw it."""
    server = serve("models:gated", "--max-batch-size", "1", "--max-queue-size", str(QUEUE))
    capacity = 2 + QUEUE
    with server.gate_closed("gated"):
        running = send(server, "gated", float_request(0.0))
        server.wait_started("gated", 1)
        staged = send(server, "gated", float_request(1.0))
        server.wait_queued("gated", pending=2, queued_rows=0)
        queued = [send(server, "gated", float_request(float(i))) for i in range(2, capacity)]
        server.wait_queued("gated", pending=capacity, queued_rows=QUEUE)
        surplus = [send(server, "gated", float_request(-1.0)) for _ in range(capacity)]
        outcomes: list[int | str] = [status_of(sock) for sock in surplus]
        aborted, kept = queued[::2], [running, staged, *queued[1::2]]
        for sock in aborted:
            sock.close()
        outcomes += [CLOSED] * len(aborted)
        wait_until(
            lambda: scrape(server)["gated"]["cancelled"] == len(aborted),
            "the aborted requests to be withdrawn",
        )
    outcomes += [status_of(sock) for sock in kept]
    assert len(outcomes) == 2 * capacity  # one outcome per request
    assert Counter(outcomes) == {503: capacity, CLOSED: len(aborted), 200: len(kept)}
    counts = nonzero(assert_accounting(server)["gated"])
    assert counts == {
        "received": 2 * capacity,
        "completed": len(kept),
        "cancelled": len(aborted),
        "rejected": capacity,
        "answered:success": len(kept),
        "answered:unavailable": capacity,
        "answered:client_closed": len(aborted),
    }


def refuses_connections(server: Server) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=1.0):
            return False
    except ConnectionRefusedError:
        return True


def test_sigterm_during_a_burst_answers_every_accepted_request(
    serve: Launcher, threads: ThreadPoolExecutor
) -> None:
    """Accepted requests are answered with their own values; those sent after the signal
    find the port closed. (Past --drain-timeout the accepted get 503 "stopping":
    test_shutdown.py::test_requests_past_the_drain_timeout_get_503_error_json.)"""
    server = serve("models:gated", "--max-batch-size", "4")
    burst = 12
    with server.gate_closed("gated"):
        accepted = [
            threads.submit(server.infer_alone, "gated", float_request(float(i)))
            for i in range(burst)
        ]
        wait_until(lambda: scrape(server)["gated"]["in_flight"] == burst, "the burst in flight")
        assert assert_accounting(server)["gated"]["received"] == burst  # /metrics closes next
        server.send_signal(signal.SIGTERM)
        wait_until(lambda: refuses_connections(server), "the listener to close")
        late = [
            outcome_of(lambda: server.infer_alone("gated", float_request(1.0)))
            for _ in range(burst)
        ]
    for i, future in enumerate(accepted):
        response = future.result()
        assert response.status_code == 200, response.text
        assert response.json()["outputs"][0]["data"] == [float(i)]
    assert late == [CLOSED] * burst
    assert server.wait_exit() == 0
    assert "Traceback" not in server.stderr()


def test_sigkill_then_a_restart_on_the_same_port(
    serve: Launcher, threads: ThreadPoolExecutor
) -> None:
    """Nothing is kept between runs, so nothing is lost: the requests in flight get a
    connection error, never a wrong answer, and the restarted server answers correctly."""
    server = serve("models:gated", "--max-batch-size", "2")
    with server.gate_closed("gated"):
        in_flight = [
            threads.submit(outcome_of, lambda i=i: server.infer_alone("gated", float_request(i)))
            for i in range(6)
        ]
        wait_until(lambda: scrape(server)["gated"]["in_flight"] == 6, "6 requests in flight")
        assert_accounting(server)
        server.kill()
    assert [future.result() for future in in_flight] == [CLOSED] * 6
    assert server.process.returncode == -signal.SIGKILL
    again = serve("models:gated", port=server.port)
    response = again.infer("gated", float_request(7.0))
    assert response.json()["outputs"][0]["data"] == [7.0]
    assert nonzero(assert_accounting(again)["gated"]) == {
        "received": 1, "completed": 1, "answered:success": 1
    }  # fmt: skip


# -- answers no model counts: the server's own ----------------------------------------------


def own(server: Server) -> Counter[str]:
    """The server's own count of answers (no model counts them), as ``protocol:outcome``;
    a scrape of ``/metrics`` counts itself (``http:success``) once rendered."""
    text = server.metrics()
    return Counter({f"{p}:{outcome}": int(float(n)) for outcome, p, n in _OWN.findall(text)})


def since(before: Counter[str], after: Counter[str], *protocols: str) -> Counter[str]:
    """What changed between two :func:`own`, of ``protocols`` (all if none is named)."""
    change = Counter(after)
    change.subtract(before)
    return Counter(
        {key: n for key, n in change.items() if n and key.startswith(protocols or ("",))}
    )


def test_embeddings_refused_before_their_model_is_known_are_the_servers(server: Server) -> None:
    """Invalid JSON, no model, an unknown model, a body over --max-body-bytes: each is
    counted once, the server's (before, none of them was counted anywhere). A model that is
    known but not served over OpenAI counts its 404 itself."""
    models, before = scrape(server), own(server)
    refusals = [
        (b"{not json", 400, "invalid_json"),
        (b'{"input": "x"}', 400, "missing_required_parameter"),
        (b'{"model": "add_one", "input": "x"}', 404, "model_not_found"),  # add_one's own
        (b'{"model": "x", "input": "' + b"x" * MAX_BODY + b'"}', 413, "request_too_large"),
    ]
    for body, status, code in refusals:
        response = server.http.post("/v1/embeddings", content=body)
        assert (response.status_code, response.json()["error"]["code"]) == (status, code)
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    with client, pytest.raises(openai.NotFoundError) as info:
        client.embeddings.create(model="no_such_model", input="x")
    assert info.value.code == "model_not_found"
    assert since(before, own(server), "openai:") == {
        "openai:invalid": 2, "openai:too_large": 1, "openai:not_found": 1
    }  # fmt: skip
    assert delta(assert_accounting(server), models, "add_one") == {"answered:not_found": 1}


def test_v2_answers_without_a_model_are_the_servers(server: Server) -> None:
    """An unknown model or version, an unknown route, a wrong method, health, metadata and
    scrapes: no model counts them, the server does, once each (an unknown model used not to
    be counted at all); an inference of a known model is its own."""
    models, before = scrape(server), own(server)
    assert server.infer("no_such_model", float_request(1.0)).status_code == 404
    assert server.infer("add_one", float_request(1.0)).status_code == 200
    assert server.http.post("/v2/models/add_one/versions/9/infer", json={}).status_code == 404
    assert server.http.get("/v2/models/add_one/infer").status_code == 405
    assert server.http.get("/v2/no_such_route").status_code == 404
    assert server.http.get("/v2/models/add_one").status_code == 200
    assert server.http.get("/v2/health/ready").status_code == 200
    assert since(before, own(server), "http:") == {  # success: and the scrape of "before"
        "http:not_found": 3, "http:method_not_allowed": 1, "http:success": 3
    }  # fmt: skip
    assert delta(assert_accounting(server), models, "add_one") == {
        "received": 1, "completed": 1, "answered:success": 1
    }  # fmt: skip


EDGE_CALLS = 2  # --grpc-max-concurrent-rpcs of the edges server
EDGE_TIMEOUT_S = 0.5  # its --body-timeout


@pytest.fixture(scope="module")
def edges(serve_module: Launcher) -> Server:
    """gRPC on, a short body timeout, two gRPC calls at once at most."""
    limits = ["--body-timeout", str(EDGE_TIMEOUT_S), "--max-body-bytes", str(MAX_BODY)]
    limits += ["--grpc-max-concurrent-rpcs", str(EDGE_CALLS)]
    return serve_module("models:gated", *limits, grpc=True)


def one(value: float) -> list[Any]:
    tensor = triton.InferInput("INPUT0", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[value]], np.float32))
    return [tensor]


def code_of(call: Any, *args: Any) -> str:
    with pytest.raises(InferenceServerException) as info:
        call(*args)
    return str(info.value.status()).removeprefix("StatusCode.")


def test_an_embeddings_body_that_stalls_is_408_the_servers(edges: Server) -> None:
    before = own(edges)
    with connect(edges) as sock:
        head = b"POST /v1/embeddings HTTP/1.1\r\nHost: carpool\r\nContent-Length: 100\r\n\r\n"
        sock.sendall(head + b'{"model": ')  # the rest never comes
        assert status_of(sock) == 408
    assert since(before, own(edges), "openai:") == {"openai:request_timeout": 1}


def test_answers_a_connection_gives_before_any_app_are_the_servers(serve: Launcher) -> None:
    """A request whose headers never end (408), one that does not parse (uvicorn's 400),
    one past ``--limit-concurrency`` (503): the connection answers, no route ever saw
    them, and the server counts each once under ``http``."""
    server = serve("models:add_one", "--header-timeout", "1", "--limit-concurrency", "1")
    before = own(server)
    with connect(server) as sock:
        sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: carpool\r\n")  # no end
        assert status_of(sock) == 408
    with connect(server) as sock:
        sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        assert status_of(sock) == 400
    with connect(server) as held:
        held.sendall(b"POST /v2/models/add_one/infer HTTP/1.1\r\nHost: c\r\nContent-Length")
        with connect(server) as sock:  # the held one is the only one the limit lets in
            sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: carpool\r\n\r\n")
            assert status_of(sock) == 503
        held.shutdown(socket.SHUT_WR)  # the server closes it (no 400: no answer is due)...
        assert held.recv(1024) == b""  # ...and frees its place before it accepts another
    assert since(before, own(server)) == {  # success: the scrape of "before"
        "http:request_timeout": 1, "http:invalid": 1, "http:unavailable": 1, "http:success": 1
    }  # fmt: skip


def test_grpc_refusals_before_a_handler_or_a_model_are_the_servers(edges: Server) -> None:
    """An unknown model, a message over the limit (grpc's own RESOURCE_EXHAUSTED, before any
    handler ran), a message that does not parse (INVALID_ARGUMENT: grpc used to answer
    UNKNOWN with a traceback in the log), a method the service lacks: counted once each."""
    before = own(edges)
    client = triton.InferenceServerClient(edges.grpc_address)
    try:
        assert code_of(client.infer, "no_such_model", one(1.0)) == "NOT_FOUND"
        large = np.zeros((1, MAX_BODY // 4 + 1), np.float32)
        tensor = triton.InferInput("INPUT0", list(large.shape), "FP32")
        tensor.set_data_from_numpy(large)
        assert code_of(client.infer, "gated", [tensor]) == "RESOURCE_EXHAUSTED"
        assert client.is_server_live()
    finally:
        client.close()
    with grpc.insecure_channel(edges.grpc_address) as channel:
        for method, code in (("ModelInfer", "INVALID_ARGUMENT"), ("NoSuchRpc", "UNIMPLEMENTED")):
            call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
            with pytest.raises(grpc.RpcError) as info:
                call(b"\xff\xff not a message")
            assert info.value.code().name == code
    expected = {f"grpc:{outcome}": 1 for outcome in ("not_found", "too_large", "success")}
    expected.update({"grpc:invalid": 1, "grpc:method_not_allowed": 1})
    # (a call grpc ended before its handler is counted as its task ends: maybe a turn later)
    wait_until(lambda: since(before, own(edges), "grpc:") == expected, f"{expected}")
    assert "Traceback" not in edges.stderr()


def test_grpc_calls_past_the_limit_are_the_servers_unavailable(edges: Server) -> None:
    """Two calls held in the model; a third is RESOURCE_EXHAUSTED at once, counted as the
    server's overload (unavailable); the two are answered and counted under the model."""
    models, before = scrape(edges), own(edges)
    client = triton.InferenceServerClient(edges.grpc_address)
    answers: list[Any] = []
    try:
        with edges.gate_closed("gated"):
            for value in range(EDGE_CALLS):
                client.async_infer(
                    "gated", one(value), lambda result, error: answers.append((result, error))
                )
            wait_until(lambda: edges.stats("gated")["pending"] == EDGE_CALLS, "calls held")
            assert code_of(client.infer, "gated", one(9.0)) == "RESOURCE_EXHAUSTED"
        wait_until(lambda: len(answers) == EDGE_CALLS, "the held calls' answers")
    finally:
        client.close()
    assert [error for _, error in answers] == [None] * EDGE_CALLS
    assert since(before, own(edges), "grpc:") == {"grpc:unavailable": 1}
    assert delta(assert_accounting(edges), models, "gated") == {
        "received": EDGE_CALLS, "completed": EDGE_CALLS, "answered:success": EDGE_CALLS
    }  # fmt: skip


def test_calls_without_a_key_are_the_servers_401_in_every_protocol(serve: Launcher) -> None:
    key = "s3cret"
    server = serve("models:add_one", "--api-key", key, grpc=True)
    models, before = scrape(server), own(server)
    assert server.infer("add_one", float_request(1.0)).status_code == 401
    assert server.http.post("/v1/embeddings", json={"model": "add_one"}).status_code == 401
    client = triton.InferenceServerClient(server.grpc_address)
    try:
        assert code_of(client.infer, "add_one", one(1.0)) == "UNAUTHENTICATED"
        keyed = {"authorization": f"Bearer {key}"}
        assert client.infer("add_one", one(1.0), headers=keyed).as_numpy("OUTPUT0") == [[2.0]]
    finally:
        client.close()
    assert since(before, own(server)) == {  # success: before's scrape
        "http:unauthorized": 1, "openai:unauthorized": 1, "grpc:unauthorized": 1,
        "http:success": 1,
    }  # fmt: skip
    assert delta(assert_accounting(server), models, "add_one") == {
        "received": 1, "completed": 1, "answered:success": 1
    }  # fmt: skip


def test_front_ends_sum_the_servers_own_counts(serve: Launcher) -> None:
    """With --frontends 2 each front end counts its own; any of them shows the sum."""
    server = serve("models:add_one", "--frontends", "2")
    body = json.dumps({"model": "no_such_model", "input": "x"})
    for index, sent in ((1, 1), (2, 2)):
        for conn in connections(server, index, sent):
            conn.request("POST", "/v1/embeddings", body)
            assert conn.getresponse().status == 404
            conn.close()
    for index in (1, 2):
        (conn,) = connections(server, index, 1)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        counts = {(p, o): int(float(n)) for o, p, n in _OWN.findall(text)}
        assert counts[("openai", "not_found")] == 3
