"""The ASGI plumbing the app needs: its types, sending one response, and noticing a client that
has gone. :class:`RequestWatch`, which ``carpool serve``'s connections put in the scope, says
when a body has all arrived and when its client goes; other ASGI servers cost a task and a
timer per request instead. Imports nothing of the app."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

__all__ = [
    "Scope",
    "Receive",
    "Send",
    "JSON",
    "WATCH",
    "RequestWatch",
    "send_response",
    "send_json",
    "disconnected",
    "gone_signal",
    "request_watch",
]

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

JSON = [(b"content-type", b"application/json")]
WATCH = "carpool.watch"  # the scope extension: {"request": RequestWatch}, as ASGI's are dicts


class RequestWatch:
    """One request as its connection sees it: ``body_complete`` once its whole body has
    arrived (reading it then cannot stall, so it needs no timer), ``gone`` once its client
    has disconnected; :meth:`on_gone` runs a callback then."""

    __slots__ = ("_on_gone", "body_complete", "gone")

    def __init__(self) -> None:
        self.body_complete = False
        self.gone = False
        self._on_gone: Callable[[], None] | None = None

    def on_gone(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Run ``callback`` when the client goes (at once if it has); returns what stops
        watching. (The inference path's ``Withdrawal.client_gone``.)"""
        if self.gone:
            callback()
        else:
            self._on_gone = callback
        return self._forget

    def mark_gone(self) -> None:
        """The connection is lost: the watcher, if any, is told once."""
        self.gone = True
        callback, self._on_gone = self._on_gone, None
        if callback is not None:
            callback()

    def _forget(self) -> None:
        self._on_gone = None


def request_watch(scope: Scope) -> RequestWatch | None:
    """The connection's watch of this request; None under a server that gives none."""
    extension = scope.get("extensions", {}).get(WATCH)
    return None if extension is None else extension.get("request")


async def send_response(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    """One whole response: ``headers`` plus its ``content-length``, then ``body``."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def send_json(send: Send, status: int, payload: Any) -> int:
    """``payload`` as a JSON response; returns ``status``, for the access log."""
    await send_response(send, status, orjson.dumps(payload), JSON)
    return status


async def disconnected(receive: Receive) -> None:
    """Until the client has gone (``http.disconnect``), once its body has been read: what
    the inference path watches to withdraw a request nobody waits for any more."""
    while (await receive()).get("type") != "http.disconnect":
        pass


def gone_signal(
    scope: Scope, receive: Receive
) -> Callable[[Callable[[], None]], Callable[[], None]]:
    """How the inference path learns that this request's client went: from the connection's
    watch when there is one, else from a task awaiting :func:`disconnected` (an error while
    awaiting it counts as gone: nothing more can be read from that client)."""
    watch = request_watch(scope)
    if watch is not None:
        return watch.on_gone

    def subscribe(callback: Callable[[], None]) -> Callable[[], None]:
        def finished(task: asyncio.Task[None]) -> None:
            if not task.cancelled():
                task.exception()  # retrieved: failing to read the client is its going
                callback()

        def stop() -> None:
            task.cancel()

        task = asyncio.ensure_future(disconnected(receive))
        task.add_done_callback(finished)
        return stop

    return subscribe
