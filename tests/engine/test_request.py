"""Each request's one outcome, on a real event loop: its deadline, its caller's cancel, a
request split over several batches. Events order what happens; no test depends on timing."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from carpool import Batcher, DeadlineExceeded
from carpool.collation.collate import Collator
from carpool.engine.inflight import Batch
from carpool.engine.queue import RequestQueue
from carpool.engine.request import Request, Resolver
from carpool.engine.stats import StatsRecorder
from conftest import Gate, rows, settle


async def test_deadline_while_queued_fails_fast_and_never_runs() -> None:
    gate = Gate()
    async with Batcher(gate, max_batch_size=8) as batcher:
        first = asyncio.ensure_future(batcher.infer(np.array([0])))
        await gate.entered.wait()
        late = asyncio.ensure_future(batcher.infer(np.array([1]), timeout_ms=1))
        patient = asyncio.ensure_future(batcher.infer(np.array([2]), timeout_ms=600_000))
        with pytest.raises(DeadlineExceeded) as info:
            await late  # fails while the worker is still blocked
        assert (info.value.stage, info.value.timeout_ms) == ("queued", 1.0)
        assert "Request timeout expired" in str(info.value)
        assert isinstance(info.value, TimeoutError)
        gate.open()
        assert (await first).tolist() == [0]
        assert (await patient).tolist() == [2]
        stats = batcher.stats()
    assert [rows(b) for b in gate.batches] == [[[0]], [[2]]]
    assert (stats.submitted, stats.completed, stats.expired, stats.pending) == (3, 2, 1, 0)


async def test_deadline_while_running_fails_at_the_deadline() -> None:
    gate = Gate()
    async with Batcher(gate) as batcher:
        doomed = asyncio.ensure_future(batcher.infer(np.array([1]), timeout_ms=1))
        with pytest.raises(DeadlineExceeded) as info:
            await doomed
        assert info.value.stage == "running"
        assert gate.running == 1  # the batch is still executing
        gate.open()
        assert (await batcher.infer(np.array([2]))).tolist() == [2]
        stats = batcher.stats()
    assert (stats.completed, stats.expired, stats.failed) == (1, 1, 0)


async def test_cancelling_a_queued_request_withdraws_it() -> None:
    gate = Gate()
    async with Batcher(gate, max_batch_size=8) as batcher:
        first = asyncio.ensure_future(batcher.infer(np.array([0])))
        await gate.entered.wait()
        keep = asyncio.ensure_future(batcher.infer(np.array([1])))
        drop = asyncio.ensure_future(batcher.infer(np.array([2])))
        await settle()
        assert batcher.stats().queued_rows == 2
        drop.cancel()
        await settle()
        assert batcher.stats().queued_rows == 1
        gate.open()
        await asyncio.gather(first, keep)
        stats = batcher.stats()
    assert drop.cancelled()
    assert [rows(b) for b in gate.batches] == [[[0]], [[1]]]
    assert (stats.submitted, stats.completed, stats.cancelled, stats.pending) == (3, 2, 1, 0)


async def test_cancelling_a_split_request_withdraws_its_remaining_rows() -> None:
    gate = Gate()
    async with Batcher(gate, max_batch_size=2) as batcher:
        big = asyncio.ensure_future(batcher.infer_many(np.arange(6).reshape(6, 1)))
        await gate.entered.wait()  # rows 0-1 are running, 2-5 queued
        big.cancel()
        await settle()
        assert batcher.stats().queued_rows == 0
        gate.open()
    assert [rows(b) for b in gate.batches] == [[[0], [1]]]
    assert batcher.stats().cancelled == 1


def test_a_request_holds_one_row_or_span_rows() -> None:
    one = Request("x", None, "k", 3, 1.5, future=None)
    many = Request("xs", 4, "k", 0, 2.0, future=None)
    assert (one.rows, one.span, one.priority, one.arrival, one.taken, one.queued) == (
        1,
        None,
        3,
        1.5,
        0,
        False,
    )
    assert (many.rows, many.span, many.pending) == (4, 4, 4)


# claiming a batch as it starts, against re-forming it on the loop


def resolver() -> Resolver:
    queue: RequestQueue[Request] = RequestQueue()
    stats = StatsRecorder()
    return Resolver(queue, stats, Collator(), name="m", wake=lambda: None)


def staged(*values: int) -> Batch[Request]:
    requests = [Request(v, None, "k", 0, 0.0, future=object()) for v in values]
    return Batch([(r, 0, 1) for r in requests], len(requests), "full")


def test_a_batch_claimed_as_it_starts_can_no_longer_go_back() -> None:
    books, batch = resolver(), staged(1, 2)
    assert books.claim(batch) is None  # every request still waits for it
    assert batch.started is not None
    assert all(entry.running for entry, _, _ in batch.segments)  # type: ignore[attr-defined]
    assert books.void(batch) is False
    assert batch.void is False


def test_a_batch_sent_back_before_it_starts_claims_nothing() -> None:
    books, batch = resolver(), staged(1, 2)
    assert books.void(batch) is True
    assert books.claim(batch) == []
    assert batch.started is None
    assert not any(entry.running for entry, _, _ in batch.segments)  # type: ignore[attr-defined]


def test_a_claim_skips_the_requests_answered_while_staged() -> None:
    books, batch = resolver(), staged(1, 2, 3)
    batch.segments[1][0].future = None  # type: ignore[attr-defined]  # cancelled meanwhile
    assert books.claim(batch) == [0, 2]
