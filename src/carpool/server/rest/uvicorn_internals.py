"""The fence: every reach into uvicorn, uvloop or asyncio past what they document (uvicorn's
httptools protocol state and callbacks, the loops' TLS protocols, ``Server``'s signals), named
for what it relies on. ``tests/server/rest/test_uvicorn_internals.py`` checks each assumption
against the installed versions, which ``pyproject.toml`` pins; no other module reads them."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import ssl
from asyncio import sslproto
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any, cast

import uvicorn
from uvicorn.protocols.http.flow_control import service_unavailable
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from carpool.server.statuses import Status

__all__ = [
    "UvicornProtocol",
    "answering",
    "rearm_keep_alive",
    "set_extensions",
    "over_tls",
    "tls_protocol_class",
    "concurrency_limit",
    "UvicornServer",
]


def _uncounted(status: int) -> None:
    pass


class UvicornProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol (``uvicorn.protocols.http.httptools_impl``), one per
    connection, as ``uvicorn.Config(http=...)`` makes it.

    A subclass may use ``transport`` and ``loop`` (uvicorn's: the connection's transport
    once made, and its loop), the asyncio and httptools callbacks it extends
    (``connection_made``, ``data_received``, ``on_message_begin``, ``on_headers_complete``,
    ``pause_writing``...), the functions below that take a protocol, and the names here:
    uvicorn's own callbacks reach a subclass only as :meth:`answered`, ``overloaded`` and
    ``record``, and a TLS connection is counted from accept by :meth:`handshaking`.
    """

    # What answers a request past ``limit_concurrency`` in place of uvicorn's own
    # (``flow_control.service_unavailable``, a plain-text 503); None keeps uvicorn's.
    overloaded: Any = None
    # Counts each answer given before any app sees the request; called here with the 400
    # that uvicorn's ``send_400_response`` gives a request httptools cannot parse.
    record: Callable[[int], None] = staticmethod(_uncounted)
    _handshaking = False  # accepted, its TLS handshake not done
    _shut = False  # shut down (the drain) before its handshake was done

    def answered(self) -> None:
        """An answer's last bytes are written (uvicorn's ``on_response_complete``, after it
        re-armed its keep-alive timer or started the next pipelined request)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # uvicorn counts it among its connections
        if self._handshaking:
            self._handshaking = False
            if self._shut:  # the drain began while it said hello: nothing to serve
                transport.close()

    def handshaking(self, done: asyncio.Future[None]) -> None:
        """Accepted, with a TLS handshake to do (``done`` when it is): counted among uvicorn's
        connections from now, as a plain one is (uvicorn counts a connection when it is made,
        which is after the handshake), so ``limit_concurrency`` and the drain see it;
        forgotten if the handshake fails, which the loop never tells the protocol."""
        self._handshaking = True
        self.connections.add(self)
        done.add_done_callback(_forget_if_failed(self))

    def shutdown(self) -> None:
        """uvicorn's ``Server.shutdown`` calls this on each of its connections, and waits
        until none is left."""
        if self._handshaking:  # the drain waits for nothing here; made later, it closes
            self._shut = True
            self.connections.discard(self)
            return
        super().shutdown()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.answered()

    def send_400_response(self, msg: str) -> None:
        self.record(Status.BAD_REQUEST)
        super().send_400_response(msg)

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        # uvicorn picks service_unavailable past limit_concurrency (and for a pipelined
        # request, which reaches here again from on_response_complete).
        if app is service_unavailable and self.overloaded is not None:
            app = self.overloaded
        super()._start_asgi_task(cycle, app)


def _forget_if_failed(protocol: UvicornProtocol) -> Callable[[asyncio.Future[None]], None]:
    """The callback of ``protocol``'s handshake: forget it among uvicorn's connections if
    the handshake failed or was cancelled."""

    def over(done: asyncio.Future[None]) -> None:
        if done.cancelled() or done.exception() is not None:
            protocol.connections.discard(protocol)

    return over


def answering(protocol: HttpToolsProtocol) -> bool:
    """Whether a request on ``protocol`` is being answered: uvicorn's ``cycle`` (the current
    request's) exists and its response is not complete."""
    return protocol.cycle is not None and not protocol.cycle.response_complete


def rearm_keep_alive(protocol: HttpToolsProtocol) -> None:
    """Arm uvicorn's keep-alive timer as its ``on_response_complete`` does, unless it is
    armed or pipelined requests wait (for when bytes that came after the answer cancelled it:
    uvicorn's ``data_received`` does)."""
    if protocol.timeout_keep_alive_task is None and not protocol.pipeline:
        protocol.timeout_keep_alive_task = protocol.loop.call_later(
            protocol.timeout_keep_alive, protocol.timeout_keep_alive_handler
        )


def set_extensions(protocol: HttpToolsProtocol, extensions: dict[str, Any]) -> None:
    """Give the request whose head has just begun these ASGI scope ``extensions``: uvicorn's
    ``on_message_begin`` made its ``scope``, which the request's cycle takes whole at
    ``on_headers_complete``."""
    protocol.scope["extensions"] = extensions


def over_tls(
    protocol: type[UvicornProtocol], context: ssl.SSLContext, *, handshake_timeout_s: float
) -> type[asyncio.Protocol]:
    """What uvicorn runs in place of ``protocol`` (``Config(http=...)``; the loop's server
    then speaks plain TCP): ``protocol`` behind the loop's own TLS protocol, made as the loop's
    server would make it but with ``handshake_timeout_s``, and counted from accept. uvicorn
    calls it as it calls a protocol class, with keyword arguments, inside the loop."""

    def accepted(**uvicorn_args: Any) -> asyncio.BaseProtocol:
        http = protocol(**uvicorn_args)
        handshake: asyncio.Future[None] = http.loop.create_future()
        http.handshaking(handshake)
        tls_class = tls_protocol_class(http.loop)
        return tls_class(
            http.loop,
            http,
            context,
            handshake,
            server_side=True,
            ssl_handshake_timeout=handshake_timeout_s,
        )

    return cast("type[asyncio.Protocol]", accepted)  # uvicorn calls it as a class


def tls_protocol_class(loop: asyncio.AbstractEventLoop) -> Callable[..., asyncio.BaseProtocol]:
    """The TLS protocol ``loop``'s own servers use: uvloop's (compiled) on uvloop, else
    asyncio's. Both are made as ``(loop, app_protocol, context, waiter, server_side=,
    ssl_handshake_timeout=)`` and set ``waiter``'s result once the handshake is done."""
    try:
        import uvloop
    except ImportError:
        return sslproto.SSLProtocol
    if isinstance(loop, uvloop.Loop):
        from uvloop.loop import SSLProtocol  # type: ignore[attr-defined]  # (not in its stubs)

        return SSLProtocol  # type: ignore[no-any-return]
    return sslproto.SSLProtocol


def concurrency_limit(limit: int) -> int | None:
    """uvicorn's ``limit_concurrency`` for at most ``limit`` connections served (0: no
    limit): uvicorn counts the connection asking among those open, so N + 1 lets N be
    served."""
    return limit + 1 if limit else None


class UvicornServer(uvicorn.Server):
    """``uvicorn.Server``, its state and signal handling behind named methods.

    A signal does not end the process with that signal once the drain is done (uvicorn
    re-raises the signals its ``handle_exit`` recorded, which would make a clean drain look
    like a kill to process supervisors), and :meth:`on_signal` hears each first.
    """

    def __init__(self, config: uvicorn.Config, *, tls: ssl.SSLContext | None) -> None:
        super().__init__(config)
        self._tls = tls  # the protocol's TLS, not uvicorn's: for the started message

    def on_signal(self, sig: int, *, first: bool, forced: bool) -> None:
        """SIGTERM or SIGINT came (or :meth:`stop`): ``first`` when no stop came before,
        ``forced`` for a second SIGINT (the drain stops waiting for connections)."""

    def stop(self) -> None:
        """Drain and end, as SIGTERM does."""
        self.handle_exit(signal.SIGTERM, None)

    def stopping(self) -> bool:
        """Whether a signal (or :meth:`stop`) came."""
        return self.should_exit

    def started_up(self) -> bool:
        """Whether startup completed (the lifespan's, then listening)."""
        return self.started

    def serve_to_end(self, sockets: list[socket.socket] | None = None) -> None:
        """Serve until a signal and its drain, on ``sockets`` else the configured port; a
        failed startup returns too (uvicorn exits 3: SystemExit), with ``started_up()``
        False."""
        with contextlib.suppress(SystemExit):
            self.run(sockets=sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # uvicorn's capture_signals installs this for SIGINT and SIGTERM; uvicorn's own
        # also appends sig to _captured_signals, re-raised after shutdown: not here.
        forced = self.should_exit and sig == signal.SIGINT
        self.on_signal(sig, first=not self.should_exit, forced=forced)
        if forced:
            self.force_exit = True  # a second Ctrl-C: stop waiting for connections
        else:
            self.should_exit = True

    def _log_started_message(self, listeners: Sequence[socket.SocketType]) -> None:
        # uvicorn names the scheme after its own TLS setting; TLS is the protocol's here
        self.config.ssl = self._tls
        try:
            super()._log_started_message(listeners)
        finally:
            self.config.ssl = None
