"""The fault matrix (docs/reliability.md): each fault a test with an exact expected outcome.

Every case ends in :func:`assert_accounting`: the server is live, and for every model
``/metrics`` satisfies received = completed + failed + expired + cancelled + rejected +
in flight. Every client request's outcome is recorded (its status, or ``CLOSED`` for a
connection error) and each request has exactly one; where the server counted the same
requests by outcome, the two counts are compared.

Faults already covered elsewhere are referenced, not repeated: header and body timeouts
(slowloris) in ``test_connection_limits.py``, NaN and Inf in ``test_e2e_errors.py`` and
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

import httpx
import pytest

from .conftest import Launcher, Server, float_request, json_tensor, wait_until

OUTCOMES = ("completed", "failed", "expired", "cancelled", "rejected")
CLOSED = "connection error"  # a request that got no HTTP answer, only a broken connection
MAX_BODY = 1_000_000  # a nesting bomb of depth 100,000 fits
SOCKET_TIMEOUT_S = 30.0
_SAMPLE = re.compile(r'^(carpool_\w+)\{model="([^"]+)"(?:,outcome="([^"]+)")?[^}]*\} (\S+)$', re.M)


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
