"""The inference path with the response cache on: a hit answered without the model, identical
requests in flight sharing one computation that outlives the caller that started it, each
caller withdrawing alone, errors shared and never stored, and every request counted once (a
hit or a miss, in Triton's statistics). In process: a real registry, batcher and cache, no
server; events, not timers."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from carpool import Batching, Model
from carpool.errors import DeadlineExceeded
from carpool.server.inference.admission import DECODE_OFFLOAD_BYTES
from carpool.server.inference.cache import (
    ENTRY_OVERHEAD,
    REPLAY_OVERHEAD,
    ResponseCache,
    request_key,
)
from carpool.server.inference.call import Answer, Call, Replay, Withdrawal
from carpool.server.inference.path import ClientGone, Inference
from carpool.server.lifecycle.registry import Registry, ServedModel
from carpool.server.messages import InferInput, InferRequest, ProtocolError
from carpool.server.statuses import HTTPError, Status


class Counting:
    """The model: each row plus one, a negative row refused; counts the rows it saw, and
    holds every batch while ``open`` is clear (set by default)."""

    def __init__(self) -> None:
        self.rows = 0
        self.open = threading.Event()
        self.open.set()
        self.started = threading.Event()

    def __call__(self, batch: Any) -> Any:
        self.rows += len(batch)
        self.started.set()
        self.open.wait(30.0)
        if (batch < 0).any():
            raise ValueError("negative input")
        return batch + 1


@pytest.fixture
def model() -> Counting:
    return Counting()


async def path(model: Counting, *, cached: bool = True) -> AsyncIterator[Inference]:
    served = Model(model, name="m", batching=Batching(max_batch_size=8), response_cache=cached)
    inference = Inference(Registry([served]))
    inference.registry.cache = ResponseCache(1 << 20)
    async with only(inference).batcher:
        inference.registry.ready = True
        yield inference
        model.open.set()


@pytest.fixture
async def inference(model: Counting) -> AsyncIterator[Inference]:
    async for inference in path(model):
        yield inference


def only(inference: Inference) -> ServedModel:
    (served,) = inference.registry
    return served


def request(*values: float, request_id: str = "r", **parameters: Any) -> InferRequest:
    data = np.array([[v] for v in values], np.float32)
    data.flags.writeable = False
    tensor = InferInput("INPUT0", "FP32", data.shape, data, {})
    return InferRequest(request_id, parameters, (tensor,), None, False)


def encode(answer: Answer, read: Any = None) -> tuple[str | None, list[float]]:
    ((tensor, _),) = answer.outputs
    return answer.request.id, [float(v) for v in tensor.data.ravel()]


async def infer(inference: Inference, decoded: InferRequest, **options: Any) -> Any:
    async def read() -> bytes:
        return b"the body"

    def decode(model: Model, read: bytes) -> InferRequest:
        return decoded

    call = Call(protocol="test", model="m", read=read, decode=decode, encode=encode, **options)
    return await inference.infer(call)


async def joined(inference: Inference, decoded: InferRequest, callers: int) -> None:
    """Until ``callers`` wait for the computation of ``decoded``'s answer."""
    key = request_key("m", only(inference).generation, decoded)
    while inference.flights.waiting(key) != callers:  # noqa: ASYNC110 - a look per loop turn
        await asyncio.sleep(0)


async def started(model: Counting) -> None:
    assert await asyncio.to_thread(model.started.wait, 30.0)


async def test_a_repeated_request_is_answered_from_the_cache(
    inference: Inference, model: Counting
) -> None:
    assert await infer(inference, request(1.0, 2.0, request_id="a")) == ("a", [2.0, 3.0])
    assert await infer(inference, request(1.0, 2.0, request_id="b")) == ("b", [2.0, 3.0])
    assert await infer(inference, request(1.0, 2.0, priority=1)) == ("r", [2.0, 3.0])
    assert model.rows == 2  # the first request's rows only
    counts = only(inference).cache_counts
    assert (counts.misses, counts.hits) == (1, 2)
    assert counts.miss_seconds > 0
    assert counts.hit_seconds > 0
    assert only(inference).statuses == {"test": {Status.OK: 3}}
    assert await infer(inference, request(1.0, 2.5)) == ("r", [2.0, 3.5])  # another input
    assert model.rows == 4


async def test_statistics_count_a_hit_as_a_success_through_the_queue_that_ran_nothing(
    inference: Inference,
) -> None:
    for _ in range(3):
        await infer(inference, request(1.0, 2.0))
    stats = only(inference).statistics()
    assert stats["inference_count"] == 2  # the rows computed: Triton's leaves hits out
    assert stats["execution_count"] == 1
    inference_stats = stats["inference_stats"]
    assert inference_stats["success"]["count"] == 3
    assert inference_stats["compute_infer"]["count"] == 1
    assert inference_stats["queue"]["count"] == 3  # Triton's counts hits (perf_analyzer reads it)
    assert inference_stats["cache_hit"]["count"] == 2
    assert inference_stats["cache_miss"]["count"] == 1


async def test_identical_requests_in_flight_share_one_computation(
    inference: Inference, model: Counting
) -> None:
    model.open.clear()
    callers = [
        asyncio.ensure_future(infer(inference, request(5.0, request_id=str(i)))) for i in range(4)
    ]
    await started(model)
    await joined(inference, request(5.0), 4)
    model.open.set()
    assert await asyncio.gather(*callers) == [(str(i), [6.0]) for i in range(4)]
    assert model.rows == 1
    counts = only(inference).cache_counts
    assert (counts.misses, counts.hits) == (1, 3)


async def test_the_starter_leaving_does_not_fail_the_others(
    inference: Inference, model: Counting
) -> None:
    model.open.clear()
    leaving = Leaving()
    starter = asyncio.ensure_future(infer(inference, request(5.0), withdrawal=Withdrawal(leaving)))
    await started(model)
    follower = asyncio.ensure_future(infer(inference, request(5.0, request_id="f")))
    await joined(inference, request(5.0), 2)
    leaving.leave()
    with pytest.raises(ClientGone):
        await starter
    model.open.set()
    assert await follower == ("f", [6.0])
    assert only(inference).batcher.stats().completed == 1  # not withdrawn: the follower waited
    assert only(inference).statuses["test"] == {Status.CLIENT_CLOSED: 1, Status.OK: 1}
    assert await infer(inference, request(5.0)) == ("r", [6.0])  # stored for the next
    assert model.rows == 1


async def test_a_waiters_own_limits_end_its_wait_alone(
    inference: Inference, model: Counting
) -> None:
    model.open.clear()
    starter = asyncio.ensure_future(infer(inference, request(5.0)))
    await started(model)
    with pytest.raises(HTTPError) as info:
        await infer(inference, request(5.0), withdrawal=Withdrawal(deadline_s=0.01))
    assert info.value.status == Status.GATEWAY_TIMEOUT
    with pytest.raises(DeadlineExceeded):  # its own timeout parameter, 10 ms
        await infer(inference, request(5.0, timeout=10_000))
    model.open.set()
    assert await starter == ("r", [6.0])
    assert only(inference).statuses["test"] == {
        Status.GATEWAY_TIMEOUT: 1,
        Status.UNAVAILABLE: 1,
        Status.OK: 1,
    }


async def test_the_last_waiter_leaving_withdraws_the_computation(
    inference: Inference, model: Counting
) -> None:
    model.open.clear()
    running = asyncio.ensure_future(infer(inference, request(1.0)))  # holds the worker
    await started(model)
    leaving = Leaving()
    queued = asyncio.ensure_future(infer(inference, request(2.0), withdrawal=Withdrawal(leaving)))
    await joined(inference, request(2.0), 1)
    leaving.leave()
    with pytest.raises(ClientGone):
        await queued
    while only(inference).batcher.stats().cancelled != 1:  # noqa: ASYNC110
        await asyncio.sleep(0)  # withdrawn from the queue: nobody waits for it
    model.open.set()
    assert await running == ("r", [2.0])


async def test_an_error_is_shared_and_not_stored(inference: Inference, model: Counting) -> None:
    model.open.clear()
    callers = [asyncio.ensure_future(infer(inference, request(-1.0))) for _ in range(2)]
    await started(model)
    await joined(inference, request(-1.0), 2)
    model.open.set()
    for caller in callers:
        with pytest.raises(ValueError, match="negative input"):
            await caller
    with pytest.raises(ValueError, match="negative input"):  # computed again: not stored
        await infer(inference, request(-1.0))
    assert model.rows == 2
    counts = only(inference).cache_counts
    assert (counts.hits, counts.misses) == (0, 0)
    assert only(inference).statuses["test"] == {Status.INTERNAL_ERROR: 3}


async def test_a_hit_still_checks_the_scheduling_parameters(inference: Inference) -> None:
    await infer(inference, request(1.0))
    with pytest.raises(ProtocolError, match="priority"):
        await infer(inference, request(1.0, priority=-1))


async def test_a_model_without_the_cache_computes_every_request(model: Counting) -> None:
    async for inference in path(model, cached=False):
        for _ in range(2):
            assert await infer(inference, request(1.0)) == ("r", [2.0])
        assert model.rows == 2
        assert inference.registry.cache is not None
        assert len(inference.registry.cache) == 0
        assert only(inference).cache_counts.misses == 0


async def test_every_request_leaves_the_version_it_entered(
    inference: Inference, model: Counting
) -> None:
    await infer(inference, request(1.0))
    await infer(inference, request(1.0))
    with pytest.raises(ValueError, match="negative input"):
        await infer(inference, request(-1.0))
    assert only(inference).users == 0


class Leaving:
    """A :data:`~carpool.server.inference.path.GoneSignal` the test fires."""

    def __init__(self) -> None:
        self.callback: Any = None

    def __call__(self, callback: Any) -> Any:
        self.callback = callback
        return lambda: None

    def leave(self) -> None:
        assert self.callback is not None, "nobody watched"
        self.callback()


class Wire:
    """A front end's request as it came: its bytes, what ``decode`` makes of them, and how
    often it was read, decoded and encoded (a replay does neither of the last two)."""

    def __init__(self, decoded: InferRequest, body: bytes, header: bytes | None = None) -> None:
        self.decoded, self.parts = decoded, (header, body)
        self.reads = self.decodes = self.encodes = 0

    async def received(self) -> tuple[bytes | None, ...]:
        self.reads += 1
        return self.parts

    def decode(self, model: Model, read: tuple[bytes | None, ...]) -> InferRequest:
        self.decodes += 1
        return self.decoded

    def encode(self, answer: Answer, read: tuple[bytes | None, ...]) -> bytes:
        self.encodes += 1
        return repr(encode(answer)).encode()


def as_read(parts: tuple[bytes | None, ...]) -> tuple[bytes | None, ...]:
    return parts


async def sent(inference: Inference, wire: Wire) -> bytes:
    replay: Replay[tuple[bytes | None, ...], bytes] = Replay(as_read, len)
    call = Call(
        protocol="test", model="m", read=wire.received, decode=wire.decode,
        encode=wire.encode, replay=replay,
    )  # fmt: skip
    return await inference.infer(call)


async def test_a_request_repeated_byte_for_byte_is_replayed_neither_decoded_nor_encoded(
    inference: Inference, model: Counting
) -> None:
    cache = inference.registry.cache
    assert cache is not None
    wire = Wire(request(1.0, request_id="a"), b"the bytes of a")
    answer = repr(("a", [2.0])).encode()
    assert await sent(inference, wire) == answer  # computed: nothing kept encoded
    assert cache.bytes == ENTRY_OVERHEAD + 4
    assert await sent(inference, wire) == answer  # a hit: its encoded answer kept
    assert cache.bytes == ENTRY_OVERHEAD + 4 + REPLAY_OVERHEAD + len(answer)
    assert (wire.reads, wire.decodes, wire.encodes) == (2, 2, 2)
    for _ in range(3):
        assert await sent(inference, wire) == answer  # replayed
    assert (wire.reads, wire.decodes, wire.encodes) == (5, 2, 2)
    assert model.rows == 1
    counts = only(inference).cache_counts
    assert (counts.misses, counts.hits) == (1, 4)
    assert only(inference).statuses == {"test": {Status.OK: 5}}


async def test_other_bytes_for_the_same_inputs_share_the_answer_not_the_replay(
    inference: Inference, model: Counting
) -> None:
    first = Wire(request(1.0, request_id="a"), b"a")
    other = Wire(request(1.0, request_id="b"), b"b")  # another id: other bytes, other answer
    unsent = Wire(request(1.0, request_id="a"), b"a", header=b"")  # a header sent empty
    for wire in (first, first, other, other, unsent, unsent, unsent):
        await sent(inference, wire)
    assert model.rows == 1
    assert (first.encodes, other.encodes, unsent.encodes) == (2, 1, 1)
    assert await sent(inference, other) == repr(("b", [2.0])).encode()


async def test_a_failed_request_keeps_no_replay(inference: Inference, model: Counting) -> None:
    wire = Wire(request(-1.0), b"-1")
    for _ in range(3):
        with pytest.raises(ValueError, match="negative input"):
            await sent(inference, wire)
    assert model.rows == 3
    assert (wire.decodes, wire.encodes) == (3, 0)
    assert inference.registry.cache is not None
    assert inference.registry.cache.bytes == 0


async def test_a_large_body_is_hashed_off_the_loop(
    inference: Inference, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[str] = []
    run = inference.admissions.run

    async def recorded(step: Any, *args: Any, **kwargs: Any) -> Any:
        ran.append(step.__name__)
        return await run(step, *args, **kwargs)

    monkeypatch.setattr(inference.admissions, "run", recorded)
    await sent(inference, Wire(request(1.0), b"small"))
    assert ran == []
    await sent(inference, Wire(request(1.0), bytes(DECODE_OFFLOAD_BYTES)))
    assert ran == ["replay_key"]


async def test_an_answer_computed_for_a_version_no_longer_serving_is_not_kept(
    inference: Inference, model: Counting
) -> None:
    cache = inference.registry.cache
    assert cache is not None
    model.open.clear()
    wire = Wire(request(1.0), b"1")
    asked = asyncio.ensure_future(sent(inference, wire))
    await started(model)
    assert inference.registry.remove("m") is not None  # unloaded while it computes
    cache.drop("m")
    model.open.set()
    assert await asked == repr(("r", [2.0])).encode()  # answered all the same
    assert (len(cache), cache.bytes) == (0, 0)
