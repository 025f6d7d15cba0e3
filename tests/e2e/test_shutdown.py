"""SIGTERM while requests are in flight: the listener closes, every accepted request is
answered, the process exits 0.

Requests are held inside a gated model, so "in flight" is a state the test observes
(``carpool_requests_in_flight``), not a race it hopes to win.
"""

from __future__ import annotations

import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from server.conftest import Launcher, Server, float_request, wait_until

IN_FLIGHT = 6


def refuses_connections(server: Server) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=1.0):
            return False
    except ConnectionRefusedError:
        return True


def hold_requests(server: Server, threads: ThreadPoolExecutor) -> list[Any]:
    """IN_FLIGHT requests accepted by the (closed) gated model: one running, the rest queued."""
    futures = [
        threads.submit(server.infer_alone, "gated", float_request(float(i)))
        for i in range(IN_FLIGHT)
    ]
    wait_until(
        lambda: server.metric("carpool_requests_in_flight", model="gated") == IN_FLIGHT,
        f"{IN_FLIGHT} requests in flight",
    )
    return futures


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_drains_in_flight_requests_and_exits_0(
    serve: Launcher, threads: ThreadPoolExecutor, sig: signal.Signals
) -> None:
    server = serve("models:gated", "--max-batch-size", "2")
    with server.gate_closed("gated"):
        futures = hold_requests(server, threads)
        server.send_signal(sig)
        wait_until(lambda: refuses_connections(server), "the listener to close")
        assert not any(f.done() for f in futures)  # nothing was answered early or dropped
    for i, future in enumerate(futures):
        response = future.result()
        assert response.status_code == 200, response.text
        assert response.json()["outputs"][0]["data"] == [float(i)]
    assert server.wait_exit() == 0
    assert refuses_connections(server)
    log = server.stderr()
    assert "draining" in log
    assert "Traceback" not in log


@pytest.mark.slow
def test_requests_past_the_drain_timeout_get_503_error_json(
    serve: Launcher, threads: ThreadPoolExecutor
) -> None:
    """Requests still unanswered when the drain timeout ends are told so, never dropped."""
    server = serve("models:gated", "--max-batch-size", "2", "--drain-timeout", "0.2")
    with server.gate_closed("gated"):
        futures = hold_requests(server, threads)
        server.terminate()
        responses = [f.result() for f in futures]  # while the model is still blocked
    for response in responses:
        assert response.status_code == 503, response.text
        assert response.headers["content-type"] == "application/json"
        assert list(response.json()) == ["error"]
        assert "stopping" in response.json()["error"]
    assert server.wait_exit() == 0
    assert "Exception in ASGI application" not in server.stderr()  # an expected end


@pytest.mark.slow
def test_a_hung_model_does_not_keep_the_process_past_the_drain_timeout(
    serve: Launcher, threads: ThreadPoolExecutor
) -> None:
    """serve.py: requests still running after the drain timeout are cut off, "so the process
    always exits in bounded time", even while the model never returns."""
    server = serve("models:gated", "--drain-timeout", "0.2")
    with server.gate_closed("gated"):
        futures = hold_requests(server, threads)
        server.terminate()
        for future in futures:
            future.result()
        # the gate stays closed (for up to a minute): the process must exit regardless
        assert server.wait_exit(within=5.0) == 0


@pytest.mark.slow
def test_the_drain_timeout_bounds_the_whole_drain_not_each_step(
    serve: Launcher, threads: ThreadPoolExecutor
) -> None:
    """The HTTP server's wait for requests and the batchers' close share one drain timeout:
    a hung model once made the process take both in turn (2 x 3 s, then the 1 s it gives
    threads to end), past a grace period sized as preStop + drain timeout (deploy/)."""
    server = serve("models:gated", "--drain-timeout", "3")
    with server.gate_closed("gated"):
        futures = hold_requests(server, threads)
        signalled = time.monotonic()
        server.terminate()
        for future in futures:
            assert future.result().status_code == 503
        assert server.wait_exit(within=30.0) == 0
        took = time.monotonic() - signalled
    assert took < 3 + 0.1 + 1 + 1.5, server.stderr()  # uvicorn's 0.1 s poll, 1 s for threads
    assert "drain timed out after 0s" in server.stderr()  # nothing was left for a 2nd wait


def test_idle_server_exits_0_on_sigterm(serve: Launcher) -> None:
    server = serve("demo")
    server.terminate()
    assert server.wait_exit() == 0
    assert refuses_connections(server)
