"""A ModelStreamInfer call cancelled by its client while a step's response is on its way: grpc
refuses the write before the cancellation reaches the handler. That is the client's going
(a 499, counted by the inference path), never a model error, and nothing escapes the stream
(found by ``benchmarks.streams.cancellations``: 500s logged, ExceptionGroups raised)."""

from __future__ import annotations

import asyncio
import gc
import types
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb

from carpool.server.grpc.service import _Responses, _Servicer
from carpool.server.inference.path import ClientGone
from server.step_models import words


class Cancelled:
    """A call's context once its client cancelled it: every write refused, as grpc does."""

    def __init__(self) -> None:
        self.writes = 0

    async def write(self, answer: Any) -> None:
        self.writes += 1
        raise grpc.aio.InternalError('Failed "execute_batch"')

    def time_remaining(self) -> None:
        return None


def request() -> Any:
    return SimpleNamespace(
        model_name="words", model_version="", id="1", message=pb.ModelInferRequest()
    )


def response() -> Any:
    return pb.ModelInferResponse(model_name="words", id="1")


def servicer(steps: int | None) -> _Servicer:
    """A servicer whose inference path streams ``steps`` responses, then ends well (None:
    none, and it never ends)."""

    async def stream(call: Any, emit: Callable[[Any], Awaitable[None]]) -> None:
        if steps is None:
            await asyncio.Event().wait()
        for _ in range(steps or 0):
            await emit(response())

    inference = SimpleNamespace(
        registry=SimpleNamespace(find=lambda name: SimpleNamespace(model=words)),
        recorder=None,
        stream=stream,
    )
    return _Servicer(inference)  # type: ignore[arg-type]


async def test_a_refused_write_is_the_client_gone() -> None:
    out = _Responses(request(), Cancelled(), asyncio.Lock())
    await out.step(response())  # held: its finality is not known yet
    with pytest.raises(ClientGone):
        await out.step(response())


@pytest.mark.parametrize("steps", [2, 1], ids=["during_the_steps", "at_the_last_response"])
async def test_the_stream_ends_quietly_when_its_call_was_cancelled(steps: int) -> None:
    context, room = Cancelled(), asyncio.Semaphore(1)
    await room.acquire()
    await servicer(steps)._stream_one(request(), context, asyncio.Lock(), room)
    assert context.writes == 1  # no error response written after the refused write
    assert not room.locked()


async def test_a_cancelled_stream_leaves_no_garbage_cycles() -> None:
    """A cancelled call's frames are freed when it ends, not by the collector: cycles of
    frames and tracebacks (asyncio.TaskGroup's, on Python 3.11) piled up to a collection
    that paused the server 10-20 ms, longer than a step, so a cancel took two steps."""

    async def requests() -> AsyncIterator[Any]:
        yield request()

    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds stays in gc.garbage
    try:
        call = asyncio.ensure_future(servicer(None).ModelStreamInfer(requests(), Cancelled()))
        for _ in range(5):
            await asyncio.sleep(0)  # its request read, its sequence waiting for a step
        call.cancel()
        await asyncio.wait([call])
        assert call.cancelled()
        del call
        gc.collect()
        ours = {"ModelStreamInfer", "_stream_one", "_stream_answer", "__aexit__"}
        frames = [
            o.f_code.co_name
            for o in gc.garbage
            if isinstance(o, types.FrameType) and o.f_code.co_name in ours
        ]
        assert frames == []
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
