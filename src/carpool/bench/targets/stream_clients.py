"""Streams of a step-wise model behind a server, as ``carpool bench --stream`` sends them:
generate_stream's server-sent events over HTTP, or a ModelStreamInfer call per stream over
gRPC; each output's arrival timed, nothing parsed but what marks an output or an error."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any

from carpool.bench.targets.base import Send, Streamed
from carpool.bench.targets.grpc_target import SERVICE, _aio, _channel, _stubs, encode_request
from carpool.bench.targets.http_target import KEEPALIVE_S
from carpool.bench.targets.stream_requests import StreamRequest

__all__ = [
    "STREAM_ERROR",
    "GrpcStreamClient",
    "SseClient",
    "encode_stream_request",
    "sse_sends",
    "stream_bodies",
]

STREAM = SERVICE + "/ModelStreamInfer"
EMPTY_FINAL = "triton_enable_empty_final_response"  # the end comes as an empty response
STREAM_ERROR = "StreamError"  # the kind of an error that arrives inside a stream
_EVENT = b"data: "
_ERROR_EVENT = b'data: {"error"'
_JSON = {"Content-Type": "application/json"}


@asynccontextmanager
async def sse_sends(
    url: str,
    bodies: Sequence[bytes],
    timeout_s: float,
    connections: int,
    output: Callable[[bytes], bool | None],
    errors: type[Exception] | tuple[type[Exception], ...] = (),
) -> AsyncIterator[Send]:
    """The ``send`` of a client process POSTing ``bodies`` over a keep-alive pool and timing
    each line of an answer that ``output`` calls one; a line it gives None, or any of
    ``errors`` raised, is a :data:`STREAM_ERROR`. ``timeout_s`` bounds each next line."""
    import aiohttp

    connector = aiohttp.TCPConnector(
        limit=connections, limit_per_host=connections, keepalive_timeout=KEEPALIVE_S
    )
    timeout = aiohttp.ClientTimeout(total=None, sock_read=timeout_s)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, skip_auto_headers=("User-Agent",)
    ) as session:
        post, clock = session.post, time.perf_counter

        async def send(i: int) -> str | Streamed | None:
            sent = clock()
            arrivals: list[float] = []
            try:
                async with post(url, data=bodies[i % len(bodies)], headers=_JSON) as answer:
                    if answer.status != 200:
                        await answer.read()
                        return str(answer.status)
                    async for line in answer.content:
                        is_output = output(line)
                        if is_output is None:
                            return STREAM_ERROR
                        if is_output:
                            arrivals.append(clock())
            except errors:
                return STREAM_ERROR
            except Exception as exc:  # any failure is counted by its kind, never raised
                return type(exc).__name__
            return Streamed.of(sent, arrivals)

        yield send


def _generate_event(line: bytes) -> bool | None:
    """Each ``data:`` event an output; an ``{"error": ...}`` one None (the stream failed)."""
    if line.startswith(_ERROR_EVENT):
        return None
    return line.startswith(_EVENT)


@dataclass(frozen=True, slots=True)
class SseClient:
    """generate_stream bodies POSTed over a keep-alive pool; each ``data:`` event an output,
    an ``{"error": ...}`` event a :data:`STREAM_ERROR`. Picklable: each client process
    opens its own. ``timeout_s`` bounds the wait for each next event, not the stream."""

    url: str
    bodies: tuple[bytes, ...]
    timeout_s: float

    def open(self, connections: int) -> AbstractAsyncContextManager[Send]:
        return sse_sends(self.url, self.bodies, self.timeout_s, connections, _generate_event)


def encode_stream_request(
    request: StreamRequest, spec: Any, *, model: str, version: str = ""
) -> bytes:
    """One serialized ``ModelInferRequest`` for a ModelStreamInfer call: the request's
    inputs, its parameters as ``int64_param``, and an empty final response asked for."""
    pb = _stubs()[0]
    message = pb.ModelInferRequest.FromString(
        encode_request(request.values, spec, model=model, version=version)
    )
    for key, value in request.parameters.items():
        message.parameters[key].int64_param = value
    message.parameters[EMPTY_FINAL].bool_param = True
    return bytes(message.SerializeToString())


@dataclass(frozen=True, slots=True)
class GrpcStreamClient:
    """A ModelStreamInfer call per stream, over one channel: one request written, each
    response with outputs an output, the empty final one the end. Picklable. ``timeout_s``
    bounds the whole call."""

    address: str
    bodies: tuple[bytes, ...]
    timeout_s: float

    @asynccontextmanager
    async def open(self, connections: int) -> AsyncIterator[Send]:
        rpc_error = _aio().AioRpcError
        parse = _stubs()[0].ModelStreamInferResponse.FromString
        async with _channel(self.address) as channel:
            call = channel.stream_stream(STREAM, response_deserializer=parse)
            bodies, timeout, clock = self.bodies, self.timeout_s, time.perf_counter

            async def send(i: int) -> str | Streamed | None:
                sent = clock()
                arrivals: list[float] = []
                try:
                    async for response in call(iter([bodies[i % len(bodies)]]), timeout=timeout):
                        if response.error_message:
                            return STREAM_ERROR
                        if response.infer_response.outputs:
                            arrivals.append(clock())
                except rpc_error as exc:  # counted by its status code: "UNAVAILABLE", ...
                    return str(exc.code().name)
                except Exception as exc:  # any other failure is counted by its kind
                    return type(exc).__name__
                return Streamed.of(sent, arrivals)

            yield send


def stream_bodies(
    requests: Sequence[StreamRequest], spec: Any, model: str, version: str
) -> tuple[bytes, ...]:
    """Every request encoded once for :class:`GrpcStreamClient`."""
    return tuple(encode_stream_request(r, spec, model=model, version=version) for r in requests)
