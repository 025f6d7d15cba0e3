"""The one inference path: readiness, decode, admit, batch (withdrawn when the client goes,
the call is cancelled or its deadline passes), respond, encode, record and time, for any
protocol. In process: a real registry and batcher, no server; events, not timers."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from carpool import Batching, Model
from carpool.errors import BatcherClosed, DeadlineExceeded
from carpool.server.failures import ModelNotFound
from carpool.server.inference.call import Answer, Call, Withdrawal
from carpool.server.inference.path import ClientGone, Inference, _outcome, _unless_gone
from carpool.server.lifecycle.registry import Registry, ServedModel
from carpool.server.messages import InferInput, InferRequest, ProtocolError
from carpool.server.statuses import HTTPError, Status


class Gate:
    """Holds every batch of the model until opened; says when one has started."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.started = threading.Event()

    def __call__(self, batch: Any) -> Any:
        self.started.set()
        self.open.wait(30.0)
        return batch + 1


@pytest.fixture
def gate() -> Gate:
    return Gate()


@pytest.fixture
async def inference(gate: Gate) -> AsyncIterator[Inference]:
    model = Model(gate, name="m", batching=Batching(max_batch_size=1))
    path = Inference(Registry([model]))
    (served,) = path.registry
    async with served.batcher:
        path.registry.ready = True
        yield path
        gate.open.set()


def served(inference: Inference) -> ServedModel:
    (model,) = inference.registry
    return model


def request(value: float, **parameters: Any) -> InferRequest:
    data = np.full((1, 1), value, np.float32)
    data.flags.writeable = False
    tensor = InferInput("INPUT0", "FP32", (1, 1), data, {})
    return InferRequest(
        id="r", parameters=parameters, inputs=(tensor,), outputs=None, binary_data_output=False
    )


def decoding(decoded: InferRequest) -> Any:
    def decode(model: Model, read: bytes) -> InferRequest:
        return decoded

    return decode


def encode(answer: Answer, read: bytes) -> list[float]:
    ((tensor, _),) = answer.outputs
    return [float(v) for v in tensor.data.ravel()]


async def body() -> bytes:
    return b"the body"


def call(decode: Any, model: str = "m", **options: Any) -> Call[bytes, list[float]]:
    return Call(protocol="test", model=model, read=body, decode=decode, encode=encode, **options)


async def infer(inference: Inference, value: float, **options: Any) -> list[float]:
    decode = options.pop("decode", decoding(request(value)))
    return await inference.infer(call(decode, **options))


class Leaving:
    """A :data:`GoneSignal` the test fires: what it was told to run, and whether it was
    told to stop watching."""

    def __init__(self) -> None:
        self.callback: Any = None
        self.stopped = False

    def __call__(self, callback: Any) -> Any:
        self.callback = callback
        return self.stop

    def stop(self) -> None:
        self.stopped = True

    def leave(self) -> None:
        assert self.callback is not None, "nobody watched"
        self.callback()


async def until_started(gate: Gate) -> None:
    assert await asyncio.to_thread(gate.started.wait, 30.0)


async def until_pending(inference: Inference, requests: int) -> None:
    # The batcher has no event for "accepted": look once per loop turn.
    while served(inference).batcher.stats().pending != requests:  # noqa: ASYNC110
        await asyncio.sleep(0)


async def test_an_answered_request_is_counted_and_timed(inference: Inference, gate: Gate) -> None:
    gate.open.set()
    assert await infer(inference, 1.0) == [2.0]
    assert served(inference).statuses == {"test": {Status.OK: 1}}
    assert served(inference).request_seconds > 0.0


async def test_what_the_path_refuses_counts_under_the_model(inference: Inference) -> None:
    def refuse(model: Model, read: bytes) -> InferRequest:
        raise ProtocolError("bad body", field="body")

    with pytest.raises(ProtocolError):
        await infer(inference, 1.0, decode=refuse)
    inference.registry.ready = False  # draining: refused before decoding
    with pytest.raises(BatcherClosed):
        await infer(inference, 1.0, decode=refuse)
    with pytest.raises(ModelNotFound):  # no model to count it under
        await inference.infer(call(refuse, model="x"))
    assert served(inference).statuses == {"test": {Status.BAD_REQUEST: 1, Status.UNAVAILABLE: 1}}
    assert served(inference).request_seconds == 0.0


async def test_a_client_that_leaves_withdraws_its_queued_request(
    inference: Inference, gate: Gate
) -> None:
    running = asyncio.ensure_future(infer(inference, 1.0))
    await until_started(gate)
    leaving = Leaving()
    queued = asyncio.ensure_future(infer(inference, 2.0, withdrawal=Withdrawal(leaving)))
    await until_pending(inference, 2)
    leaving.leave()
    with pytest.raises(ClientGone):
        await queued
    assert leaving.stopped
    gate.open.set()
    assert await running == [2.0]
    assert served(inference).batcher.stats().cancelled == 1  # withdrawn
    assert served(inference).statuses == {"test": {Status.CLIENT_CLOSED: 1, Status.OK: 1}}


@pytest.mark.parametrize(("counts_as", "counted"), [(Status.CLIENT_CLOSED, 1), (None, 0)])
async def test_a_cancelled_caller_counts_as_its_withdrawal_says(
    inference: Inference, gate: Gate, counts_as: int | None, counted: int
) -> None:
    running = asyncio.ensure_future(infer(inference, 1.0))
    await until_started(gate)
    withdrawal = Withdrawal(cancel_counts_as=counts_as)
    queued = asyncio.ensure_future(infer(inference, 2.0, withdrawal=withdrawal))
    await until_pending(inference, 2)
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    gate.open.set()
    await running
    assert served(inference).batcher.stats().cancelled == 1
    assert served(inference).statuses["test"][Status.CLIENT_CLOSED] == counted


async def test_a_deadline_shortens_the_queue_timeout_and_passes_as_a_gateway_timeout(
    inference: Inference, gate: Gate
) -> None:
    running = asyncio.ensure_future(infer(inference, 1.0))
    await until_started(gate)
    with pytest.raises(HTTPError) as info:
        await infer(inference, 2.0, withdrawal=Withdrawal(deadline_s=0.01))
    assert info.value.status == Status.GATEWAY_TIMEOUT
    assert "the call's deadline passed" in info.value.message
    with pytest.raises(DeadlineExceeded):  # the request's own timeout (10 ms) comes first
        await infer(
            inference,
            2.0,
            decode=decoding(request(2.0, timeout=10_000)),
            withdrawal=Withdrawal(deadline_s=30.0),
        )
    gate.open.set()
    await running
    assert served(inference).statuses["test"] == {
        Status.GATEWAY_TIMEOUT: 1,
        Status.UNAVAILABLE: 1,
        Status.OK: 1,
    }


async def test_work_that_finishes_first_is_kept() -> None:
    work: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    leaving = Leaving()
    waiting = asyncio.ensure_future(_unless_gone(work, leaving))
    await asyncio.sleep(0)
    work.set_result(7)
    assert await waiting == 7
    assert leaving.stopped  # no callback left behind on the connection
    leaving.leave()  # the client going afterwards changes nothing


async def test_a_client_that_leaves_cancels_the_work() -> None:
    started = asyncio.Event()

    async def slow() -> None:
        started.set()
        await asyncio.Event().wait()  # until cancelled

    work = asyncio.ensure_future(slow())
    leaving = Leaving()
    waiting = asyncio.ensure_future(_unless_gone(work, leaving))
    await started.wait()
    await asyncio.sleep(0)  # waiting watches now
    leaving.leave()
    with pytest.raises(ClientGone):
        await waiting
    assert work.cancelled()


async def test_a_client_gone_before_the_wait_cancels_the_work_at_once() -> None:
    work: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def already_gone(callback: Any) -> Any:
        callback()
        return lambda: None

    with pytest.raises(ClientGone):
        await _unless_gone(work, already_gone)
    assert work.cancelled()


async def test_cancelling_the_wait_cancels_the_work() -> None:
    work: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    leaving = Leaving()
    waiting = asyncio.ensure_future(_unless_gone(work, leaving))
    await asyncio.sleep(0)  # let it start waiting
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert waiting.cancelled()
    assert work.cancelled()
    assert leaving.stopped


async def test_a_cancel_beside_the_client_going_stays_a_cancel() -> None:
    work: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    leaving = Leaving()
    waiting = asyncio.ensure_future(_unless_gone(work, leaving))
    await asyncio.sleep(0)
    leaving.leave()
    waiting.cancel()  # the server's own cancel (the drain timeout) in the same turn
    await asyncio.gather(waiting, return_exceptions=True)
    assert waiting.cancelled()  # not ClientGone: the drain answers it
    assert work.cancelled()


def test_a_client_gone_at_its_calls_deadline_is_the_deadlines() -> None:
    """grpc cancels a call, and refuses its writes, once its deadline passes: that going is
    a 504's kind; before the deadline, or with none, it is the client's (499)."""
    now = time.monotonic()
    assert _outcome(Status.CLIENT_CLOSED, now - 0.001) == Status.GATEWAY_TIMEOUT
    assert _outcome(Status.CLIENT_CLOSED, now + 10) == Status.CLIENT_CLOSED
    assert _outcome(Status.CLIENT_CLOSED, None) == Status.CLIENT_CLOSED
    assert _outcome(Status.UNAVAILABLE, now - 1) == Status.UNAVAILABLE  # a drain's cut-off
