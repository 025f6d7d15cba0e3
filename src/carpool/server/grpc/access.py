"""Who may call the gRPC API, how many at once, and over what: the interceptor every call passes
first (:class:`Access`), and the TLS port; keys and certificate are REST's. A call refused here
or by grpc before its handler is counted under what happened: a key refused 401, over
``--grpc-max-concurrent-rpcs`` 503, unimplemented 405, too large 413, unparsable 400."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from carpool.server.auth import OPEN_RPCS, UNAUTHORIZED, ApiKeys
from carpool.server.statuses import Status

__all__ = ["Access", "add_port"]


def add_port(server: Any, address: str, tls: tuple[str, str] | None) -> int:
    """Listen on ``address``, over TLS with ``tls`` = (certfile, keyfile); the port bound,
    0 when it cannot (grpc's own convention)."""
    if tls is None:
        return int(server.add_insecure_port(address))
    certfile, keyfile = (Path(p).read_bytes() for p in tls)
    credentials = grpc.ssl_server_credentials([(keyfile, certfile)])
    return int(server.add_secure_port(address, credentials))


class _Unparsed:
    """A unary call's message that did not parse: its handler refuses it."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


class Access(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Every call, before its handler runs: refused without one of ``keys`` (None: every
    call is open) or past ``max_calls`` under way (0: no limit), each refusal counted with
    ``record(status)``; a unary call grpc ends before its handler runs is counted too."""

    def __init__(
        self, record: Callable[[int], None], *, keys: ApiKeys | None = None, max_calls: int = 0
    ) -> None:
        self._record = record
        self._keys = keys
        self._max_calls = max_calls
        self._calls = 0  # under way: let through, not yet ended
        self._unstarted: set[asyncio.Task[Any]] = set()  # unary calls whose handler has not run
        self._handlers: dict[Any, Any] = {}  # grpc's handler -> the same, noting it ran

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(details)
        if handler is None:  # grpc answers UNIMPLEMENTED "Method not found!"
            self._record(Status.METHOD_NOT_ALLOWED)
            return None
        if self._max_calls and self._calls >= self._max_calls:
            self._record(Status.UNAVAILABLE)
            message = (
                f"more than {self._max_calls} calls at once (--grpc-max-concurrent-rpcs); "
                "retry when fewer are under way"
            )
            return _refusal(handler, grpc.StatusCode.RESOURCE_EXHAUSTED, message)
        if not self._allows(details):
            self._record(Status.UNAUTHORIZED)
            return _refusal(handler, grpc.StatusCode.UNAUTHENTICATED, UNAUTHORIZED)
        task = asyncio.current_task()  # the call's own, until its status is sent
        assert task is not None
        self._calls += 1
        task.add_done_callback(self._ended)
        if handler.request_streaming or handler.response_streaming:
            return handler  # its handler runs before any message is read
        self._unstarted.add(task)
        noted = self._handlers.get(handler)
        if noted is None:
            noted = self._handlers[handler] = self._noting(handler)
        return noted

    def _allows(self, details: grpc.HandlerCallDetails) -> bool:
        if self._keys is None or details.method in OPEN_RPCS:
            return True
        metadata = details.invocation_metadata or ()
        return self._keys.allows((key.encode(), _bytes(value)) for key, value in metadata)

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._calls -= 1
        if task in self._unstarted:  # grpc read no message it could hand over
            self._unstarted.discard(task)
            self._record(Status.CONTENT_TOO_LARGE)

    def _noting(self, handler: Any) -> Any:
        """``handler`` (unary), noting that it ran, and refusing a message that does not
        parse with ``INVALID_ARGUMENT``."""
        behavior, parse = handler.unary_unary, handler.request_deserializer
        unstarted, record = self._unstarted, self._record

        def deserialize(raw: bytes) -> Any:
            try:
                return parse(raw)
            except Exception as exc:  # protobuf's DecodeError
                return _Unparsed(exc)

        async def run(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            unstarted.discard(asyncio.current_task())
            if isinstance(request, _Unparsed):
                record(Status.BAD_REQUEST)
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"the request message cannot be parsed: {request.error}",
                )
            return await behavior(request, context)

        return grpc.unary_unary_rpc_method_handler(
            run,
            request_deserializer=None if parse is None else deserialize,
            response_serializer=handler.response_serializer,
        )


def _bytes(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


def _refusal(handler: Any, code: grpc.StatusCode, message: str) -> Any:
    """A handler of ``handler``'s kind that ends the call with ``code`` and ``message``, its
    message left unparsed (no deserializer: a refused call costs no protobuf parse)."""

    async def refuse(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(code, message)

    options = {"request_deserializer": None, "response_serializer": handler.response_serializer}
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse, **options)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse, **options)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse, **options)
    return grpc.unary_unary_rpc_method_handler(refuse, **options)
