"""The v2 gRPC API (``inference.GRPCInferenceService``) on the REST app's models.

A ``grpc.aio`` server started in the app's lifespan startup, on a loop of its own in a
thread of its own; each RPC's body runs on uvicorn's loop (through
:class:`~carpool.server.loop_bridge.LoopBridge`), so that both protocols feed the same
batchers. Inference takes REST's path: decoded by :mod:`carpool.server.grpc_codec`,
checked by :func:`~carpool.server.inference.admit`, answered by
:func:`~carpool.server.inference.respond`; failures are
:func:`~carpool.server.statuses.error_status`'s, under :func:`~carpool.server.statuses.grpc_code`'s
names. A call the client cancels, or whose deadline passes, withdraws its queued request.
Only the app imports it, and only when ``--grpc-port`` is not 0: grpc is never imported
otherwise.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from carpool.errors import BatcherClosed, ConfigError, DeadlineExceeded
from carpool.server import grpc_access
from carpool.server import grpc_codec as codec
from carpool.server.app import MAX_ELEMENTS, App
from carpool.server.inference import admit, respond
from carpool.server.loop_bridge import LoopBridge
from carpool.server.registry import ModelNotFound, ModelUnavailable, ServedModel
from carpool.server.statuses import CLIENT_CLOSED, HTTPError, error_status, grpc_code

__all__ = ["GrpcServer"]

log = logging.getLogger("carpool.server")

PROTOCOL = "grpc"  # the protocol label of its requests in /metrics
# After the drain deadline the batchers answer what is left with UNAVAILABLE; the gRPC
# server waits this much longer for those answers to go out before it cancels the calls.
_ANSWER_S = 1.0
_UNIMPLEMENTED = {
    "SharedMemory": "shared memory is not supported by this server; send tensors in the "
    "request (raw_input_contents)",
    "RepositoryModel": "models are loaded when the server starts (carpool serve TARGET ...); "
    "the repository cannot be changed while it runs",
}

Handler = TypeVar("Handler", bound=Callable[..., Coroutine[Any, Any, Any]])


def _on_app_loop(method: Handler) -> Handler:
    """A unary RPC whose body runs on the app's loop, where the batchers and their
    statistics live, and whose exceptions end the call with the status the one table
    gives. The body gets the call's time left (seconds, or None), read here."""

    @functools.wraps(method)
    async def wrapper(self: _Servicer, request: Any, context: Any) -> Any:
        try:
            return await self.on_app_loop(method(self, request, context.time_remaining()))
        except Exception as exc:
            code, message = _status(exc, method.__name__)
            await context.abort(code, message)

    return wrapper  # type: ignore[return-value]


def _status(exc: Exception, rpc: str) -> tuple[grpc.StatusCode, str]:
    error = error_status(exc)
    if error.status >= 500 and not isinstance(exc, HTTPError):
        log.warning("gRPC %s -> %d: %s", rpc, error.status, error.message)
    return grpc.StatusCode[grpc_code(error.status)], error.message


class _Servicer(pb_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """Every RPC of the service; those carpool has no use for answer UNIMPLEMENTED.

    It runs on the gRPC thread's loop; each RPC's body runs on the app's loop."""

    def __init__(self, app: App, app_loop: asyncio.AbstractEventLoop) -> None:
        self._app = app
        self.on_app_loop = LoopBridge(app_loop).run

    @_on_app_loop
    async def ServerLive(self, request: Any, left_s: float | None) -> Any:
        return pb.ServerLiveResponse(live=True)

    @_on_app_loop
    async def ServerReady(self, request: Any, left_s: float | None) -> Any:
        app = self._app  # as REST's /v2/health/ready
        ready = app.ready and all(m.batcher.workers_alive for m in app.registry)
        return pb.ServerReadyResponse(ready=ready)

    @_on_app_loop
    async def ModelReady(self, request: Any, left_s: float | None) -> Any:
        # An unknown or failed model is not ready, not an error (tritonclient: False).
        try:
            served = self._app.registry.get(request.name, request.version or None)
        except (ModelNotFound, ModelUnavailable):
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=self._app.ready and served.batcher.workers_alive)

    @_on_app_loop
    async def ServerMetadata(self, request: Any, left_s: float | None) -> Any:
        return codec.server_metadata(self._app.server_metadata())

    @_on_app_loop
    async def ModelMetadata(self, request: Any, left_s: float | None) -> Any:
        return codec.model_metadata(self._served(request).metadata())

    @_on_app_loop
    async def ModelConfig(self, request: Any, left_s: float | None) -> Any:
        return codec.model_config(self._served(request).config())

    @_on_app_loop
    async def ModelStatistics(self, request: Any, left_s: float | None) -> Any:
        if not request.name:
            return codec.model_statistics([m.statistics() for m in self._app.registry])
        return codec.model_statistics([self._served(request).statistics()])

    @_on_app_loop
    async def RepositoryIndex(self, request: Any, left_s: float | None) -> Any:
        index = self._app.registry.index()
        if request.ready:
            index = [entry for entry in index if entry["state"] == "READY"]
        return codec.repository_index(index)

    @_on_app_loop
    async def ModelInfer(self, request: Any, left_s: float | None) -> Any:
        return await self._infer(request, left_s)

    async def ModelStreamInfer(self, requests: AsyncIterator[Any], context: Any) -> None:
        """Each request on the stream answered on the stream, as it completes (requests
        run concurrently, so they batch together); an error is that answer's
        ``error_message``, and the stream goes on."""
        writing = asyncio.Lock()
        async with asyncio.TaskGroup() as tasks:
            async for request in requests:
                tasks.create_task(self._stream_one(request, context, writing))

    async def _stream_one(self, request: Any, context: Any, writing: asyncio.Lock) -> None:
        try:
            response = await self.on_app_loop(self._infer(request, context.time_remaining()))
            answer = pb.ModelStreamInferResponse(infer_response=response)
        except Exception as exc:
            _, message = _status(exc, "ModelStreamInfer")
            answer = pb.ModelStreamInferResponse(
                error_message=message,
                infer_response=pb.ModelInferResponse(
                    model_name=request.model_name, model_version=request.model_version,
                    id=request.id,
                ),
            )  # fmt: skip
        async with writing:
            await context.write(answer)

    def _served(self, request: Any, prefix: str = "") -> ServedModel:
        name = getattr(request, f"{prefix}name")
        version = getattr(request, f"{prefix}version")
        return self._app.registry.get(name, version or None)

    async def _infer(self, request: Any, left_s: float | None) -> Any:
        """REST's inference path, on the app's loop: counted under ``grpc``; cancelled
        (the client's cancel, its deadline), it withdraws the request if still queued."""
        served = self._served(request, "model_")
        started = time.perf_counter()
        try:
            response = await self._infer_counted(served, request, left_s)
        except asyncio.CancelledError:
            served.record(PROTOCOL, CLIENT_CLOSED)
            raise
        except Exception as exc:
            served.record(PROTOCOL, error_status(exc).status)
            raise
        served.record(PROTOCOL, 200)
        served.request_seconds += time.perf_counter() - started
        return response

    async def _infer_counted(self, served: ServedModel, request: Any, left_s: float | None) -> Any:
        if not self._app.ready:
            raise BatcherClosed(served.name, "is stopping")
        decoded = codec.decode_infer_request(request, max_elements=MAX_ELEMENTS)
        admitted = admit(served.model, decoded)
        timeout_ms = admitted.timeout_ms
        deadline_ms = None if left_s is None else max(left_s * 1000.0, 1e-3)
        if deadline_ms is not None and (timeout_ms is None or deadline_ms < timeout_ms):
            timeout_ms = deadline_ms  # the call's deadline shortens the queue timeout
        try:
            result = await served.batcher.infer_many(
                admitted.value, timeout_ms=timeout_ms, priority=admitted.priority
            )
        except DeadlineExceeded as exc:
            if timeout_ms is not deadline_ms:
                raise  # the queue timeout's UNAVAILABLE
            # The client's own deadline: DEADLINE_EXCEEDED (a 504's kind), as grpc says.
            raise HTTPError(504, f"the call's deadline passed: {exc}") from None
        return codec.encode_infer_response(
            model_name=served.name,
            model_version=served.version,
            request_id=decoded.id,
            outputs=[tensor for tensor, _ in respond(served.model, admitted, result)],
        )


def _unimplemented(rpc: str) -> Callable[..., Awaitable[Any]]:
    reason = next((why for key, why in _UNIMPLEMENTED.items() if key in rpc), "not supported")

    async def method(self: _Servicer, request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{rpc}: {reason}")

    method.__name__ = rpc
    return method


# Every RPC of the service carpool does not implement (shared memory, repository load and
# unload, trace and log settings, and any Triton adds): UNIMPLEMENTED, saying why.
for _rpc in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods_by_name:
    if _rpc not in vars(_Servicer):
        setattr(_Servicer, _rpc, _unimplemented(_rpc))


class GrpcServer:
    """The gRPC server's life: listen at startup, stop accepting when the drain begins,
    give calls in flight the same drain deadline as REST's.

    grpc.aio runs on its own loop in a thread of its own; every RPC's body runs on the
    app's loop (:meth:`_Servicer.on_app_loop`). On uvicorn's loop, grpc.aio handed the
    batcher about one call per loop turn (it accepts calls one at a time, each through its
    completion-queue thread), so an eager batcher ran batches of 1-2 rows; from a thread
    of their own, calls arrive on the app's loop many at a time, as REST's do."""

    def __init__(self, app: App, address: str, *, max_message_bytes: int) -> None:
        self._app = app
        self.address = address
        self._max_message_bytes = max_message_bytes
        self._deadline = 0.0  # monotonic; set by begin_drain
        self._loop: asyncio.AbstractEventLoop | None = None  # the gRPC thread's, once serving
        self._draining: asyncio.Event | None = None  # on that loop
        self._thread: threading.Thread | None = None
        self._started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._stopped: concurrent.futures.Future[None] = concurrent.futures.Future()

    async def start(self) -> None:
        """Listen on ``address``; :class:`ConfigError` when it cannot (the port is taken)."""
        app_loop = asyncio.get_running_loop()
        self._thread = threading.Thread(
            target=self._run, args=(app_loop, type(app_loop)), name="carpool-grpc", daemon=True
        )
        self._thread.start()
        await asyncio.wrap_future(self._started)
        log.info("gRPC listening on %s", self.address)

    def _run(self, app_loop: asyncio.AbstractEventLoop, loop_type: type[Any]) -> None:
        """The gRPC thread: a loop of the app's loop's kind (uvloop's under uvicorn)."""
        try:
            with asyncio.Runner(loop_factory=loop_type) as runner:
                runner.run(self._serve(app_loop))
        except BaseException as exc:
            if not self._started.done():
                self._started.set_exception(exc)
            self._stopped.set_exception(exc)
        else:
            self._stopped.set_result(None)

    async def _serve(self, app_loop: asyncio.AbstractEventLoop) -> None:
        server = grpc.aio.server(
            interceptors=grpc_access.interceptors(self._app),  # --api-key
            options=[
                # The body limit: a larger message is RESOURCE_EXHAUSTED, from grpc itself.
                ("grpc.max_receive_message_length", self._max_message_bytes),
                ("grpc.max_send_message_length", -1),  # as REST: responses are not limited
                # Never share a port with another process (grpc's default on Linux would
                # split the calls between two servers without a word).
                ("grpc.so_reuseport", 0),
            ],
        )
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(_Servicer(self._app, app_loop), server)
        try:
            bound = grpc_access.add_port(server, self.address, self._app.tls)  # TLS or not
        except RuntimeError:
            bound = 0
        if not bound:
            raise ConfigError(
                f"cannot listen for gRPC on {self.address} (is the port in use?); choose "
                "another --grpc-port, or 0 to turn gRPC off"
            )
        await server.start()
        self._draining = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._started.set_result(None)
        await self._draining.wait()
        grace = max(0.0, self._deadline - time.monotonic()) + _ANSWER_S
        await server.stop(grace)

    def begin_drain(self, deadline: float) -> None:
        """Stop accepting calls now; those in flight have until ``deadline`` (monotonic).
        Safe from a signal handler: the stop itself runs on the gRPC thread's loop."""
        self._deadline = deadline
        loop, draining = self._loop, self._draining
        if loop is not None and draining is not None:
            with contextlib.suppress(RuntimeError):  # its loop is gone: stopped already
                loop.call_soon_threadsafe(draining.set)

    async def wait_stopped(self) -> None:
        """Until the server stopped, which :meth:`begin_drain` set off."""
        if self._thread is not None:
            await asyncio.wrap_future(self._stopped)
            self._thread.join()
