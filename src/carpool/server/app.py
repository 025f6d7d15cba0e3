"""The v2 REST API as a plain ASGI application, and the one table from errors to statuses.

Routes are matched by splitting the path, not by a framework: the inference path is the hot
path, and a handful of fixed routes needs no more. Every error body is
``{"error": "<message>"}``, which is what tritonclient reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import zlib
from collections.abc import Awaitable, Callable, Sequence
from importlib.metadata import version as _version
from typing import Any

import orjson

from carpool.errors import BatcherClosed, BatchSizeMismatch, DeadlineExceeded, QueueFull
from carpool.server.inference import ModelOutputError, admit, respond
from carpool.server.messages import HEADER_LENGTH, ProtocolError
from carpool.server.metrics import Metrics
from carpool.server.registry import ModelNotFound, ModelUnavailable, Registry, ServedModel
from carpool.server.requests import parse_header_length, parse_infer_request, parse_raw_request
from carpool.server.responses import encode_error, encode_infer_response

__all__ = ["App", "HTTPError"]

log = logging.getLogger("carpool.server")
_VERSION = _version("carpool")  # from the installed metadata: pyproject.toml holds it once
access_log = logging.getLogger("carpool.access")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_STOPPING = "Server is stopping, scheduler for model has stopped accepting new inference requests"
EXTENSIONS = ["binary_tensor_data", "model_configuration", "statistics", "schedule_policy"]
CLIENT_CLOSED = 499  # nginx's status for a client that closed the connection first
# Elements one request may carry (2**31, Triton's limit): checked before anything is allocated.
MAX_ELEMENTS = 2**31
JSON = [(b"content-type", b"application/json")]


class HTTPError(Exception):
    """An answer other than 200, with the message for the ``error`` body."""

    def __init__(self, status: int, message: str, headers: Sequence[tuple[bytes, bytes]] = ()):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = list(headers)


def error_status(exc: BaseException) -> HTTPError:
    """THE table: every exception a request can end in, as the status a client sees."""
    if isinstance(exc, HTTPError):
        return exc
    if isinstance(exc, ProtocolError):
        return HTTPError(exc.status, str(exc))
    if isinstance(exc, ModelNotFound):
        return HTTPError(404, str(exc))
    if isinstance(exc, ModelUnavailable):
        return HTTPError(400, str(exc))
    if isinstance(exc, QueueFull):
        return HTTPError(503, str(exc), [(b"retry-after", b"1")])
    if isinstance(exc, DeadlineExceeded):
        return HTTPError(503, str(exc), [(b"retry-after", b"1")])
    if isinstance(exc, BatcherClosed):
        return HTTPError(503, _STOPPING)
    if isinstance(exc, BatchSizeMismatch | ModelOutputError):
        return HTTPError(500, f"model error: {exc}")
    if isinstance(exc, Exception):  # the model's own exception, isolated to its rows
        return HTTPError(500, f"model error: {type(exc).__name__}: {exc}")
    raise exc


class App:
    """ASGI application serving the models of ``registry``."""

    def __init__(
        self,
        registry: Registry,
        *,
        max_body_bytes: int,
        drain_timeout_s: float = 30.0,
        metrics: Metrics | None = None,
    ) -> None:
        self.registry = registry
        self.max_body_bytes = max_body_bytes
        self.drain_timeout_s = drain_timeout_s
        self.metrics = metrics if metrics is not None else Metrics(registry)
        self.ready = False  # true between startup and the start of shutdown
        self._started: list[ServedModel] = []

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
                    log.exception("startup failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def startup(self) -> None:
        """Start every model's batcher on this loop."""
        for served in self.registry:
            await served.batcher.__aenter__()
            self._started.append(served)
        self.ready = True
        for served in self.registry:
            log.info("serving model %r: %s", served.name, served.describe())
        for failed in self.registry.unavailable.values():
            log.error("model %r is unavailable: %s", failed.name, failed.reason)

    async def shutdown(self) -> None:
        """Not ready any more; every batcher finishes what it accepted, within the drain
        timeout, after which what is left gets 503 (a hung model call is abandoned)."""
        self.ready = False
        started, self._started = self._started, []
        await asyncio.gather(
            *(served.batcher.aclose(timeout=self.drain_timeout_s) for served in started)
        )
        for served in started:
            if served.model.batching.latency_slo_ms is not None:
                log.info("model %r learned: %s", served.name, served.batcher.learned())

    # ------------------------------------------------------------- http

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        method = scope["method"]
        parts = scope["path"].strip("/").split("/")
        try:
            status = await self._route(method, parts, scope, receive, send)
        except asyncio.CancelledError:
            # The server gave up on this request (drain timeout): answer if the client is
            # still there, rather than leave it to the server's plain-text 500.
            with contextlib.suppress(Exception):
                await _send(send, 503, encode_error(_STOPPING), JSON)
            raise
        except Exception as exc:
            error = error_status(exc)
            status = error.status
            if status >= 500 and not isinstance(exc, HTTPError):
                log.warning("%s %s -> %d: %s", method, scope["path"], status, error.message)
            await _send(send, status, encode_error(error.message), JSON + error.headers)
        if access_log.isEnabledFor(logging.INFO):
            client = scope.get("client") or ("-", 0)
            duration_ms = round((time.perf_counter() - started) * 1000.0, 3)
            access_log.info(
                '%s:%s "%s %s" %d %.2fms',
                client[0],
                client[1],
                method,
                scope["path"],
                status,
                duration_ms,
                extra={
                    "client": f"{client[0]}:{client[1]}",
                    "method": method,
                    "path": scope["path"],
                    "status": status,
                    "duration_ms": duration_ms,
                },
            )

    async def _route(
        self, method: str, parts: list[str], scope: Scope, receive: Receive, send: Send
    ) -> int:
        if parts == ["metrics"]:
            _allow(method, "GET")
            body = self.metrics.render()
            await _send(send, 200, body, [(b"content-type", self.metrics.content_type)])
            return 200
        if not parts or parts[0] != "v2":
            raise HTTPError(404, f"Not Found: {scope['path']}")
        rest = parts[1:]
        if not rest:
            _allow(method, "GET")
            return await _json(send, 200, self.server_metadata())
        if rest[0] == "health" and len(rest) == 2 and rest[1] in ("live", "ready"):
            _allow(method, "GET")
            if rest[1] == "live":
                return await _json(send, 200, {"live": True})
            if self.ready:
                return await _json(send, 200, {"ready": True})
            return await _json(send, 503, {"ready": False, "error": "Server is not ready"})
        if rest[0] == "models":
            return await self._models(method, rest[1:], scope, receive, send)
        if rest == ["repository", "index"]:
            _allow(method, "POST")  # Triton's model repository extension, read-only
            return await _json(send, 200, self.registry.index())
        raise HTTPError(404, f"Not Found: {scope['path']}")

    async def _models(
        self, method: str, rest: list[str], scope: Scope, receive: Receive, send: Send
    ) -> int:
        if rest == ["stats"]:
            _allow(method, "GET")
            return await _json(send, 200, {"model_stats": [m.statistics() for m in self.registry]})
        if not rest or not rest[0]:
            raise HTTPError(404, f"Not Found: {scope['path']}")
        name, tail = rest[0], rest[1:]
        version = None
        if len(tail) >= 2 and tail[0] == "versions":
            version, tail = tail[1], tail[2:]
        action = tail[0] if tail else ""
        if len(tail) > 1 or action not in ("", "infer", "ready", "config", "stats"):
            raise HTTPError(404, f"Not Found: {scope['path']}")
        if action == "ready" and name in self.registry.unavailable:
            _allow(method, "GET")
            reason = self.registry.unavailable[name].reason
            return await _json(send, 503, {"name": name, "ready": False, "error": reason})
        served = self.registry.get(name, version)
        if action == "infer":
            _allow(method, "POST")
            return await self._infer(served, scope, receive, send)
        _allow(method, "GET")
        if action == "":
            return await _json(send, 200, served.metadata())
        if action == "ready":
            if self.ready:
                return await _json(send, 200, {"name": served.name, "ready": True})
            return await _json(
                send, 503, {"name": served.name, "ready": False, "error": "Model not ready"}
            )
        if action == "config":
            return await _json(send, 200, served.config())
        return await _json(send, 200, {"model_stats": [served.statistics()]})

    async def _infer(self, served: ServedModel, scope: Scope, receive: Receive, send: Send) -> int:
        try:
            return await self._infer_counted(served, scope, receive, send)
        except Exception as exc:
            served.statuses[error_status(exc).status] += 1
            raise

    async def _infer_counted(
        self, served: ServedModel, scope: Scope, receive: Receive, send: Send
    ) -> int:
        started = time.perf_counter()
        if not self.ready:
            raise BatcherClosed(served.name, "is stopping")
        headers = dict(scope["headers"])
        body = await self._body(headers, receive)
        encoding = headers.get(b"content-encoding")
        if encoding is not None:
            body = _decompress(body, encoding, self.max_body_bytes)
        header_length = parse_header_length(
            _text(headers.get(b"inference-header-content-length")), len(body)
        )
        model = served.model
        if header_length == 0:
            spec = model.input_specs
            if len(spec) != 1:
                raise ProtocolError(
                    f"raw binary request needs a model with exactly 1 input; "
                    f"'{model.name}' has {len(spec)}",
                    field=HEADER_LENGTH,
                )
            request = parse_raw_request(
                body,
                name=spec[0].name,
                datatype=spec[0].datatype,
                shape_without_batch=spec[0].shape,
            )
        else:
            request = parse_infer_request(body, header_length, max_elements=MAX_ELEMENTS)
        admission = admit(model, request)
        work = asyncio.ensure_future(
            served.batcher.infer_many(
                admission.value, timeout_ms=admission.timeout_ms, priority=admission.priority
            )
        )
        if not await _unless_disconnected(work, receive):
            served.statuses[CLIENT_CLOSED] += 1  # withdrawn if it was still queued
            return CLIENT_CLOSED
        outputs = respond(model, admission, work.result())
        body, json_length = encode_infer_response(
            model_name=served.name,
            model_version=served.version,
            request_id=request.id,
            outputs=outputs,
        )
        served.statuses[200] += 1
        served.request_seconds += time.perf_counter() - started
        if json_length is None:
            await _send(send, 200, body, JSON)
        else:
            await _send(
                send,
                200,
                body,
                [
                    (b"content-type", b"application/octet-stream"),
                    (b"inference-header-content-length", str(json_length).encode()),
                ],
            )
        return 200

    async def _body(self, headers: dict[bytes, bytes], receive: Receive) -> bytes:
        limit = self.max_body_bytes
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise HTTPError(413, _too_large(int(declared), limit))
        chunks = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise HTTPError(400, "client disconnected before sending the whole body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise HTTPError(413, _too_large(size, limit))
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def server_metadata(self) -> dict[str, Any]:
        return {"name": "carpool", "version": _VERSION, "extensions": EXTENSIONS}


async def _unless_disconnected(work: asyncio.Future[Any], receive: Receive) -> bool:
    """Wait for ``work``; if the client goes away first, cancel it and return False."""
    while True:
        gone = asyncio.ensure_future(receive())
        try:
            await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            work.cancel()
            raise
        finally:
            gone.cancel()
        if work.done():
            return True
        if gone.result().get("type") == "http.disconnect":
            break
    work.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await work
    return False


def _decompress(body: bytes, encoding: bytes, limit: int) -> bytes:
    """A gzip or deflate body (tritonclient's request compression), inflated to at most
    ``limit`` bytes, so a small compressed body cannot expand without bound."""
    kind = encoding.strip().lower()
    if kind == b"identity":
        return body
    if kind not in (b"gzip", b"deflate"):
        raise HTTPError(415, f"Content-Encoding {kind.decode(errors='replace')!r} is not "
                        "supported; send gzip, deflate or an uncompressed body")  # fmt: skip
    inflater = zlib.decompressobj(zlib.MAX_WBITS | (16 if kind == b"gzip" else 0))
    try:
        out = inflater.decompress(body, limit + 1)
        if len(out) > limit:
            raise HTTPError(413, _too_large(len(out), limit) + " (after decompression)")
        if not inflater.eof or inflater.unused_data:
            raise zlib.error("truncated or trailing data")
    except zlib.error as exc:
        raise HTTPError(400, f"cannot decompress the {kind.decode()} body: {exc}") from None
    return out


def _too_large(size: int, limit: int) -> str:
    return (
        f"request body of {size} bytes exceeds the limit of {limit} bytes; "
        "raise --max-body-bytes or send smaller requests"
    )


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


def _allow(method: str, allowed: str) -> None:
    if method != allowed:
        raise HTTPError(405, "Method Not Allowed", [(b"allow", allowed.encode())])


async def _json(send: Send, status: int, payload: Any) -> int:
    await _send(send, status, orjson.dumps(payload), JSON)
    return status


async def _send(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
