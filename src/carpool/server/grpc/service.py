"""The v2 gRPC API (``inference.GRPCInferenceService``), run on the app's loop where the batchers
live, so both protocols feed the same batchers with no thread between. Calls are decoded and
encoded here; their life in between is the inference path's. grpc is imported only when
``--grpc-port`` is not 0."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from carpool.errors import ConfigError
from carpool.model import Model
from carpool.server.auth import ApiKeys
from carpool.server.failures import ModelNotFound, ModelUnavailable
from carpool.server.grpc import access as grpc_access
from carpool.server.grpc import codec
from carpool.server.grpc.bursts import MAX_HOLD_S, Bursts
from carpool.server.grpc.wire import read_infer_request
from carpool.server.inference.call import Answer, Call, Withdrawal
from carpool.server.inference.outcomes import error_status
from carpool.server.inference.path import ClientGone, Inference
from carpool.server.lifecycle.control import ModelControl, act
from carpool.server.lifecycle.registry import ServedModel, server_metadata
from carpool.server.messages import MAX_ELEMENTS, InferRequest
from carpool.server.statuses import HTTPError, Status, grpc_code, is_server_error
from carpool.stepwise import StepwiseModel

__all__ = ["GrpcServer"]

log = logging.getLogger("carpool.server")

PROTOCOL = "grpc"  # the protocol label of its requests in /metrics
STREAM_IN_FLIGHT = 64  # requests of one ModelStreamInfer stream running at once, at most
# After the drain deadline the batchers answer what is left with UNAVAILABLE; the gRPC
# server waits this much longer for those answers to go out before it cancels the calls.
_ANSWER_S = 1.0
# A call whose deadline is nearer than this goes to the batcher at once, never held back
# for its burst: the hold (at most MAX_HOLD_S, 8 ms) stays a small share of it.
_HOLD_DEADLINE_S = 10 * MAX_HOLD_S
_UNIMPLEMENTED = {
    "SharedMemory": "shared memory is not supported by this server; send tensors in the "
    "request (raw_input_contents)",
}

Handler = TypeVar("Handler", bound=Callable[..., Coroutine[Any, Any, Any]])


def _unary(method: Handler) -> Handler:
    """A unary RPC other than inference, whose exceptions end the call with the status the
    one table gives, and whose answer the server counts (no model does). The body gets the
    call's time left (seconds, or None), read here."""

    @functools.wraps(method)
    async def wrapper(self: _Servicer, request: Any, context: Any) -> Any:
        try:
            response = await method(self, request, context.time_remaining())
        except asyncio.CancelledError:
            self._recorder.record(PROTOCOL, Status.CLIENT_CLOSED)
            raise
        except Exception as exc:
            code, message = _status(exc, method.__name__)
            self._recorder.record(PROTOCOL, error_status(exc).status)
            await context.abort(code, message)
        self._recorder.record(PROTOCOL, Status.OK)
        return response

    return wrapper  # type: ignore[return-value]


def _may_wait(left_s: float | None) -> bool:
    """Whether a call with ``left_s`` seconds to its deadline may be held for its burst."""
    return left_s is None or left_s > _HOLD_DEADLINE_S


def _status(exc: Exception, rpc: str) -> tuple[grpc.StatusCode, str]:
    error = error_status(exc)
    if is_server_error(error.status) and not isinstance(exc, HTTPError):
        log.warning("gRPC %s -> %d: %s", rpc, error.status, error.message)
    return grpc.StatusCode[grpc_code(error.status)], error.message


class _Servicer(pb_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """Every RPC of the service; those carpool has no use for answer UNIMPLEMENTED."""

    def __init__(self, inference: Inference, control: ModelControl | None = None) -> None:
        self._inference = inference
        self._control = control  # None: models load at start only
        self._registry = inference.registry
        self._recorder = inference.recorder  # every answer, the inference path's too
        self._bursts = Bursts()

    @_unary
    async def ServerLive(self, request: Any, left_s: float | None) -> Any:
        return pb.ServerLiveResponse(live=True)

    @_unary
    async def ServerReady(self, request: Any, left_s: float | None) -> Any:
        return pb.ServerReadyResponse(ready=self._registry.is_ready())

    @_unary
    async def ModelReady(self, request: Any, left_s: float | None) -> Any:
        # An unknown or failed model is not ready, not an error (tritonclient: False).
        try:
            served = self._registry.get(request.name, request.version or None)
        except (ModelNotFound, ModelUnavailable):
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=self._registry.model_ready(served))

    @_unary
    async def ServerMetadata(self, request: Any, left_s: float | None) -> Any:
        return codec.server_metadata(server_metadata())

    @_unary
    async def ModelMetadata(self, request: Any, left_s: float | None) -> Any:
        return codec.model_metadata(self._served(request).metadata())

    @_unary
    async def ModelConfig(self, request: Any, left_s: float | None) -> Any:
        return codec.model_config(self._served(request).config())

    @_unary
    async def ModelStatistics(self, request: Any, left_s: float | None) -> Any:
        await self._registry.refresh()
        if not request.name:
            return codec.model_statistics([m.statistics() for m in self._registry])
        return codec.model_statistics([self._served(request).statistics()])

    @_unary
    async def RepositoryIndex(self, request: Any, left_s: float | None) -> Any:
        return codec.repository_index(self._registry.index(ready_only=request.ready))

    @_unary
    async def RepositoryModelLoad(self, request: Any, left_s: float | None) -> Any:
        parameters = _parameters(request.parameters)
        await act(self._control, request.model_name, "load", parameters)
        return pb.RepositoryModelLoadResponse()

    @_unary
    async def RepositoryModelUnload(self, request: Any, left_s: float | None) -> Any:
        parameters = _parameters(request.parameters)
        await act(self._control, request.model_name, "unload", parameters)
        return pb.RepositoryModelUnloadResponse()

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        """Held back a little while other calls arrive (:mod:`carpool.server.grpc.bursts`),
        so that calls sent together reach the batcher together, as REST's do. A call
        cancelled while held never reached the inference path: it is counted here."""
        try:
            async with self._slot(request, context):
                # Read after the hold: the queue's timeout is what is left of the deadline.
                return await self._infer(request, context.time_remaining())
        except Exception as exc:
            code, message = _status(exc, "ModelInfer")
            await context.abort(code, message)

    async def ModelStreamInfer(self, requests: AsyncIterator[Any], context: Any) -> None:
        """Each request on the stream answered on the stream, as it completes (requests
        run concurrently, so they batch together): a step-wise model's once per step, as
        Triton's decoupled models, any other's once; each response says whether it is its
        request's last (``triton_final_response``). An error is that request's last
        answer, an ``error_message``, and the stream goes on."""
        writing = asyncio.Lock()
        # At most STREAM_IN_FLIGHT requests of one stream at a time: past it the stream is
        # not read until one is answered (HTTP/2's flow control then holds the client back),
        # so unread messages do not each become a task.
        room = asyncio.Semaphore(STREAM_IN_FLIGHT)
        running: set[asyncio.Task[None]] = set()
        try:
            async for request in requests:
                await room.acquire()
                task = asyncio.create_task(self._stream_one(request, context, writing, room))
                running.add(task)
                task.add_done_callback(running.discard)
            await asyncio.gather(*running)  # a request's error ends the call
        finally:
            await _ended(running)

    async def _stream_one(
        self, request: Any, context: Any, writing: asyncio.Lock, room: asyncio.Semaphore
    ) -> None:
        try:
            await self._stream_answer(request, _Responses(request, context, writing))
        except ClientGone:
            pass  # the call was cancelled under its last response: nobody left to answer
        finally:
            room.release()

    async def _stream_answer(self, request: Any, out: _Responses) -> None:
        """``request``'s responses through ``out``. A step-wise model's sequence joins at
        its next step, held for no burst; a cancelled call cancels it (its Stream), and its
        slot is free at the next step."""
        context = out.context
        served = self._registry.find(request.model_name)
        whole = None  # the one answer of a model that is not step-wise
        try:
            if served is not None and isinstance(served.model, StepwiseModel):
                call = self._call(request, context.time_remaining())
                await self._inference.stream(call, out.step)
            else:
                async with self._slot(request, context):
                    whole = await self._infer(request, context.time_remaining())
        except ClientGone:
            return  # counted as the client's (499); nobody is left to answer
        except Exception as exc:
            _, message = _status(exc, "ModelStreamInfer")
            await out.fail(message)
            return
        if whole is None:
            await out.end()
        else:  # the last: never an empty one after it (as Triton's models that are not decoupled)
            await out.whole(whole)

    def _slot(self, request: Any, context: Any) -> Any:
        """The call's place in its burst; a call cancelled there counts as the inference
        path counts a cancelled call (499), under its model if it has one."""
        withdrawn = functools.partial(
            self._recorder.named,
            PROTOCOL,
            Status.CLIENT_CLOSED,
            request.model_name,
            request.model_version or None,
        )
        return self._bursts.slot(may_wait=_may_wait(context.time_remaining()), withdrawn=withdrawn)

    def _served(self, request: Any) -> ServedModel:
        return self._registry.get(request.name, request.version or None)

    def _call(self, request: Any, left_s: float | None) -> Call[Any, Any]:
        """One ``ModelInferRequest`` as the inference path's call, counted under ``grpc``:
        the call's deadline (``left_s``) shortens its queue timeout, and a cancelled call
        withdraws it: the client's cancel counts 499, its deadline's 504."""
        return Call(
            protocol=PROTOCOL, model=request.model_name,
            version=request.model_version or None, read=functools.partial(_received, request),
            size=_size, decode=_decode, encode=_encode,
            withdrawal=Withdrawal(deadline_s=left_s, cancel_counts_as=Status.CLIENT_CLOSED),
        )  # fmt: skip

    async def _infer(self, request: Any, left_s: float | None) -> Any:
        """One ``ModelInferRequest``'s whole answer through the inference path."""
        return await self._inference.infer(self._call(request, left_s))


class _Responses:
    """One streamed request's responses, written on its stream (under ``writing``, which
    the stream's requests share). Each carries ``triton_final_response``: with the
    request's ``triton_enable_empty_final_response``, every step's is false and an empty
    response ends it; without, each step's response waits for the next (or the end) to
    know whether it is the last."""

    def __init__(self, request: Any, context: Any, writing: asyncio.Lock) -> None:
        self.request = request
        self.context = context
        self._writing = writing
        self._empty_final = codec.empty_final_response(request.message)
        self._held: Any = None  # the last step's response, not yet written
        self._last: Any = None  # the last response made, written or held

    async def step(self, response: Any) -> None:
        """One step's response for the request."""
        if self._held is not None:
            await self._write(self._held, final=False)
        self._last = response
        if self._empty_final:
            await self._write(response, final=False)
        else:
            self._held = response

    async def whole(self, response: Any) -> None:
        """The request's one response (a model that is not step-wise), its last."""
        await self._write(response, final=True)

    async def end(self) -> None:
        """The request ended well: its last response written, marked final."""
        held, self._held = self._held, None
        if held is None:  # asked for an empty one, or no step came
            held = self._empty(self._last)
        await self._write(held, final=True)

    async def fail(self, message: str) -> None:
        """The request ended in ``message``: what it answered, then the error, its last."""
        held, self._held = self._held, None
        if held is not None:
            await self._write(held, final=False)
        error = self._empty(None)
        error.parameters[codec.FINAL].bool_param = True
        await self._send(pb.ModelStreamInferResponse(error_message=message, infer_response=error))

    def _empty(self, like: Any) -> Any:
        """A response with no outputs for the request, named as ``like`` (if any) is."""
        source = self.request if like is None else like
        return pb.ModelInferResponse(
            model_name=source.model_name, model_version=source.model_version, id=self.request.id
        )

    async def _write(self, response: Any, *, final: bool) -> None:
        response.parameters[codec.FINAL].bool_param = final
        await self._send(pb.ModelStreamInferResponse(infer_response=response))

    async def _send(self, answer: Any) -> None:
        """``answer`` written; :class:`ClientGone` if the call refused it: only the client
        ends a call this handler is still writing to (it cancelled, or its deadline passed)
        while a step's response was on its way, before the cancellation reached the handler."""
        async with self._writing:
            try:
                await self.context.write(answer)
            except grpc.aio.InternalError:  # grpc's "execute_batch" failed: the call is over
                raise ClientGone from None


_KINDS = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


async def _ended(tasks: set[asyncio.Task[None]]) -> None:
    """``tasks`` cancelled and awaited: a stream's requests end with their call."""
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks)


def _service(servicer: _Servicer) -> grpc.GenericRpcHandler:
    """The service as its generated code adds it, but for inference's requests, read by
    :mod:`.grpc_wire`: their tensors are views of the message received, not copies."""
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    handlers = {}
    for method in service.methods:
        request, response = (getattr(pb, t.name) for t in (method.input_type, method.output_type))
        streaming = (method.client_streaming, method.server_streaming)
        kind = _KINDS[streaming]  # a kind the service does not have is a KeyError at start
        handlers[method.name] = kind(
            getattr(servicer, method.name),
            request_deserializer=(
                read_infer_request if request is pb.ModelInferRequest else request.FromString
            ),
            response_serializer=response.SerializeToString,
        )
    return grpc.method_handlers_generic_handler(service.full_name, handlers)


def _parameters(parameters: Any) -> dict[str, Any]:
    """A repository request's ``ModelRepositoryParameter`` map as plain values."""
    return {key: getattr(p, p.WhichOneof("parameter_choice")) for key, p in parameters.items()}


async def _received(request: Any) -> Any:
    return request  # read already, by grpc (:func:`~carpool.server.grpc.wire.read_infer_request`)


def _size(request: Any) -> int:
    return int(request.size)


def _decode(model: Model, request: Any) -> InferRequest:
    return codec.decode_infer_request(request, max_elements=MAX_ELEMENTS)


def _encode(answer: Answer, request: Any) -> Any:
    return codec.encode_infer_response(
        model_name=answer.served.name,
        model_version=answer.served.version,
        request_id=answer.request.id,
        outputs=[tensor for tensor, _ in answer.outputs],
    )


def _unimplemented(rpc: str) -> Callable[..., Awaitable[Any]]:
    reason = next((why for key, why in _UNIMPLEMENTED.items() if key in rpc), "not supported")

    async def method(self: _Servicer, request: Any, context: Any) -> Any:
        self._recorder.record(PROTOCOL, Status.METHOD_NOT_ALLOWED)  # grpc_code: UNIMPLEMENTED
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{rpc}: {reason}")

    method.__name__ = rpc
    return method


# Every RPC of the service carpool does not implement (shared memory, trace and log
# settings, and any Triton adds): UNIMPLEMENTED, saying why.
for _rpc in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods_by_name:
    if _rpc not in vars(_Servicer):
        setattr(_Servicer, _rpc, _unimplemented(_rpc))


class GrpcServer:
    """The gRPC server's life: listen at startup, stop accepting when the drain begins,
    give calls in flight the same drain deadline as REST's.

    grpc.aio runs on the app's loop, the batchers': a loop of its own would cost two thread
    wake-ups a call, and gather no calls into batches
    (:class:`~carpool.server.grpc.bursts.Bursts` is what gathers them)."""

    def __init__(
        self,
        inference: Inference,
        address: str,
        *,
        max_message_bytes: int,
        api_keys: ApiKeys | None = None,
        tls: tuple[str, str] | None = None,
        share_port: bool = False,
        max_concurrent_rpcs: int = 0,
        control: ModelControl | None = None,
    ) -> None:
        self._inference = inference
        self._control = control
        self._max_concurrent_rpcs = max_concurrent_rpcs  # 0: no limit
        self._share_port = share_port  # front-end processes: each listens on the one port
        self.address = address
        self._max_message_bytes = max_message_bytes  # REST's --max-body-bytes
        self._api_keys = api_keys  # REST's keys; None: every call is open
        self._tls = tls  # (certfile, keyfile), REST's; None: plain
        self._server: grpc.aio.Server | None = None  # once listening
        self._loop: asyncio.AbstractEventLoop | None = None  # the app's, once listening
        self._stopping: asyncio.Task[None] | None = None  # the server's stop, once begun
        self._stopped: asyncio.Future[None] | None = None  # done when it has stopped

    async def start(self) -> None:
        """Listen on ``address``; :class:`ConfigError` when it cannot (the port is taken)."""
        access = grpc_access.Access(  # --api-key; --grpc-max-concurrent-rpcs; counting
            self._inference.recorder.server(PROTOCOL),
            keys=self._api_keys,
            max_calls=self._max_concurrent_rpcs,
        )
        server = grpc.aio.server(
            interceptors=[access],
            options=[
                # The body limit: a larger message is RESOURCE_EXHAUSTED, from grpc itself.
                ("grpc.max_receive_message_length", self._max_message_bytes),
                ("grpc.max_send_message_length", -1),  # as REST: responses are not limited
                # Never share a port with another process (grpc's default on Linux would
                # split the calls between two servers without a word), except with the
                # server's other front ends, among which the kernel spreads connections.
                ("grpc.so_reuseport", int(self._share_port)),
            ],
        )
        server.add_generic_rpc_handlers((_service(_Servicer(self._inference, self._control)),))
        try:
            bound = grpc_access.add_port(server, self.address, self._tls)  # TLS or not
        except RuntimeError:
            bound = 0
        if not bound:
            await server.stop(None)
            raise ConfigError(
                f"cannot listen for gRPC on {self.address} (is the port in use?); choose "
                "another --grpc-port, or 0 to turn gRPC off"
            )
        await server.start()
        self._loop = asyncio.get_running_loop()
        self._stopped = self._loop.create_future()
        self._server = server
        log.info("gRPC listening on %s", self.address)

    def begin_drain(self, deadline: float) -> None:
        """Stop accepting calls now; those in flight have until ``deadline`` (monotonic).
        Safe from a signal handler: the stop itself starts in a callback of the loop."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._stop, deadline)

    def _stop(self, deadline: float) -> None:
        if self._server is None or self._stopping is not None:
            return
        grace = max(0.0, deadline - time.monotonic()) + _ANSWER_S
        self._stopping = asyncio.get_running_loop().create_task(self._server.stop(grace))
        self._stopping.add_done_callback(self._has_stopped)

    def _has_stopped(self, task: asyncio.Task[None]) -> None:
        assert self._stopped is not None  # set with _server
        if self._stopped.done():
            return
        if task.cancelled():
            self._stopped.cancel()
        elif (exc := task.exception()) is not None:
            self._stopped.set_exception(exc)
        else:
            self._stopped.set_result(None)

    async def wait_stopped(self) -> None:
        """Until the server stopped, which :meth:`begin_drain` set off."""
        if self._stopped is not None:
            await self._stopped
