"""Properties of the engine under random traffic, on a real event loop.

Hypothesis draws the configuration (batch size, workers, policy, a sync model in threads or
an async one, error isolation, a queue bound) and the traffic: rows of three kinds (two share
a shape but not a dtype), single rows and multi-row requests larger than a batch, priorities,
deadlines, cancellations, and rows the model fails on. Arrivals are separated by event-loop
yields, never by wall-clock sleeps, and the model holds every batch behind a gate until each
short deadline has passed and each cancellation is done, so every outcome asserted here holds
however the machine schedules threads and timers.

Every row carries its own code (request index and row number; negative when the model must
fail on it) in all its elements, so the model's records say exactly which rows it saw.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import carpool
from carpool import Batcher, BatcherClosed, DeadlineExceeded, QueueFull

KINDS = (((3,), np.float32), ((3,), np.float64), ((2, 2), np.int64))
SHORT_MS = 1.0  # passes while the gate holds every batch
LONG_MS = 600_000.0  # never passes within a test
ROW_BITS = 64  # code = index * ROW_BITS + row + 1; multi-row requests stay below this


class ModelError(ValueError):
    """What the model raises on a batch holding a marked row."""


# ----------------------------------------------------------------------- the scenario


@dataclass(frozen=True)
class Config:
    max_batch_size: int
    workers: int
    policy: str
    max_wait_ms: float
    asynchronous: bool
    isolate_errors: bool
    max_queue_size: int | None


@dataclass(frozen=True)
class Req:
    kind: int
    many: int | None  # None: infer(row); k: infer_many(k rows)
    marked: bool  # the model raises on its rows
    deadline: str  # "none", "long" or "short"
    priority: int
    cancel: str  # "no"; "early": at the start of a later group; "settled": all workers busy;
    # "late": gate open, at the start of a later group or as the batcher starts closing
    cancel_delay: int  # groups after its own, for "early" and "late"


configs = st.builds(
    Config,
    max_batch_size=st.integers(1, 8),
    workers=st.integers(1, 3),
    policy=st.sampled_from(["eager", "fixed"]),
    max_wait_ms=st.sampled_from([0.0, 0.5]),
    asynchronous=st.booleans(),
    isolate_errors=st.booleans(),
    max_queue_size=st.none() | st.integers(4, 24),
)


def reqs(*, early: bool) -> st.SearchStrategy[Req]:
    return st.builds(
        Req,
        kind=st.integers(0, len(KINDS) - 1),
        many=st.none() | st.integers(1, 12),
        marked=st.integers(0, 4).map(lambda n: n == 0),
        deadline=st.sampled_from(["none", "long", "short"] if early else ["none", "long"]),
        priority=st.integers(0, 2),
        cancel=st.sampled_from(["no", "no", "early", "settled"] if early else ["no", "late"]),
        cancel_delay=st.integers(0, 3),
    )


def schedules(*, early: bool) -> st.SearchStrategy[list[tuple[list[Req], int]]]:
    """Groups of requests submitted together, each followed by that many loop yields."""
    group = st.tuples(st.lists(reqs(early=early), min_size=1, max_size=5), st.integers(0, 3))
    return st.lists(group, min_size=1 if early else 0, max_size=6 if early else 3)


def code(index: int, row: int, marked: bool) -> int:
    value = index * ROW_BITS + row + 1
    return -value if marked else value


def owner(row_code: int) -> int:
    return (abs(row_code) - 1) // ROW_BITS


def make_input(index: int, req: Req) -> np.ndarray:
    shape, dtype = KINDS[req.kind]
    count = 1 if req.many is None else req.many
    rows = np.stack([np.full(shape, code(index, j, req.marked), dtype) for j in range(count)])
    return rows[0] if req.many is None else rows


def row_codes(req: Req, index: int) -> set[int]:
    return {code(index, j, req.marked) for j in range(1 if req.many is None else req.many)}


# ----------------------------------------------------------------------- the model


@dataclass
class Call:
    codes: tuple[int, ...]
    dtype: np.dtype[Any]
    row_shape: tuple[int, ...]
    ok: bool | None = None


@dataclass
class Model:
    """Records every batch, holds it at the gate, then returns ``2 * row + 1`` or raises."""

    calls: list[Call] = field(default_factory=list)

    def enter(self, batch: np.ndarray) -> Call:
        flat = batch.reshape(len(batch), -1)
        assert (flat == flat[:, :1]).all()  # rows arrive whole, never interleaved
        call = Call(tuple(int(c) for c in flat[:, 0]), batch.dtype, batch.shape[1:])
        self.calls.append(call)
        return call

    @staticmethod
    def leave(call: Call, batch: np.ndarray) -> np.ndarray:
        call.ok = not any(c < 0 for c in call.codes)
        if not call.ok:
            raise ModelError(f"marked row in a batch of {len(batch)}")
        return batch * 2 + 1

    def seen(self) -> set[int]:
        return {c for call in self.calls for c in call.codes}


@dataclass
class ThreadModel(Model):
    gate: threading.Event = field(default_factory=threading.Event)

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        call = self.enter(batch)
        self.gate.wait()
        return self.leave(call, batch)

    def open(self) -> None:
        self.gate.set()


@dataclass
class LoopModel(Model):
    gate: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, batch: np.ndarray) -> np.ndarray:
        call = self.enter(batch)
        await self.gate.wait()
        return self.leave(call, batch)

    def open(self) -> None:
        self.gate.set()


class CheckingCollator(carpool.Collator):
    """The default collation, recording the kinds and rows of every batch it stacks."""

    def __init__(self) -> None:
        super().__init__()
        self.stacks: list[tuple[int, int]] = []  # (distinct keys, rows)

    def stack(self, values: list[Any], spans: list[int | None] | None = None) -> Any:
        each = spans if spans is not None else [None] * len(values)
        keys = {self.key(v, s is not None) for v, s in zip(values, each, strict=True)}
        rows = sum(1 if s is None else s for s in each)
        self.stacks.append((len(keys), rows))
        return super().stack(values, spans)


# ----------------------------------------------------------------------- one run


@dataclass
class Run:
    reqs: list[Req]
    outcomes: list[Any]
    calls: list[Call]
    stacks: list[tuple[int, int]]
    stats: carpool.BatcherStats
    cancelled: set[int]  # tasks we cancelled while the gate was shut, all still pending
    cancelled_settled: set[int]  # of those, the ones no row of which had been dispatched
    cancelled_late: set[int]  # tasks cancelled with the gate open: they may have finished
    seen_at_gate: set[int]  # codes the model had seen when the gate opened
    late_infer_error: BaseException | None


async def settle(batcher: Batcher, model: Model, workers: int) -> None:
    """Wait (by yielding, and for fixed's timer) until, with the gate shut, every dispatched
    batch has reached the model and nothing more can leave: all workers busy or queue empty."""
    while True:
        for _ in range(4):
            await asyncio.sleep(0)
        stats = batcher.stats()
        if len(model.calls) == stats.batches and (
            stats.batches == workers or stats.queued_rows == 0
        ):
            return
        await asyncio.sleep(1e-4)  # a thread reaching the model, or fixed's max_wait


async def drive(
    config: Config, early: list[tuple[list[Req], int]], late: list[tuple[list[Req], int]]
) -> Run:
    model: ThreadModel | LoopModel = LoopModel() if config.asynchronous else ThreadModel()
    collator = CheckingCollator()
    all_reqs: list[Req] = []
    tasks: list[asyncio.Task[Any]] = []
    started: set[int] = set()
    cancelled: set[int] = set()
    cancelled_settled: set[int] = set()
    cancelled_late: set[int] = set()
    batcher = Batcher(
        model,
        max_batch_size=config.max_batch_size,
        max_wait_ms=config.max_wait_ms,
        policy=config.policy,
        max_queue_size=config.max_queue_size,
        workers=config.workers,
        isolate_errors=config.isolate_errors,
        collator=collator,
    )

    async def call(index: int, req: Req) -> Any:
        started.add(index)  # admission happens before infer's first await
        timeout = {"none": None, "long": LONG_MS, "short": SHORT_MS}[req.deadline]
        x = make_input(index, req)
        if req.many is None:
            return await batcher.infer(x, timeout_ms=timeout, priority=req.priority)
        return await batcher.infer_many(x, timeout_ms=timeout, priority=req.priority)

    def launch(req: Req) -> int:
        index = len(all_reqs)
        all_reqs.append(req)
        tasks.append(asyncio.ensure_future(call(index, req)))
        return index

    def cancel(index: int, into: set[int] = cancelled) -> bool:
        task = tasks[index]
        if index not in started or task.done():
            return False
        assert task.cancel()
        into.add(index)
        return True

    async with batcher:
        try:
            due: dict[int, list[int]] = {}
            for g, (group, yields) in enumerate(early):
                for index in due.pop(g, []):
                    cancel(index)
                for req in group:
                    index = launch(req)
                    if req.cancel == "early" and req.deadline != "short":
                        due.setdefault(g + 1 + req.cancel_delay, []).append(index)
                for _ in range(yields):
                    await asyncio.sleep(0)
            await asyncio.sleep(0)  # every task has started, so has been admitted or refused
            for index in sorted(i for ids in due.values() for i in ids):
                cancel(index)

            await settle(batcher, model, config.workers)
            seen = model.seen()
            victims = []
            for index, req in enumerate(all_reqs):
                if (
                    req.cancel == "settled"
                    and req.deadline != "short"
                    and not row_codes(req, index) & seen
                    and cancel(index)
                ):
                    victims.append(tasks[index])
                    cancelled_settled.add(index)
            short = [t for t, r in zip(tasks, all_reqs, strict=True) if r.deadline == "short"]
            if victims or short:
                await asyncio.wait(victims + short)
            await settle(batcher, model, config.workers)
            seen_at_gate = model.seen()
            model.open()

            due = {}
            for g, (group, yields) in enumerate(late):
                for index in due.pop(g, []):
                    cancel(index, cancelled_late)
                for req in group:
                    index = launch(req)
                    if req.cancel == "late":
                        due.setdefault(g + 1 + req.cancel_delay, []).append(index)
                for _ in range(yields):
                    await asyncio.sleep(0)
            await asyncio.sleep(0)  # the last group starts before the batcher closes
            for index in sorted(i for ids in due.values() for i in ids):
                cancel(index, cancelled_late)  # these resume while the batcher drains
        finally:
            model.open()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    stats = batcher.stats()
    late_infer_error = None
    try:
        await batcher.infer(make_input(0, Req(0, None, False, "none", 0, "no", 0)))
    except BaseException as exc:
        late_infer_error = exc
    return Run(
        reqs=all_reqs,
        outcomes=outcomes,
        calls=model.calls,
        stacks=collator.stacks,
        stats=stats,
        cancelled=cancelled,
        cancelled_settled=cancelled_settled,
        cancelled_late=cancelled_late,
        seen_at_gate=seen_at_gate,
        late_infer_error=late_infer_error,
    )


# ----------------------------------------------------------------------- the properties


def check(config: Config, run: Run) -> None:
    seen = {c for call in run.calls for c in call.codes}
    succeeded = Counter(c for call in run.calls if call.ok for c in call.codes)
    failing = {c for call in run.calls if call.ok is False for c in call.codes}
    tally: Counter[str] = Counter()

    # Batches: bounded, one kind each, only rows of admitted requests.
    for call in run.calls:
        assert 1 <= len(call.codes) <= config.max_batch_size
        assert len(set(call.codes)) == len(call.codes)
        kinds = {run.reqs[owner(c)].kind for c in call.codes}
        assert len(kinds) == 1
        shape, dtype = KINDS[kinds.pop()]
        assert (call.row_shape, call.dtype) == (shape, np.dtype(dtype))
        assert call.ok is not None  # every call the model began also ended
    assert all(keys == 1 and 1 <= rows <= config.max_batch_size for keys, rows in run.stacks)
    assert all(n == 1 for n in succeeded.values())  # a row is computed at most once

    for index, (req, outcome) in enumerate(zip(run.reqs, run.outcomes, strict=True)):
        mine = row_codes(req, index)
        if isinstance(outcome, QueueFull):
            tally["rejected"] += 1
            assert not mine & seen
            assert index not in run.cancelled
        elif isinstance(outcome, asyncio.CancelledError) and index in run.cancelled_late:
            tally["cancelled late"] += 1  # withdrawn, or answered just before the cancel
        elif isinstance(outcome, asyncio.CancelledError):
            tally["cancelled"] += 1
            assert index in run.cancelled
            assert mine & seen <= run.seen_at_gate  # withdrawn: nothing left for the model
            if index in run.cancelled_settled:
                assert not mine & seen  # it was queued when cancelled, so never computed
        elif isinstance(outcome, DeadlineExceeded):
            tally["expired"] += 1
            assert req.deadline == "short"
            assert (outcome.timeout_ms, index in run.cancelled) == (SHORT_MS, False)
            if outcome.stage == "queued":
                assert not mine & seen  # withdrawn before any of its rows left
            else:
                assert outcome.stage == "running"
                assert mine & seen
        elif isinstance(outcome, ModelError):
            tally["failed"] += 1
            assert type(outcome) is ModelError
            assert any("carpool" in note for note in getattr(outcome, "__notes__", []))
            assert req.deadline != "short"
            assert index not in run.cancelled | run.cancelled_late
            if config.isolate_errors:
                assert req.marked  # only the rows that raised fail their callers
            else:
                assert req.marked or mine & failing
        else:
            tally["completed"] += 1
            assert isinstance(outcome, np.ndarray), outcome
            assert not req.marked
            assert req.deadline != "short"
            assert index not in run.cancelled | run.cancelled_late
            expected = make_input(index, req) * 2 + 1
            assert outcome.dtype == expected.dtype
            assert outcome.shape == expected.shape
            assert np.array_equal(outcome, expected)
            assert all(succeeded[c] == 1 for c in mine)  # its rows, each computed once
        if req.deadline == "short":
            assert isinstance(outcome, DeadlineExceeded | QueueFull)
        if config.isolate_errors and req.marked:
            assert not isinstance(outcome, np.ndarray)

    # Stats agree with what callers saw; everything accepted was answered.
    stats = run.stats
    admitted = len(run.reqs) - tally["rejected"]
    assert stats.submitted == admitted
    assert stats.expired == tally["expired"]
    # A late cancel reaches a request that was still waiting (counted cancelled) or one just
    # answered (counted by that answer); the rest are exact.
    surplus = (
        stats.completed - tally["completed"],
        stats.failed - tally["failed"],
        stats.cancelled - tally["cancelled"],
    )
    assert min(surplus) >= 0
    assert sum(surplus) == tally["cancelled late"] == len(run.cancelled_late)
    assert (stats.rejected, stats.pending, stats.queued_rows) == (tally["rejected"], 0, 0)
    assert stats.submitted == (
        stats.completed + stats.failed + stats.expired + stats.cancelled + stats.pending
    )
    assert stats.rows == len(seen)  # each dispatched row reached the model
    assert sum(stats.batch_sizes.values()) == stats.batches
    assert sum(size * n for size, n in stats.batch_sizes.items()) == stats.rows
    assert max(stats.batch_sizes, default=0) <= config.max_batch_size
    assert sum(stats.dispatch_reasons.values()) == stats.batches
    not_from = {"worker_idle"} if config.policy == "fixed" else {"wait_elapsed"}
    assert not not_from & stats.dispatch_reasons.keys()
    if not failing:
        assert len(run.calls) == stats.batches  # no bisection without a failure
    assert isinstance(run.late_infer_error, BatcherClosed)


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(config=configs, early=schedules(early=True), late=schedules(early=False))
def test_every_caller_gets_its_own_rows_or_its_own_error(
    config: Config, early: list[tuple[list[Req], int]], late: list[tuple[list[Req], int]]
) -> None:
    check(config, asyncio.run(drive(config, early, late)))


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(
    max_batch_size=st.integers(1, 6),
    asynchronous=st.booleans(),
    policy=st.sampled_from(["eager", "fixed"]),
    queued=st.lists(
        st.tuples(st.integers(0, 2), st.none() | st.integers(1, 10), st.integers(0, 3)),
        min_size=1,
        max_size=20,
    ),
)
def test_queued_rows_leave_by_priority_then_arrival(
    max_batch_size: int,
    asynchronous: bool,
    policy: str,
    queued: list[tuple[int, int | None, int]],
) -> None:
    """One worker held busy while everything queues: then every batch starts at the most
    urgent, earliest row left, and takes that kind's next rows in the same order."""
    reqs = [Req(kind, many, False, "none", prio, "no", 0) for kind, many, prio in queued]

    async def drive_ordered() -> tuple[list[Call], list[Any]]:
        model: ThreadModel | LoopModel = LoopModel() if asynchronous else ThreadModel()
        batcher = Batcher(
            model, max_batch_size=max_batch_size, policy=policy, max_wait_ms=0.0, workers=1
        )
        async with batcher:
            try:
                blocker = asyncio.ensure_future(batcher.infer(np.zeros(1)))
                await settle(batcher, model, workers=1)
                assert len(model.calls) == 1
                tasks = []
                for i, r in enumerate(reqs):
                    infer = batcher.infer if r.many is None else batcher.infer_many
                    x = make_input(i, r)
                    tasks.append(asyncio.ensure_future(infer(x, priority=r.priority)))
                await asyncio.sleep(0)
                assert batcher.stats().queued_rows == sum(r.many or 1 for r in reqs)
            finally:
                model.open()
            outcomes = await asyncio.gather(blocker, *tasks)
        return model.calls[1:], outcomes[1:]

    calls, outcomes = asyncio.run(drive_ordered())

    left = sorted(
        (r.priority, i, j, r.kind) for i, r in enumerate(reqs) for j in range(r.many or 1)
    )
    expected: list[list[int]] = []
    while left:
        kind = left[0][3]
        batch = [row for row in left if row[3] == kind][:max_batch_size]
        expected.append([code(i, j, False) for _, i, j, _ in batch])
        left = [row for row in left if row not in batch]
    assert [list(call.codes) for call in calls] == expected
    for i, (r, out) in enumerate(zip(reqs, outcomes, strict=True)):
        assert np.array_equal(out, make_input(i, r) * 2 + 1)
