"""Request bodies off the ASGI channel, within ``--max-body-bytes`` (gzip and deflate inflated
within it too, so a small body cannot expand without bound) and within ``--body-timeout`` (a
408, and the connection closed, so a slowloris cannot hold it). Every refusal is an
:class:`~carpool.server.statuses.HTTPError`."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Mapping

from carpool.server.rest.asgi import Receive, Scope
from carpool.server.statuses import HTTPError, Status

__all__ = ["decompress", "read_body", "request_headers"]

# Headers that say how to read a body: sent twice, which one counts is a guess (and two
# readers guessing apart is how requests are smuggled), so neither does.
_ONCE = (
    b"content-length",
    b"content-encoding",
    b"content-type",
    b"inference-header-content-length",
)


def request_headers(scope: Scope) -> dict[bytes, bytes]:
    """A request's headers by (lower-case) name; a 400 naming a header that says how to
    read the body and came more than once."""
    pairs = scope["headers"]
    headers = dict(pairs)
    if len(headers) != len(pairs):  # some name came twice: is it one that matters?
        for name in _ONCE:
            if sum(1 for key, _ in pairs if key == name) > 1:
                raise HTTPError(
                    Status.BAD_REQUEST,
                    f"the {name.decode()} header came more than once; send it once",
                )
    return headers


async def read_body(
    headers: Mapping[bytes, bytes],
    receive: Receive,
    limit: int,
    *,
    timeout_s: float | None = None,
    arrived: bool = False,
) -> bytes:
    """The whole request body, inflated if ``Content-Encoding`` says so, of at most ``limit``
    bytes, all of it within ``timeout_s`` seconds. ``arrived``: the connection already holds
    all of it (reading cannot stall, so no timer is armed). Raises ``HTTPError``: 413 over
    the limit, 400 if the client leaves mid-body, 408 (closing the connection) past the
    timeout, 415 or 400 for an encoding that cannot be inflated."""
    declared = headers.get(b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPError(Status.CONTENT_TOO_LARGE, _too_large(int(declared), limit))
    if arrived or timeout_s is None:
        body = await _receive_all(receive, limit)
    else:
        body = await _receive_within(receive, limit, timeout_s)
    encoding = headers.get(b"content-encoding")
    return body if encoding is None else decompress(body, encoding, limit)


async def _receive_within(receive: Receive, limit: int, timeout_s: float) -> bytes:
    try:
        async with asyncio.timeout(timeout_s):
            return await _receive_all(receive, limit)
    except TimeoutError:
        raise HTTPError(
            Status.REQUEST_TIMEOUT,
            f"the request body did not arrive within {timeout_s:g} s; send it faster, or "
            "raise --body-timeout",
            [(b"connection", b"close")],  # what is left of the body is never read
        ) from None


async def _receive_all(receive: Receive, limit: int) -> bytes:
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            # nobody reads this answer: it counts as client_closed, not the client's mistake
            raise HTTPError(
                Status.CLIENT_CLOSED, "client disconnected before sending the whole body"
            )
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise HTTPError(Status.CONTENT_TOO_LARGE, _too_large(size, limit))
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def decompress(body: bytes, encoding: bytes, limit: int) -> bytes:
    """A gzip or deflate body (tritonclient's request compression), inflated to at most
    ``limit`` bytes. Raises ``HTTPError``: 415 for another encoding, 413 past the limit,
    400 for data that does not inflate."""
    kind = encoding.strip().lower()
    if kind == b"identity":
        return body
    if kind not in (b"gzip", b"deflate"):
        shown = kind.decode(errors="replace")
        raise HTTPError(
            Status.UNSUPPORTED_MEDIA_TYPE,
            f"Content-Encoding {shown!r} is not supported; send gzip, deflate or an "
            "uncompressed body",
        )
    inflater = zlib.decompressobj(zlib.MAX_WBITS | (16 if kind == b"gzip" else 0))
    try:
        out = inflater.decompress(body, limit + 1)
        if len(out) > limit:
            raise HTTPError(
                Status.CONTENT_TOO_LARGE, _too_large(len(out), limit) + " (after decompression)"
            )
        if not inflater.eof or inflater.unused_data:
            raise zlib.error("truncated or trailing data")
    except zlib.error as exc:
        raise HTTPError(
            Status.BAD_REQUEST, f"cannot decompress the {kind.decode()} body: {exc}"
        ) from None
    return out


def _too_large(size: int, limit: int) -> str:
    return (
        f"request body of {size} bytes exceeds the limit of {limit} bytes; "
        "raise --max-body-bytes or send smaller requests"
    )
