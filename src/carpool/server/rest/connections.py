"""uvicorn's httptools protocol with the limits it lacks: a header timeout (408 if part of a
request came), a write timeout, a JSON 503 past ``--limit-concurrency``, and the TLS handshake
within ``--header-timeout``, counted from accept. Each request's scope carries a
:class:`~carpool.server.rest.asgi.RequestWatch`; uvicorn's internals are reached through
:mod:`carpool.server.rest.uvicorn_internals`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import orjson

from carpool.server.rest.asgi import JSON, WATCH, Receive, RequestWatch, Scope, Send, send_response
from carpool.server.rest.uvicorn_internals import (
    UvicornProtocol,
    answering,
    rearm_keep_alive,
    set_extensions,
)
from carpool.server.statuses import Status

__all__ = ["protocol_class"]

_log = logging.getLogger("carpool.server")
_LINGER_S = 2.0  # how long the rest of a body answered before it was read may take


def protocol_class(
    *,
    header_timeout_s: float,
    limit_concurrency: int,
    write_timeout_s: float = 30.0,
    record: Callable[[int], None] | None = None,
    sent: Callable[[], None] | None = None,
) -> type[_LimitedProtocol]:
    """The protocol uvicorn runs (``uvicorn.Config(http=...)``), with these limits;
    ``record(status)`` counts each answer it gives itself, before any app sees a request
    (a header timeout's 408, the 503 past the limit, a malformed request's 400); ``sent()``
    is called as each answer's last bytes are written (a front end's counts are committed
    then: :mod:`carpool.server.frontends.tallies`)."""
    counted = record or _uncounted
    past_limit = _overloaded_app(limit_concurrency, counted)

    class Configured(_LimitedProtocol):
        _header_timeout_s = header_timeout_s
        _write_timeout_s = write_timeout_s
        overloaded = staticmethod(past_limit)
        record = staticmethod(counted)
        _sent = staticmethod(sent or _nothing)

    return Configured


def _uncounted(status: int) -> None:
    pass


def _nothing() -> None:
    pass


class _LimitedProtocol(UvicornProtocol):
    _header_timeout_s = 10.0
    _sent: Callable[[], None] = staticmethod(_nothing)
    _header_timer: asyncio.TimerHandle | None = None
    _partial = False  # part of a request's head has arrived
    _linger: asyncio.TimerHandle | None = None  # answered before its body was read
    _write_timeout_s = 30.0
    _write_timer: asyncio.TimerHandle | None = None  # armed while the client reads nothing
    # The watches of this connection's requests not yet answered, oldest first (more than
    # one only when requests are pipelined).
    _watches: list[RequestWatch]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._watches = []
        super().connection_made(transport)
        if not transport.is_closing():  # (closed: the drain began during its TLS handshake)
            self._start_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._header_timer = _cancelled(self._header_timer)
        self._write_timer = _cancelled(self._write_timer)
        self._linger = _cancelled(self._linger)
        super().connection_lost(exc)
        watches, self._watches = self._watches, []
        for watch in watches:
            watch.mark_gone()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        watch = RequestWatch()
        self._watches.append(watch)
        set_extensions(self, {WATCH: {"request": watch}})
        self._partial = True  # the timer starts when this data is parsed (data_received)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        # A request after another on the same connection whose head is not all here: time
        # it from now. One whose head came whole (the usual) never arms a timer at all.
        if self._partial and self._header_timer is None and not self.transport.is_closing():
            self._start_header_timer()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        if self._linger is not None:  # the unread body of a request answered already ended
            self._linger = _cancelled(self._linger)
            # what uvicorn armed at the answer, and the body's bytes cancelled
            rearm_keep_alive(self)
            return
        if self._watches:
            self._watches[-1].body_complete = True

    def answered(self) -> None:
        unread = bool(self._watches) and not self._watches[0].body_complete
        if self._watches:
            del self._watches[0]  # answered: its client may go now without a word
        self._sent()
        if unread and not self.transport.is_closing():
            # Answered before its body was read (a 401, a health answer, a 413 from the
            # declared length): the rest of the body is dropped as it comes (uvicorn's
            # parser does), for _LINGER_S at most. A body that ends by then leaves the
            # connection as it was; one that does not ends it, whatever still trickles in
            # (left to uvicorn, each byte would cancel its keep-alive timer and nothing would
            # re-arm it: a byte a second would hold the connection for ever).
            self._linger = _cancelled(self._linger)
            self._linger = self.loop.call_later(_LINGER_S, self._linger_over)

    def _linger_over(self) -> None:
        self._linger = None
        if not self.transport.is_closing():
            self.transport.close()

    def on_headers_complete(self) -> None:
        self._partial = False
        self._header_timer = _cancelled(self._header_timer)
        super().on_headers_complete()

    def pause_writing(self) -> None:
        """The client stopped taking its answer (the buffers are full): if it takes none
        of it for ``_write_timeout_s``, the connection is cut (its request was answered;
        nobody reads the rest), rather than held for as long as the client waits."""
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self._write_timeout_s, self._write_stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._write_timer = _cancelled(self._write_timer)

    def _write_stalled(self) -> None:
        self._write_timer = None
        if not self.transport.is_closing():
            _log.warning(
                "closed a connection whose client took none of its answer for %gs (--body-timeout)",
                self._write_timeout_s,
            )
        self.transport.abort()  # close() would wait for the buffer to drain: never

    def _start_header_timer(self) -> None:
        self._header_timer = self.loop.call_later(self._header_timeout_s, self._headers_late)

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        if self._partial and not answering(self):
            self.transport.write(_TIMED_OUT)
            self.record(Status.REQUEST_TIMEOUT)
        self.transport.close()


_TIMED_OUT_BODY = orjson.dumps(
    {"error": "the request headers did not arrive in time; raise --header-timeout"}
)
_TIMED_OUT = b"".join(
    [
        b"HTTP/1.1 %d Request Timeout\r\n" % Status.REQUEST_TIMEOUT,
        b"content-type: application/json\r\n",
        b"content-length: %d\r\n" % len(_TIMED_OUT_BODY),
        b"connection: close\r\n\r\n",
        _TIMED_OUT_BODY,
    ]
)


def _cancelled(timer: asyncio.TimerHandle | None) -> asyncio.TimerHandle | None:
    """Cancel ``timer`` if there is one; None, for the attribute that held it."""
    if timer is not None:
        timer.cancel()
    return None


def _overloaded_app(limit: int, record: Callable[[int], None]) -> Any:
    body = orjson.dumps(
        {"error": f"Overloaded: over --limit-concurrency={limit} connections; retry later"}
    )
    headers = [*JSON, (b"retry-after", b"1"), (b"connection", b"close")]

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        record(Status.UNAVAILABLE)
        await send_response(send, Status.UNAVAILABLE, body, headers)

    return app
