"""The REST API as a plain ASGI application: lifespan, routes, and the REST front ends (v2 JSON,
binary and raw; OpenAI's), each handing the inference path one call record
(:mod:`carpool.server.rest.calls`) and sending what comes back. Routes are matched by splitting
the path: the inference route is the hot path. Error bodies are exactly ``{"error": "..."}``,
what tritonclient reads. It starts and drains the gRPC server it is given without importing grpc."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from carpool.errors import ConfigError
from carpool.server.auth import UNAUTHORIZED, ApiKeys, is_open
from carpool.server.inference.call import Call
from carpool.server.inference.outcomes import error_status
from carpool.server.inference.path import ClientGone, Inference
from carpool.server.lifecycle.control import ModelControl, act
from carpool.server.lifecycle.load_config import request_parameters
from carpool.server.lifecycle.registry import VERSION, ServedModel, server_metadata
from carpool.server.openai import codec as openai
from carpool.server.rest import openapi
from carpool.server.rest.asgi import (
    JSON,
    Receive,
    Scope,
    Send,
    request_watch,
    send_json,
    send_response,
)
from carpool.server.rest.bodies import read_body, request_headers
from carpool.server.rest.calls import (
    HTTP,
    OPENAI,
    Received,
    Sent,
    embeddings_call,
    v2_call,
    withdrawal,
)
from carpool.server.rest.codec import (
    encode_error,
    parse_index_request,
)
from carpool.server.rest.completions import ROUTES, answer_completion, completion_call
from carpool.server.rest.generate import EVENT_STREAM, error_event, event, generate_call
from carpool.server.statuses import STOPPING, HTTPError, Status, is_server_error
from carpool.server.telemetry.logs import access_log, log_access
from carpool.server.telemetry.metrics import Metrics

if TYPE_CHECKING:  # built by serve, only when the gRPC port is on: grpc is not imported here
    from carpool.server.grpc.service import GrpcServer

__all__ = ["App"]

LOADS = ("load", "unload")  # /v2/repository/models/NAME/...
_INFERENCE = ("infer", "generate", "generate_stream")  # /v2/models/NAME/..., POSTed

log = logging.getLogger("carpool.server")
Answering = Callable[[Call[Any, Any], Send], Awaitable[int]]  # sends a call's answer: its status


class App:
    """ASGI application serving the models of ``inference``'s registry; it starts and
    drains ``grpc`` (None: REST only) with them."""

    def __init__(
        self,
        inference: Inference,
        *,
        max_body_bytes: int,
        drain_timeout_s: float = 30.0,
        metrics: Metrics | None = None,
        grpc: GrpcServer | None = None,
        api_keys: ApiKeys | None = None,
        metrics_need_key: bool = False,
        body_timeout_s: float | None = None,
        max_client_batch_size: int | None = None,
        control: ModelControl | None = None,
    ) -> None:
        self.inference = inference
        self.control = control  # None: models load at start only (load/unload are 503)
        self.max_client_batch_size = max_client_batch_size  # texts per /v1/embeddings call
        self.registry = inference.registry
        self.api_keys = api_keys  # None: every route is open
        self.metrics_need_key = metrics_need_key
        self.body_timeout_s = body_timeout_s
        self.max_body_bytes = max_body_bytes
        self.drain_timeout_s = drain_timeout_s
        self.metrics = metrics if metrics is not None else Metrics(self.registry)
        self.recorder = inference.recorder  # every answer, the inference path's too
        self.startup_error: Exception | None = None  # why startup failed, if it did
        self._started: list[ServedModel] = []
        self._drain_deadline: float | None = None  # monotonic; set when draining begins
        self._grpc = grpc

    @property
    def grpc_address(self) -> str | None:
        """``host:port`` of the gRPC API; None: REST only."""
        return None if self._grpc is None else self._grpc.address

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    # ------------------------------------------------------------- lifespan

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:
                    self.startup_error = exc
                    if isinstance(exc, ConfigError):  # says what to do; no traceback
                        log.error("startup failed: %s", exc)
                    else:
                        log.exception("startup failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def startup(self) -> None:
        """Start every model's batcher on this loop (:meth:`Registry.start`), then the
        gRPC server. A failed startup closes the batchers it started (and with them their
        worker processes)."""
        self._started = await self.registry.start()
        if self.control is not None:
            self.control.start()
        try:
            if self._grpc is not None:
                try:
                    await self._grpc.start()
                except Exception:
                    self._grpc = None  # it never listened: nothing of it to drain
                    raise
        except Exception:
            await self.shutdown()  # the batchers just started, idle: they close at once
            raise
        self.registry.ready = True
        if self.registry.local:  # else the main process said it, once for every front end
            self.registry.describe()

    def begin_drain(self) -> None:
        """Not ready any more, and the drain timeout starts now: it bounds the whole drain
        (the HTTP server's wait for requests in flight, then the batchers' close), not
        each step of it."""
        self.registry.ready = False
        if self._drain_deadline is None:
            self._drain_deadline = time.monotonic() + self.drain_timeout_s
            if self._grpc is not None:  # stops accepting calls; the same deadline
                self._grpc.begin_drain(self._drain_deadline)

    async def shutdown(self) -> None:
        """Not ready any more; every batcher finishes what it accepted, within what is left
        of the drain timeout, after which what is left gets 503 (a hung model call is
        abandoned)."""
        self.begin_drain()
        assert self._drain_deadline is not None
        started, self._started = self._started, []
        if self.control is not None:  # loads and unloads end first; then what serves closes
            await self.control.close(timeout=max(0.0, self._drain_deadline - time.monotonic()))
            started = list(self.registry)
        left = max(0.0, self._drain_deadline - time.monotonic())
        await self.registry.close(started, timeout=left)
        if self._grpc is not None:  # its calls were answered as their batchers closed
            await self._grpc.wait_stopped()
        self.inference.admissions.close()

    # ------------------------------------------------------------- http

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        method = scope["method"]
        parts = scope["path"].strip("/").split("/")
        call: Call[Any, Any] | None = None  # once handed over, the inference path counts
        try:
            if self.api_keys is not None and self._refused(self.api_keys, parts, scope):
                bearer = [(b"www-authenticate", b"Bearer")]
                raise HTTPError(Status.UNAUTHORIZED, UNAUTHORIZED, bearer)
            call, answer = self._call(method, parts, scope, receive)
            if call is None:
                status = await self._route(method, parts, scope, receive, send)
            else:
                status = await answer(call, send)
        except asyncio.CancelledError:
            # The server gave up on this request (drain timeout): answer it with a 503, not
            # the server's plain-text 500 and an error traceback for an expected end.
            stopping = HTTPError(Status.UNAVAILABLE, STOPPING)
            self._count(call, parts, stopping.status)
            try:
                body = _error_body(parts, stopping, stopping)
                await send_response(send, stopping.status, body, JSON)
            except Exception:  # the client is gone too: nothing left to answer
                raise asyncio.CancelledError from None
            status = stopping.status
        except Exception as exc:
            error = error_status(exc)
            status = error.status
            if is_server_error(status) and not isinstance(exc, HTTPError):
                log.warning("%s %s -> %d: %s", method, scope["path"], status, error.message)
            self._count(call, parts, status)
            await send_response(send, status, _error_body(parts, exc, error), JSON + error.headers)
        else:
            self._count(call, parts, status)
        if access_log.isEnabledFor(logging.INFO):
            log_access(scope.get("client"), method, scope["path"], status, started)

    def _count(self, call: Call[Any, Any] | None, parts: list[str], status: int) -> None:
        """Count an answer the server's, unless it answers a ``call`` the inference path took
        (which counted it, whatever it ended in): each answer once."""
        if call is None:
            self.recorder.record(OPENAI if parts[0] == "v1" else HTTP, status)

    def _refused(self, keys: ApiKeys, parts: list[str], scope: Scope) -> bool:
        """Whether a request needs a key and presents none of ``keys`` (401, no detail)."""
        if is_open(parts, metrics_need_key=self.metrics_need_key):
            return False
        return not keys.allows(scope["headers"])

    async def _route(
        self, method: str, parts: list[str], scope: Scope, receive: Receive, send: Send
    ) -> int:
        if parts == ["metrics"]:
            _allow(method, "GET")
            await self.registry.refresh()
            body = self.metrics.render()
            await send_response(send, 200, body, [(b"content-type", self.metrics.content_type)])
            return 200
        if parts[0] == "v1":
            return await self._openai(method, parts[1:], scope, receive, send)
        if not parts or parts[0] != "v2":
            raise _not_found(scope)
        rest = parts[1:]
        if not rest:
            _allow(method, "GET")
            return await send_json(send, 200, server_metadata())
        if rest == ["openapi.json"]:
            _allow(method, "GET")
            return await send_json(send, 200, openapi.document(VERSION))
        if rest[0] == "health" and len(rest) == 2 and rest[1] in ("live", "ready"):
            _allow(method, "GET")
            if rest[1] == "live":
                return await send_json(send, 200, {"live": True})
            if self.registry.is_ready():
                return await send_json(send, 200, {"ready": True})
            not_ready = {"ready": False, "error": "Server is not ready"}
            return await send_json(send, Status.UNAVAILABLE, not_ready)
        if rest[0] == "models":
            return await self._models(method, rest[1:], scope, receive, send)
        if rest == ["repository", "index"]:
            _allow(method, "POST")  # Triton's model repository extension
            body = await self._body(scope, receive)
            index = self.registry.index(ready_only=parse_index_request(body))
            return await send_json(send, 200, index)
        if rest[:2] == ["repository", "models"] and len(rest) == 4 and rest[3] in LOADS:
            _allow(method, "POST")
            parameters = request_parameters(await self._body(scope, receive))
            await act(self.control, rest[2], rest[3], parameters)
            await send_response(send, 200, b"", JSON)
            return 200
        raise _not_found(scope)

    async def _models(
        self, method: str, rest: list[str], scope: Scope, receive: Receive, send: Send
    ) -> int:
        if rest == ["stats"]:
            _allow(method, "GET")
            await self.registry.refresh()
            return await send_json(
                send, 200, {"model_stats": [m.statistics() for m in self.registry]}
            )
        route = _model_route(rest)
        if route is None:
            raise _not_found(scope)
        name, version, action = route
        if action == "ready" and name in self.registry.load_failures:
            _allow(method, "GET")
            reason = self.registry.load_failures[name].reason
            failed = {"name": name, "ready": False, "error": reason}
            return await send_json(send, Status.UNAVAILABLE, failed)
        served = self.registry.get(name, version)
        if action in _INFERENCE:  # not a POST: a POST went to the inference path (_call)
            raise _not_allowed("POST")
        _allow(method, "GET")
        if action == "":
            return await send_json(send, 200, served.metadata())
        if action == "ready":
            if self.registry.model_ready(served):
                return await send_json(send, 200, {"name": served.name, "ready": True})
            not_ready = {"name": served.name, "ready": False, "error": "Model not ready"}
            return await send_json(send, Status.UNAVAILABLE, not_ready)
        if action == "config":
            return await send_json(send, 200, served.config())
        await self.registry.refresh()
        return await send_json(send, 200, {"model_stats": [served.statistics()]})

    def _call(
        self, method: str, parts: list[str], scope: Scope, receive: Receive
    ) -> tuple[Call[Any, Any] | None, Answering]:
        """The call record of an inference request (``POST`` to a model's ``infer``,
        ``generate`` or ``generate_stream``, or to OpenAI's ``/v1`` inference routes), for
        the inference path, and what answers it; None for any other request."""
        if method != "POST":
            return None, self._infer
        if parts == ["v1", "embeddings"]:
            return self._embeddings_call(scope, receive), self._infer
        body = partial(self._body, scope, receive)
        kind = ROUTES.get(tuple(parts[1:])) if parts[0] == "v1" else None
        if kind is not None:
            withdrawn = withdrawal(scope, receive)
            call = completion_call(kind, body, withdrawn, self.max_client_batch_size)
            return call, partial(answer_completion, self.inference)
        route = _model_route(parts[2:]) if parts[:2] == ["v2", "models"] else None
        if route is None or route[2] not in _INFERENCE:
            return None, self._infer
        name, version, action = route
        withdrawn = withdrawal(scope, receive)
        if action == "infer":
            read = partial(self._received, scope, receive)
            return v2_call(name, version, read, withdrawn), self._infer
        streamed = action == "generate_stream"
        return generate_call(
            name, version, body, withdrawn
        ), self._stream if streamed else self._infer

    async def _infer(self, call: Call[Any, Any], send: Send) -> int:
        """``call`` through the inference path, which counts it; its answer sent."""
        try:
            answer = await self.inference.infer(call)
        except ClientGone:
            return Status.CLIENT_CLOSED  # nobody to answer
        if isinstance(answer, bytes):  # generate: one JSON object
            await send_response(send, 200, answer, JSON)
        else:
            await send_response(send, 200, *answer)
        return 200

    async def _stream(self, call: Call[Any, bytes], send: Send) -> int:
        """``call``'s steps as server-sent events, one per step; an error before the first
        is an ordinary error response, after it an ``{"error": ...}`` event that ends it."""
        started = False

        async def emit(data: bytes) -> None:
            nonlocal started
            if not started:
                started = True
                await send({"type": "http.response.start", "status": 200, "headers": EVENT_STREAM})
            await send({"type": "http.response.body", "body": event(data), "more_body": True})

        try:
            await self.inference.stream(call, emit)
        except ClientGone:
            return Status.CLIENT_CLOSED
        except (Exception, asyncio.CancelledError) as exc:
            if not started:
                raise
            error = (
                HTTPError(Status.UNAVAILABLE, STOPPING)
                if isinstance(exc, asyncio.CancelledError)
                else error_status(exc)
            )
            last = error_event(error.message)
            await send({"type": "http.response.body", "body": last, "more_body": False})
            return 200
        if not started:
            await send({"type": "http.response.start", "status": 200, "headers": EVENT_STREAM})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return 200

    async def _received(self, scope: Scope, receive: Receive) -> Received:
        """A v2 inference request as it came: the parts its decoding (and its replay from
        the response cache) depend on."""
        headers = request_headers(scope)
        body = await self._read_body(headers, scope, receive)
        length = headers.get(b"inference-header-content-length")
        return length, headers.get(b"content-type"), body

    async def _openai(
        self, method: str, rest: list[str], scope: Scope, receive: Receive, send: Send
    ) -> int:
        """OpenAI's routes (:mod:`carpool.server.openai.codec`), for the models that opted in."""
        if rest == ["embeddings"] or tuple(rest) in ROUTES:
            raise _not_allowed("POST")  # a POST went to the inference path (_call)
        if rest == ["models"]:
            _allow(method, "GET")
            entries = [
                openai.model_entry(m.name, m.created) for m in self.registry if m.model.openai
            ]
            return await send_json(send, 200, openai.model_list(entries))
        if len(rest) == 2 and rest[0] == "models" and rest[1]:
            _allow(method, "GET")
            served = self.registry.get(rest[1])
            openai.check_opted_in(served.model)
            return await send_json(send, 200, openai.model_entry(served.name, served.created))
        raise _not_found(scope)

    def _embeddings_call(self, scope: Scope, receive: Receive) -> Call[Any, Sent]:
        """One request of k texts, through the inference path the v2 route takes; OpenAI's
        bodies in and out. Its body names the model: counted the server's until then."""

        async def read() -> dict[str, Any]:
            return openai.json_body(await self._body(scope, receive))

        return embeddings_call(read, withdrawal(scope, receive), self.max_client_batch_size)

    async def _body(self, scope: Scope, receive: Receive) -> bytes:
        return await self._read_body(request_headers(scope), scope, receive)

    async def _read_body(
        self, headers: dict[bytes, bytes], scope: Scope, receive: Receive
    ) -> bytes:
        watch = request_watch(scope)
        arrived = watch is not None and watch.body_complete
        return await read_body(
            headers, receive, self.max_body_bytes, timeout_s=self.body_timeout_s, arrived=arrived
        )


def _model_route(rest: list[str]) -> tuple[str, str | None, str] | None:
    """``NAME[/versions/VERSION][/ACTION]`` below ``/v2/models``: name, version (None: the
    one served) and action ("" for the metadata); None for no model route."""
    if not rest or not rest[0]:
        return None
    name, tail = rest[0], rest[1:]
    version = None
    if len(tail) >= 2 and tail[0] == "versions":
        version, tail = tail[1], tail[2:]
    action = tail[0] if tail else ""
    if len(tail) > 1 or action not in ("", "ready", "config", "stats", *_INFERENCE):
        return None
    return name, version, action


def _error_body(parts: list[str], exc: BaseException, error: HTTPError) -> bytes:
    """OpenAI's error shape under ``/v1``, the v2 one elsewhere; the same status either way."""
    if parts[0] == "v1":
        return openai.encode_error(exc, error)
    return encode_error(error.message)


def _not_found(scope: Scope) -> HTTPError:
    return HTTPError(Status.NOT_FOUND, f"Not Found: {scope['path']}")


def _allow(method: str, allowed: str) -> None:
    if method != allowed:
        raise _not_allowed(allowed)


def _not_allowed(allowed: str) -> HTTPError:
    return HTTPError(
        Status.METHOD_NOT_ALLOWED, "Method Not Allowed", [(b"allow", allowed.encode())]
    )
