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
