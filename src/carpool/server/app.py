"""The v2 REST API as a plain ASGI application: lifespan, routes and the inference endpoint.

Routes are matched by splitting the path, not by a framework: the inference path is the hot
path, and a handful of fixed routes needs no more. Whatever a request ends in is answered
with the status :func:`~carpool.server.statuses.error_status` gives it, and an error body
that is exactly ``{"error": "<message>"}``, which is what tritonclient reads (under ``/v1``,
OpenAI's routes, the same status in OpenAI's shape: :mod:`carpool.server.openai`). Bodies are
read by :mod:`carpool.server.bodies`; the wire format is :mod:`carpool.server.requests` and
:mod:`carpool.server.responses`. Only :mod:`carpool.server.serve` imports it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from importlib.metadata import version as _version
from typing import TYPE_CHECKING, Any

from carpool.errors import BatcherClosed, ConfigError, WorkerStartError
from carpool.model import Model
from carpool.server import openai, openapi
from carpool.server.asgi import (
    JSON,
    Receive,
    Scope,
    Send,
    send_json,
    send_response,
    unless_disconnected,
)
from carpool.server.auth import UNAUTHORIZED, ApiKeys, is_open
from carpool.server.bodies import read_body
from carpool.server.inference import AdmittedRequest, admit, respond
from carpool.server.messages import HEADER_LENGTH, InferRequest, ProtocolError
from carpool.server.metrics import Metrics
from carpool.server.registry import Registry, ServedModel
from carpool.server.requests import (
    check_raw_content_type,
    parse_header_length,
    parse_index_request,
    parse_infer_request,
    parse_raw_request,
)
from carpool.server.responses import encode_error, encode_infer_response
from carpool.server.statuses import CLIENT_CLOSED, STOPPING, HTTPError, error_status

if TYPE_CHECKING:
    from carpool.server.grpc_service import GrpcServer

__all__ = ["App"]

log = logging.getLogger("carpool.server")
_VERSION = _version("carpool")  # from the installed metadata: pyproject.toml holds it once
access_log = logging.getLogger("carpool.access")

EXTENSIONS = ["binary_tensor_data", "model_configuration", "statistics", "schedule_policy"]
# Elements one request may carry (2**31, Triton's limit): checked before anything is allocated.
MAX_ELEMENTS = 2**31


class App:
    """ASGI application serving the models of ``registry``."""

    def __init__(
        self,
        registry: Registry,
        *,
        max_body_bytes: int,
        drain_timeout_s: float = 30.0,
        metrics: Metrics | None = None,
        grpc_address: str | None = None,
        api_keys: ApiKeys | None = None,
        metrics_need_key: bool = False,
        tls: tuple[str, str] | None = None,
        body_timeout_s: float | None = None,
    ) -> None:
        self.registry = registry
        self.grpc_address = grpc_address  # "host:port" of the gRPC API; None: REST only
        self.api_keys = api_keys  # None: every route is open
        self.metrics_need_key = metrics_need_key
        self.tls = tls  # (certfile, keyfile) REST's server serves; the gRPC port too
        self.body_timeout_s = body_timeout_s
        self.max_body_bytes = max_body_bytes
        self.drain_timeout_s = drain_timeout_s
        self.metrics = metrics if metrics is not None else Metrics(registry)
        self.ready = False  # true between startup and the start of shutdown
        self.startup_error: Exception | None = None  # why startup failed, if it did
        self._started: list[ServedModel] = []
        self._drain_deadline: float | None = None  # monotonic; set when draining begins
        self._grpc: GrpcServer | None = None

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
        """Start every model's batcher on this loop. A model whose worker processes all
        failed to load is unavailable, with the reason, like a broken repository folder;
        the others serve (and if none is left, startup fails)."""
        for served in list(self.registry):
            try:
                await served.batcher.__aenter__()
            except WorkerStartError as exc:
                self.registry.fail(served.name, exc.reason)
                continue
            self._started.append(served)
        if not self._started:
            failures = self.registry.load_failures.values()
            problems = "; ".join(f"{f.name}: {f.reason}" for f in failures)
            raise ConfigError(f"no model could start ({problems})")
        if self.grpc_address is not None:
            await self._start_grpc(self.grpc_address)
        self.ready = True
        for served in self.registry:
            log.info("serving model %r: %s", served.name, served.describe())
        for failure in self.registry.load_failures.values():
            log.error("model %r is unavailable: %s", failure.name, failure.reason)

    async def _start_grpc(self, address: str) -> None:
        # Imported here: grpc and tritonclient load only when the gRPC port is on.
        from carpool.server.grpc_service import GrpcServer

        self._grpc = GrpcServer(self, address, max_message_bytes=self.max_body_bytes)
        try:
            await self._grpc.start()
        except ConfigError:
            self._grpc = None
            await self.shutdown()  # the batchers just started, idle: they close at once
            raise

    def begin_drain(self) -> None:
        """Not ready any more, and the drain timeout starts now: it bounds the whole drain
        (the HTTP server's wait for requests in flight, then the batchers' close), not
        each step of it."""
        self.ready = False
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
        left = max(0.0, self._drain_deadline - time.monotonic())
        started, self._started = self._started, []
        await asyncio.gather(*(served.batcher.aclose(timeout=left) for served in started))
        if self._grpc is not None:  # its calls were answered as their batchers closed
            await self._grpc.wait_stopped()
        for served in started:
            if served.model.batching.latency_slo_ms is not None:
                log.info("model %r learned: %s", served.name, served.batcher.learned())

    # ------------------------------------------------------------- http

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        method = scope["method"]
        parts = scope["path"].strip("/").split("/")
        try:
            if self.api_keys is not None and self._refused(self.api_keys, parts, scope):
                raise HTTPError(401, UNAUTHORIZED, [(b"www-authenticate", b"Bearer")])
            status = await self._route(method, parts, scope, receive, send)
        except asyncio.CancelledError:
            # The server gave up on this request (drain timeout): answer it with a 503, not
            # the server's plain-text 500 and an error traceback for an expected end.
            try:
                stopping = HTTPError(503, STOPPING)
                await send_response(send, 503, _error_body(parts, stopping, stopping), JSON)
            except Exception:  # the client is gone too: nothing left to answer
                raise asyncio.CancelledError from None
            status = 503
        except Exception as exc:
            error = error_status(exc)
            status = error.status
            if status >= 500 and not isinstance(exc, HTTPError):
                log.warning("%s %s -> %d: %s", method, scope["path"], status, error.message)
            await send_response(send, status, _error_body(parts, exc, error), JSON + error.headers)
        if access_log.isEnabledFor(logging.INFO):
            _log_access(scope, status, started)

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
            body = self.metrics.render()
            await send_response(send, 200, body, [(b"content-type", self.metrics.content_type)])
            return 200
        if parts[0] == "v1":
            return await self._openai(method, parts[1:], scope, receive, send)
        if not parts or parts[0] != "v2":
            raise HTTPError(404, f"Not Found: {scope['path']}")
        rest = parts[1:]
        if not rest:
            _allow(method, "GET")
            return await send_json(send, 200, self.server_metadata())
        if rest == ["openapi.json"]:
            _allow(method, "GET")
            return await send_json(send, 200, openapi.document(_VERSION))
        if rest[0] == "health" and len(rest) == 2 and rest[1] in ("live", "ready"):
            _allow(method, "GET")
            if rest[1] == "live":
                return await send_json(send, 200, {"live": True})
            if self.ready and all(m.batcher.workers_alive for m in self.registry):
                return await send_json(send, 200, {"ready": True})
            return await send_json(send, 503, {"ready": False, "error": "Server is not ready"})
        if rest[0] == "models":
            return await self._models(method, rest[1:], scope, receive, send)
        if rest == ["repository", "index"]:
            _allow(method, "POST")  # Triton's model repository extension, read-only
            body = await read_body(
                dict(scope["headers"]), receive, self.max_body_bytes, timeout_s=self.body_timeout_s
            )
            index = self.registry.index()
            if parse_index_request(body):
                index = [entry for entry in index if entry["state"] == "READY"]
            return await send_json(send, 200, index)
        raise HTTPError(404, f"Not Found: {scope['path']}")

    async def _models(
        self, method: str, rest: list[str], scope: Scope, receive: Receive, send: Send
    ) -> int:
        if rest == ["stats"]:
            _allow(method, "GET")
            return await send_json(
                send, 200, {"model_stats": [m.statistics() for m in self.registry]}
            )
        if not rest or not rest[0]:
            raise HTTPError(404, f"Not Found: {scope['path']}")
        name, tail = rest[0], rest[1:]
        version = None
        if len(tail) >= 2 and tail[0] == "versions":
            version, tail = tail[1], tail[2:]
        action = tail[0] if tail else ""
        if len(tail) > 1 or action not in ("", "infer", "ready", "config", "stats"):
            raise HTTPError(404, f"Not Found: {scope['path']}")
        if action == "ready" and name in self.registry.load_failures:
            _allow(method, "GET")
            reason = self.registry.load_failures[name].reason
            return await send_json(send, 503, {"name": name, "ready": False, "error": reason})
        served = self.registry.get(name, version)
        if action == "infer":
            _allow(method, "POST")
            return await self._infer(served, scope, receive, send)
        _allow(method, "GET")
        if action == "":
            return await send_json(send, 200, served.metadata())
        if action == "ready":
            if self.ready and served.batcher.workers_alive:
                return await send_json(send, 200, {"name": served.name, "ready": True})
            return await send_json(
                send, 503, {"name": served.name, "ready": False, "error": "Model not ready"}
            )
        if action == "config":
            return await send_json(send, 200, served.config())
        return await send_json(send, 200, {"model_stats": [served.statistics()]})

    async def _infer(self, served: ServedModel, scope: Scope, receive: Receive, send: Send) -> int:
        try:
            return await self._infer_counted(served, scope, receive, send)
        except Exception as exc:
            served.record("http", error_status(exc).status)
            raise

    async def _infer_counted(
        self, served: ServedModel, scope: Scope, receive: Receive, send: Send
    ) -> int:
        started = time.perf_counter()
        if not self.ready:
            raise BatcherClosed(served.name, "is stopping")
        request = await self._read_request(served.model, scope, receive)
        admitted = admit(served.model, request)
        outputs = await _batched(served, admitted, receive, "http")
        if outputs is None:
            return CLIENT_CLOSED
        body, json_length = encode_infer_response(
            model_name=served.name,
            model_version=served.version,
            request_id=request.id,
            outputs=respond(served.model, admitted, outputs),
        )
        served.record("http", 200)
        served.request_seconds += time.perf_counter() - started
        await send_response(send, 200, body, _infer_headers(json_length))
        return 200

    async def _openai(
        self, method: str, rest: list[str], scope: Scope, receive: Receive, send: Send
    ) -> int:
        """OpenAI's routes (:mod:`carpool.server.openai`), for the models that opted in."""
        if rest == ["embeddings"]:
            _allow(method, "POST")
            return await self._embeddings(scope, receive, send)
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
        raise HTTPError(404, f"Not Found: {scope['path']}")

    async def _embeddings(self, scope: Scope, receive: Receive, send: Send) -> int:
        body = await read_body(
            dict(scope["headers"]), receive, self.max_body_bytes, timeout_s=self.body_timeout_s
        )
        doc = openai.json_body(body)
        served = self.registry.get(openai.model_name(doc))
        openai.check_opted_in(served.model)
        try:
            return await self._embeddings_counted(served, doc, receive, send)
        except Exception as exc:
            served.record("openai", error_status(exc).status)
            raise

    async def _embeddings_counted(
        self, served: ServedModel, doc: dict[str, Any], receive: Receive, send: Send
    ) -> int:
        """One request of k texts into the batcher path the v2 route takes: admit, batch,
        respond; then OpenAI's body."""
        started = time.perf_counter()
        if not self.ready:
            raise BatcherClosed(served.name, "is stopping")
        request = openai.parse_embeddings(doc)
        admitted = admit(served.model, openai.infer_request(served.model, request))
        outputs = await _batched(served, admitted, receive, "openai")
        if outputs is None:
            return CLIENT_CLOSED
        ((tensor, _),) = respond(served.model, admitted, outputs)
        body = openai.encode_embeddings(
            model=served.name,
            vectors=tensor.data,
            base64=request.base64,
            prompt_tokens=openai.prompt_tokens(served.model, admitted),
        )
        served.record("openai", 200)
        served.request_seconds += time.perf_counter() - started
        await send_response(send, 200, body, JSON)
        return 200

    async def _read_request(self, model: Model, scope: Scope, receive: Receive) -> InferRequest:
        headers = dict(scope["headers"])
        body = await read_body(headers, receive, self.max_body_bytes, timeout_s=self.body_timeout_s)
        header_length = parse_header_length(
            _text(headers.get(b"inference-header-content-length")), len(body)
        )
        if header_length == 0:
            check_raw_content_type(_text(headers.get(b"content-type")))
            return _raw_request(model, body)
        return parse_infer_request(body, header_length, max_elements=MAX_ELEMENTS)

    def server_metadata(self) -> dict[str, Any]:
        return {"name": "carpool", "version": _VERSION, "extensions": EXTENSIONS}


def _raw_request(model: Model, body: bytes) -> InferRequest:
    """A raw binary body is the data of the model's one input (Triton's rule)."""
    spec = model.input_specs
    if len(spec) != 1:
        raise ProtocolError(
            f"raw binary request needs a model with exactly 1 input; "
            f"'{model.name}' has {len(spec)}",
            field=HEADER_LENGTH,
        )
    return parse_raw_request(
        body, name=spec[0].name, datatype=spec[0].datatype, shape_without_batch=spec[0].shape
    )


def _error_body(parts: list[str], exc: BaseException, error: HTTPError) -> bytes:
    """OpenAI's error shape under ``/v1``, the v2 one elsewhere; the same status either way."""
    if parts[0] == "v1":
        return openai.encode_error(exc, error)
    return encode_error(error.message)


def _infer_headers(json_length: int | None) -> list[tuple[bytes, bytes]]:
    if json_length is None:
        return JSON
    return [
        (b"content-type", b"application/octet-stream"),
        (b"inference-header-content-length", str(json_length).encode()),
    ]


def _log_access(scope: Scope, status: int, started: float) -> None:
    client = scope.get("client") or ("-", 0)
    duration_ms = round((time.perf_counter() - started) * 1000.0, 3)
    access_log.info(
        '%s:%s "%s %s" %d %.2fms',
        client[0],
        client[1],
        scope["method"],
        scope["path"],
        status,
        duration_ms,
        extra={
            "client": f"{client[0]}:{client[1]}",
            "method": scope["method"],
            "path": scope["path"],
            "status": status,
            "duration_ms": duration_ms,
        },
    )


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


def _allow(method: str, allowed: str) -> None:
    if method != allowed:
        raise HTTPError(405, "Method Not Allowed", [(b"allow", allowed.encode())])


async def _batched(
    served: ServedModel, admitted: AdmittedRequest, receive: Receive, protocol: str
) -> Any:
    """``admitted``'s rows through the model's batcher: their outputs, or None (counted as
    499) when the client left first; its request was withdrawn if it was still queued."""
    work = asyncio.ensure_future(
        served.batcher.infer_many(
            admitted.value, timeout_ms=admitted.timeout_ms, priority=admitted.priority
        )
    )
    if not await unless_disconnected(work, receive):
        served.record(protocol, CLIENT_CLOSED)
        return None
    return work.result()
