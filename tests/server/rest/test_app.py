"""carpool.server.rest.app in process, as an ASGI application: what only the app itself decides,
without a socket (the end-to-end tests hold the rest)."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import numpy as np

from carpool import Model
from carpool.server.config import ServerConfig
from carpool.server.serve import build_app
from carpool.server.statuses import STOPPING
from server.conftest import float_request


async def test_a_request_cut_off_at_the_drain_deadline_is_answered_503_and_counted() -> None:
    """At the drain deadline uvicorn cancels what is still running; the app answers it 503,
    and it is counted under its model like every other answer."""
    started, release = threading.Event(), threading.Event()

    def slow(batch: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        started.set()
        release.wait(10)
        return batch

    app = build_app(ServerConfig(models=(Model(slow, name="slow"),), grpc_port=0))
    await app.startup()
    body = json.dumps(float_request(1.0)).encode()
    sent: list[dict[str, Any]] = []
    arrived = False

    async def receive() -> dict[str, Any]:
        nonlocal arrived
        if not arrived:
            arrived = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client stays
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v2/models/slow/infer",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1),
    }
    task = asyncio.create_task(app(scope, receive, send))
    for _ in range(10_000):
        if started.is_set():
            break
        await asyncio.sleep(0.001)
    task.cancel()  # what uvicorn does to a request still running at the drain deadline
    await task
    assert sent[0]["status"] == 503
    assert json.loads(sent[1]["body"]) == {"error": STOPPING}
    assert app.registry.get("slow").statuses == {"http": {503: 1}}
    release.set()
    await app.shutdown()


async def test_embeddings_on_a_server_not_ready_answer_before_the_body_is_read() -> None:
    """``/v1/embeddings`` checks readiness before it reads its body, as the v2 route does: a
    client that sends its headers and never its body still gets the 503 at once, in OpenAI's
    shape, counted the server's (no body: no model named)."""
    app = build_app(ServerConfig(models=(Model(lambda batch: batch, name="m"),), grpc_port=0))
    await app.startup()
    app.begin_drain()  # not ready any more
    sent: list[dict[str, Any]] = []
    reads = 0

    async def receive() -> dict[str, Any]:
        nonlocal reads
        reads += 1
        await asyncio.Event().wait()  # the body never comes
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/embeddings",
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"100")],
        "client": ("127.0.0.1", 1),
    }
    async with asyncio.timeout(10):
        await app(scope, receive, send)
    assert reads == 0
    assert sent[0]["status"] == 503
    error = json.loads(sent[1]["body"])["error"]
    assert (error["message"], error["type"], error["param"]) == (STOPPING, "server_error", None)
    assert app.registry.server_counts.totals() == {"openai": {503: 1}}
    assert app.registry.get("m").statuses == {}
    await app.shutdown()
