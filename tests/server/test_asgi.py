"""ASGI plumbing: one whole response, and a request withdrawn when its client leaves."""

from __future__ import annotations

import asyncio
from typing import Any

from carpool.server.asgi import JSON, send_json, send_response, unless_disconnected


class Channel:
    """The server's side of one connection: what was sent, and messages to receive."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.incoming: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    async def receive(self) -> dict[str, Any]:
        return await self.incoming.get()


async def test_send_response_adds_the_content_length() -> None:
    channel = Channel()
    await send_response(channel.send, 201, b"hello", [(b"x-a", b"1")])
    assert channel.sent == [
        {
            "type": "http.response.start",
            "status": 201,
            "headers": [(b"x-a", b"1"), (b"content-length", b"5")],
        },
        {"type": "http.response.body", "body": b"hello"},
    ]


async def test_send_json_returns_its_status_and_leaves_the_shared_headers_alone() -> None:
    channel = Channel()
    assert await send_json(channel.send, 503, {"ready": False}) == 503
    start, body = channel.sent
    assert start["headers"] == [*JSON, (b"content-length", b"15")]
    assert body["body"] == b'{"ready":false}'
    assert JSON == [(b"content-type", b"application/json")]


async def test_work_that_finishes_first_is_kept() -> None:
    channel = Channel()
    loop = asyncio.get_running_loop()
    work: asyncio.Future[int] = loop.create_future()
    waiting = asyncio.ensure_future(unless_disconnected(work, channel.receive))
    await channel.incoming.put({"type": "http.request", "body": b"", "more_body": False})
    work.set_result(7)
    assert await waiting is True
    assert work.result() == 7


async def test_a_client_that_leaves_cancels_the_work() -> None:
    channel = Channel()
    started = asyncio.Event()

    async def slow() -> None:
        started.set()
        await asyncio.Event().wait()  # until cancelled

    work = asyncio.ensure_future(slow())
    waiting = asyncio.ensure_future(unless_disconnected(work, channel.receive))
    await started.wait()
    await channel.incoming.put({"type": "http.disconnect"})
    assert await waiting is False
    assert work.cancelled()


async def test_cancelling_the_wait_cancels_the_work() -> None:
    channel = Channel()
    loop = asyncio.get_running_loop()
    work: asyncio.Future[int] = loop.create_future()
    waiting = asyncio.ensure_future(unless_disconnected(work, channel.receive))
    await asyncio.sleep(0)  # let it start waiting
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert waiting.cancelled()
    assert work.cancelled()
