"""ASGI plumbing: one whole response, and noticing a client that leaves (what the
inference path withdraws a request on: ``test_path.py``)."""

from __future__ import annotations

import asyncio
from typing import Any

from carpool.server.rest.asgi import (
    JSON,
    WATCH,
    RequestWatch,
    disconnected,
    gone_signal,
    request_watch,
    send_json,
    send_response,
)


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


async def test_disconnected_returns_when_the_client_has_gone_and_not_before() -> None:
    channel = Channel()
    waiting = asyncio.ensure_future(disconnected(channel.receive))
    await channel.incoming.put({"type": "http.request", "body": b"", "more_body": False})
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # it took the message, and waits on
    assert not waiting.done()
    assert channel.incoming.empty()
    await channel.incoming.put({"type": "http.disconnect"})
    assert await waiting is None


def test_a_watch_tells_its_watcher_once_and_not_after_it_stopped() -> None:
    watch = RequestWatch()
    told: list[str] = []
    stop = watch.on_gone(lambda: told.append("first"))
    watch.mark_gone()
    watch.mark_gone()  # the connection is lost once; a second mark tells nobody
    assert (watch.gone, told) == (True, ["first"])
    stop()
    quiet = RequestWatch()
    quiet.on_gone(lambda: told.append("stopped"))()  # stops watching at once
    quiet.mark_gone()
    assert told == ["first"]


def test_a_watch_of_a_client_already_gone_tells_at_once() -> None:
    watch = RequestWatch()
    watch.mark_gone()
    told: list[int] = []
    watch.on_gone(lambda: told.append(1))
    assert told == [1]


async def test_gone_signal_uses_the_connections_watch_when_there_is_one() -> None:
    watch = RequestWatch()
    scope = {"type": "http", "extensions": {WATCH: {"request": watch}}}
    assert request_watch(scope) is watch
    assert request_watch({"type": "http"}) is None
    channel = Channel()
    told: list[int] = []
    gone_signal(scope, channel.receive)(lambda: told.append(1))
    watch.mark_gone()
    assert told == [1]
    assert channel.incoming.empty()  # nothing was read from the client for it


async def test_gone_signal_without_a_watch_awaits_the_disconnect() -> None:
    channel = Channel()
    told = asyncio.Event()
    stop = gone_signal({"type": "http"}, channel.receive)(told.set)
    await channel.incoming.put({"type": "http.request", "body": b"", "more_body": False})
    await asyncio.sleep(0)
    assert not told.is_set()
    await channel.incoming.put({"type": "http.disconnect"})
    await asyncio.wait_for(told.wait(), 5.0)
    stop()  # after the fact: harmless


async def test_gone_signal_without_a_watch_stops_watching_when_told() -> None:
    channel = Channel()
    told: list[int] = []
    stop = gone_signal({"type": "http"}, channel.receive)(lambda: told.append(1))
    await asyncio.sleep(0)
    stop()
    await asyncio.sleep(0)
    await channel.incoming.put({"type": "http.disconnect"})
    await asyncio.sleep(0)
    assert told == []
