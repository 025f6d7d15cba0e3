"""Who may call the gRPC API, and over what: the API-key interceptor and the TLS port.

The same keys and certificate as REST's (``--api-key``, ``--ssl-certfile``/``--ssl-keyfile``):
a call presents a key in its metadata (``authorization: Bearer KEY`` or ``x-api-key: KEY``),
checked by :mod:`carpool.server.auth`; without one of the keys it ends ``UNAUTHENTICATED``
with the message ``unauthorized`` and nothing more. ``ServerLive`` and ``ServerReady`` stay
open, as REST's health routes. Only :mod:`carpool.server.grpc_service` imports it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from carpool.server.auth import OPEN_RPCS, UNAUTHORIZED, ApiKeys

__all__ = ["ApiKeyInterceptor", "add_port", "interceptors"]


def interceptors(api_keys: ApiKeys | None) -> list[grpc.aio.ServerInterceptor]:
    """The server's interceptors: the key check when there are ``api_keys``, else none."""
    return [] if api_keys is None else [ApiKeyInterceptor(api_keys)]


def add_port(server: Any, address: str, tls: tuple[str, str] | None) -> int:
    """Listen on ``address``, over TLS with ``tls`` = (certfile, keyfile); the port bound,
    0 when it cannot (grpc's own convention)."""
    if tls is None:
        return int(server.add_insecure_port(address))
    certfile, keyfile = (Path(p).read_bytes() for p in tls)
    credentials = grpc.ssl_server_credentials([(keyfile, certfile)])
    return int(server.add_secure_port(address, credentials))


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Calls without one of ``keys`` in their metadata end ``UNAUTHENTICATED``, before
    their handler runs (a streaming call before it reads a message)."""

    def __init__(self, keys: ApiKeys) -> None:
        self._keys = keys

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(details)
        if handler is None or details.method in OPEN_RPCS:
            return handler
        metadata = details.invocation_metadata or ()
        pairs = ((key.encode(), _bytes(value)) for key, value in metadata)
        if self._keys.allows(pairs):
            return handler
        return _refusal(handler)


def _bytes(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


async def _refuse(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHORIZED)


def _refusal(handler: Any) -> Any:
    """A handler of ``handler``'s kind that refuses the call, its message left unparsed
    (no deserializer: a refused call costs no protobuf parse of what it sent)."""
    options = {"request_deserializer": None, "response_serializer": handler.response_serializer}
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(_refuse, **options)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(_refuse, **options)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(_refuse, **options)
    return grpc.unary_unary_rpc_method_handler(_refuse, **options)
