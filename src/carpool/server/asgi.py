"""The ASGI plumbing the app needs: its types, sending one response, and noticing a client
that went away while its request waited.

No framework: a handful of routes needs no more, and the inference path is the hot path.
It must not import the app, the registry or the batcher.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson

__all__ = [
    "Scope",
    "Receive",
    "Send",
    "JSON",
    "send_response",
    "send_json",
    "disconnected",
]

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

JSON = [(b"content-type", b"application/json")]


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
