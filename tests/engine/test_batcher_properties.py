"""Properties of the engine under random traffic, on a real event loop.

Hypothesis draws the configuration (batch size, workers, policy, a sync model in threads or
an async one, error isolation, a queue bound) and the traffic: rows of three kinds (two share
a shape but not a dtype), single rows and multi-row requests larger than a batch, priorities,
deadlines, cancellations, and rows the model fails on. Arrivals are separated by event-loop
yields, never by wall-clock sleeps, and the model holds every batch behind a gate until each
short deadline has passed and each cancellation is done, so every outcome asserted here holds
however the machine schedules threads and timers.

While every worker is held, the engine may *stage* full batches (up to ``2 * workers``
dispatched, of which only ``workers`` reach the model); a staged request that is cancelled
or expires before its batch starts is skipped when the batch is claimed, never computed.
A spy on that claim records, for every dispatched batch, which rows it held and which it kept.

Every row carries its own code (request index and row number; negative when the model must
fail on it) in all its elements, so the model's records say exactly which rows it saw.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
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
    index: int  # the order in which calls entered the model
    codes: tuple[int, ...]
    dtype: np.dtype[Any]
    row_shape: tuple[int, ...]
    ok: bool | None = None


@dataclass
class Model:
    """Records every batch, holds it at the gate, then returns ``2 * row + 1`` or raises.

    The gate lets through the calls whose index is below ``passes``: none at first,
    ``release(n)`` lets the next ``n`` through, ``open()`` all of them from then on.
    """

    calls: list[Call] = field(default_factory=list)
    passes: float = 0
    active: int = 0  # calls inside the model now
    peak: int = 0  # the most calls ever inside the model at once
    lock: threading.Lock = field(default_factory=threading.Lock)

    def enter(self, batch: np.ndarray) -> Call:
        flat = batch.reshape(len(batch), -1)
        assert (flat == flat[:, :1]).all()  # rows arrive whole, never interleaved
        codes = tuple(int(c) for c in flat[:, 0])
        with self.lock:
            call = Call(len(self.calls), codes, batch.dtype, batch.shape[1:])
            self.calls.append(call)
            self.active += 1
            self.peak = max(self.peak, self.active)
        return call

    def leave(self, call: Call, batch: np.ndarray) -> np.ndarray:
        with self.lock:
            self.active -= 1
        call.ok = not any(c < 0 for c in call.codes)
        if not call.ok:
            raise ModelError(f"marked row in a batch of {len(batch)}")
        return batch * 2 + 1

    def held(self) -> int:
        """Calls that entered the model and are still held at the gate."""
        return max(0, len(self.calls) - int(min(self.passes, len(self.calls))))

    def seen(self) -> set[int]:
        return {c for call in self.calls for c in call.codes}


@dataclass
class ThreadModel(Model):
    cond: threading.Condition = field(default_factory=threading.Condition)

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        call = self.enter(batch)
        with self.cond:
            self.cond.wait_for(lambda: call.index < self.passes)
        return self.leave(call, batch)

    def release(self, n: float) -> None:
        with self.cond:
            self.passes += n
            self.cond.notify_all()

    def open(self) -> None:
        self.release(math.inf)


@dataclass
class LoopModel(Model):
    bump: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, batch: np.ndarray) -> np.ndarray:
        call = self.enter(batch)
        while call.index >= self.passes:
            await self.bump.wait()
        return self.leave(call, batch)

    def release(self, n: float) -> None:
        self.passes += n
        bump, self.bump = self.bump, asyncio.Event()
        bump.set()

    def open(self) -> None:
        self.release(math.inf)


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

# A dispatched batch as it started: per segment, its rows' codes and whether it was kept.
Claimed = list[tuple[tuple[int, ...], bool]]

SETTLE_POLLS = 10_000  # turns a hang into a failure (seconds); settling takes a few polls


def segment_codes(entry: Any, start: int, stop: int) -> tuple[int, ...]:
    rows = [entry.value] if entry.span is None else entry.value[start:stop]
    return tuple(int(np.asarray(row).flat[0]) for row in rows)


def spy_on_claims(batcher: Batcher) -> list[Claimed]:
    """Record every batch as it starts, and which of its segments the engine kept.

    Wraps the engine's private claim hook (``BatchExecutor._claim``, i.e. ``Resolver.claim``),
    the one place that sees skipped segments: their rows count in ``stats().rows`` but never
    reach the model. The wrapper only observes: it returns what the engine decided. A batch
    re-formed before it started (its rows went back to the queue) is not recorded.
    """
    executor = batcher._executor
    claim = executor._claim
    claimed: list[Claimed] = []

    def spy(batch: Any) -> Any:
        live = claim(batch)
        if batch.void:
            return live
        segments = batch.segments
        kept = range(len(segments)) if live is None else set(live)  # None: all kept
        claimed.append([(segment_codes(*segment), i in kept) for i, segment in enumerate(segments)])
        return live

    executor._claim = spy
    return claimed


@dataclass
class Run:
    reqs: list[Req]
    outcomes: list[Any]
    calls: list[Call]
    stacks: list[tuple[int, int]]
    claimed: list[Claimed]
    peak: int  # the most calls inside the model at once
    stats: carpool.BatcherStats
    cancelled: set[int]  # tasks we cancelled while the gate was shut, all still pending
    cancelled_settled: set[int]  # of those, the ones no row of which had reached the model
    cancelled_late: set[int]  # tasks cancelled with the gate open: they may have finished
    seen_at_gate: set[int]  # codes the model had seen when the gate opened
    late_infer_error: BaseException | None


async def settle(
    batcher: Batcher, model: Model, workers: int, *, holds_partial: bool = False
) -> None:
    """Wait (by yielding, and for fixed's timer) until nothing more can happen while the
    model holds its calls, short of a deadline or a cancel:

    - every worker holds a batch at the gate, or no dispatched batch is left to start:
      ``held == min(busy, workers)``, where ``busy`` counts dispatched, unfinished batches
      (staged ones included);
    - the scheduler has nothing to do: with a worker idle, nothing is queued (or, when the
      policy ``holds_partial`` batches for longer than the test runs, no key has a full
      batch queued); with all busy, ``2 * workers`` batches are dispatched or the head of
      the queue has no full batch to stage.

    - the loop has finished every batch whose call left the model (a worker hands a
      batch's results over as its next batch starts, through another thread).

    The same state is then read once more after several loop turns: a batch that a thread
    finished without calling the model (all its requests answered while it was staged)
    reaches the loop a few turns after that thread moved on.
    """
    last: tuple[int, ...] | None = None
    state: tuple[int, ...] = ()
    for _ in range(SETTLE_POLLS):
        for _ in range(8):
            await asyncio.sleep(0)
        stats = batcher.stats()
        busy = len(batcher._scheduler.in_flight)  # private: batches dispatched, not finished
        assert busy <= 2 * workers  # at most one staged batch per worker
        assert model.peak <= workers  # and only `workers` ever reach the model at once
        # private: what the scheduler checks before staging (or, when the policy waits,
        # dispatching) a full batch
        queue, most = batcher._queue, batcher.max_batch_size
        full = queue.head_of_full(most)
        head = queue.head()
        if busy < workers:
            quiet = stats.queued_rows == 0 or (holds_partial and full is None)
        else:
            quiet = busy == 2 * workers or head is None or queue.rows_like(head) < most
        held = model.held()
        state = (held, busy, stats.batches, stats.queued_rows, len(model.calls))
        # A worker hands a batch's results to the loop only as its next batch starts (or,
        # with none staged, at once): the loop must have seen every call that left the model.
        left = sum(call.ok is not None for call in model.calls)
        delivered = stats.batches - busy >= left
        if held == min(busy, workers) and quiet and delivered:
            if state == last:
                return
            last = state
        else:
            last = None
        await asyncio.sleep(1e-4)  # a thread reaching the model, or fixed's max_wait
    raise AssertionError(f"the engine never settled: (held, busy, ...) = {state}")


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
    claimed = spy_on_claims(batcher)

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
        claimed=claimed,
        peak=model.peak,
        stats=stats,
        cancelled=cancelled,
        cancelled_settled=cancelled_settled,
        cancelled_late=cancelled_late,
        seen_at_gate=seen_at_gate,
        late_infer_error=late_infer_error,
    )


# ----------------------------------------------------------------------- the properties


def plan_calls(segments: list[tuple[int, ...]], bisect: bool) -> list[tuple[int, ...]]:
    """The model calls one batch of these segments makes: whole, then halves on failure."""
    codes = tuple(c for segment in segments for c in segment)
    if not any(c < 0 for c in codes) or not bisect or len(segments) == 1:
        return [codes]
    mid = len(segments) // 2
    return [codes, *plan_calls(segments[:mid], bisect), *plan_calls(segments[mid:], bisect)]


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
    assert run.peak <= config.workers  # staged batches wait for a worker

    # Dispatched batches, as they started: bounded, one kind each, each row in at most one;
    # the rows kept are exactly the rows the model saw, so a skipped row never reached it.
    dispatched = [c for batch in run.claimed for codes, _ in batch for c in codes]
    kept = {c for batch in run.claimed for codes, live in batch if live for c in codes}
    skipped = {c for batch in run.claimed for codes, live in batch if not live for c in codes}
    assert len(dispatched) == len(set(dispatched))
    assert kept == seen
    for batch in run.claimed:
        codes = [c for segment, _ in batch for c in segment]
        assert 1 <= len(codes) <= config.max_batch_size
        assert len({run.reqs[owner(c)].kind for c in codes}) == 1

    for index, (req, outcome) in enumerate(zip(run.reqs, run.outcomes, strict=True)):
        mine = row_codes(req, index)
        if isinstance(outcome, QueueFull):
            tally["rejected"] += 1
            assert not mine & set(dispatched)
            assert index not in run.cancelled
        elif isinstance(outcome, asyncio.CancelledError) and index in run.cancelled_late:
            tally["cancelled late"] += 1  # withdrawn, or answered just before the cancel
        elif isinstance(outcome, asyncio.CancelledError):
            tally["cancelled"] += 1
            assert index in run.cancelled
            assert mine & seen <= run.seen_at_gate  # withdrawn: nothing left for the model
            if index in run.cancelled_settled:
                assert not mine & seen  # queued or staged when cancelled: never computed
        elif isinstance(outcome, DeadlineExceeded):
            tally["expired"] += 1
            assert req.deadline == "short"
            assert (outcome.timeout_ms, index in run.cancelled) == (SHORT_MS, False)
            if outcome.stage == "queued":
                assert not mine & seen  # withdrawn before any of its rows reached the model
            else:
                assert outcome.stage == "running"
                assert mine & seen  # some of its rows had reached the model
        elif isinstance(outcome, ModelError):
            tally["failed"] += 1
            assert type(outcome) is ModelError
            assert any("carpool" in note for note in getattr(outcome, "__notes__", []))
            assert req.deadline != "short"
            assert index not in run.cancelled | run.cancelled_late
            assert mine & failing  # a call holding its rows raised
            if config.isolate_errors:
                assert req.marked  # only the rows that raised fail their callers
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
            assert mine <= kept  # and none of them skipped
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
    # Rows and batches count when formed: a skipped row counts but never reached the model.
    assert stats.rows == len(seen) + len(skipped) == len(dispatched)
    assert stats.batches == len(run.claimed)  # every dispatched batch started once
    assert dict(stats.batch_sizes) == Counter(
        sum(len(codes) for codes, _ in batch) for batch in run.claimed
    )
    assert sum(stats.batch_sizes.values()) == stats.batches
    assert sum(size * n for size, n in stats.batch_sizes.items()) == stats.rows
    assert max(stats.batch_sizes, default=0) <= config.max_batch_size
    assert sum(stats.dispatch_reasons.values()) == stats.batches
    not_from = {"worker_idle"} if config.policy == "fixed" else {"wait_elapsed"}
    assert not not_from & stats.dispatch_reasons.keys()
    # The model was called exactly as planned from the segments kept: once per batch with a
    # row kept, then on each half of a failing call if errors are isolated.
    planned = [
        codes
        for batch in run.claimed
        if any(live for _, live in batch)
        for codes in plan_calls([seg for seg, live in batch if live], config.isolate_errors)
    ]
    assert Counter(planned) == Counter(call.codes for call in run.calls)
    assert isinstance(run.late_infer_error, BatcherClosed)


@pytest.mark.slow
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


# (priority, request index, row, kind): sorting rows gives the order they are served in.
Row = tuple[int, int, int, int]


class OneWorker:
    """What the scheduler does with one worker, as a plain model.

    A free worker takes a batch from the most urgent, earliest row queued: up to
    ``max_batch_size`` of that kind's rows in priority-then-arrival order. Under the
    ``"patient"`` policy (``"fixed"`` with a wait longer than the test) it takes that batch
    only when full, else the first full batch of another kind, else nothing until the
    batcher closes and drains. While the worker is busy and fewer than two batches are
    dispatched, the head's kind has a batch staged if it has a full one queued: the batch a
    free worker would take. A staged batch that a more urgent row overtakes (one admitted
    before the batch started) goes back to the queue, and is formed again.
    """

    def __init__(self, max_batch_size: int, policy: str) -> None:
        self.max_batch_size = max_batch_size
        self.waits = policy == "patient"
        self.partial = "worker_idle" if policy == "eager" else "wait_elapsed"
        self.closing = False
        self.queue: list[Row] = []
        self.busy = 0  # batches dispatched and not finished
        self.batches: list[list[Row]] = []  # in the order they were dispatched
        self.reasons: Counter[str] = Counter()

    def admit(self, rows: list[Row]) -> None:
        """Rows admitted in one loop tick; the scheduler then wakes once."""
        if self.busy == 2 and min(rows)[0] < self.batches[-1][-1][0]:
            staged = self.batches.pop()  # overtaken before it started: back to the queue
            self.reasons["full"] -= 1
            self.reasons += Counter()  # drop the zero
            self.busy -= 1
            rows = rows + staged
        self.queue = sorted(self.queue + rows)
        self.wake()

    def finish(self) -> None:
        """The running batch ends; the next staged one, if any, starts at once."""
        self.busy -= 1
        self.wake()

    def close(self) -> None:
        self.closing = True
        self.wake()

    def take(self, kind: int, reason: str) -> None:
        batch = [row for row in self.queue if row[3] == kind][: self.max_batch_size]
        self.queue = [row for row in self.queue if row not in batch]
        self.batches.append(batch)
        self.reasons[reason] += 1
        self.busy += 1

    def wake(self) -> None:
        while self.queue:
            counts = Counter(row[3] for row in self.queue)
            full = [row for row in self.queue if counts[row[3]] >= self.max_batch_size]
            head = self.queue[0][3]
            if self.busy >= 1:
                if self.busy >= 2 or counts[head] < self.max_batch_size:
                    return
                self.take(head, "full")  # staged
            elif counts[head] >= self.max_batch_size:
                self.take(head, "full")
            elif not self.waits:
                self.take(head, self.partial)
            elif self.closing:
                self.take(head, "drain")
            elif full:
                self.take(full[0][3], "full")  # not behind the head's partial batch
            else:
                return


@pytest.mark.slow
@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(
    max_batch_size=st.integers(1, 6),
    asynchronous=st.booleans(),
    policy=st.sampled_from(["eager", "fixed", "patient"]),
    blocked=st.booleans(),
    ticks=st.lists(
        st.tuples(
            st.lists(
                st.tuples(st.integers(0, 2), st.none() | st.integers(1, 10), st.integers(0, 3)),
                min_size=1,
                max_size=8,
            ),
            st.integers(0, 2),
        ),
        min_size=1,
        max_size=4,
    ),
)
# A full batch of another kind leaves while the policy holds the head's partial batch.
@example(
    max_batch_size=2,
    asynchronous=False,
    policy="patient",
    blocked=False,
    ticks=[([(0, None, 0)], 0), ([(1, 2, 1), (2, None, 2)], 1), ([(2, 3, 0)], 0)],
)
@example(
    max_batch_size=2,
    asynchronous=True,
    policy="patient",
    blocked=False,
    ticks=[([(0, None, 0)], 0), ([(1, 2, 1), (2, None, 2)], 1), ([(2, 3, 0)], 0)],
)
def test_queued_rows_leave_by_priority_then_arrival(
    max_batch_size: int,
    asynchronous: bool,
    policy: str,
    blocked: bool,
    ticks: list[tuple[list[tuple[int, int | None, int]], int]],
) -> None:
    """The model holds every batch while requests arrive in ticks (each admitted whole
    before the scheduler runs), behind a full batch that holds the worker if ``blocked``;
    after each tick, and then until all are done, batches are let through one at a time.

    Every batch a free worker takes starts at the most urgent, earliest row left (or is the
    first full one, if the policy holds the head's partial batch) and takes that kind's next
    rows in the same order, and while the worker is busy the head's full batch is staged,
    until a more urgent row overtakes it. After every tick and every batch, the engine has
    dispatched and queued exactly what :class:`OneWorker` says, and the model sees the batches
    in order."""
    reqs = [
        Req(kind, many, False, "none", prio, "no", 0)
        for tick, _ in ticks
        for kind, many, prio in tick
    ]
    sim = OneWorker(max_batch_size, policy)

    async def drive_ordered() -> tuple[Model, list[Any], carpool.BatcherStats]:
        model: ThreadModel | LoopModel = LoopModel() if asynchronous else ThreadModel()
        batcher = Batcher(
            model,
            max_batch_size=max_batch_size,
            policy="fixed" if policy == "patient" else policy,
            max_wait_ms=LONG_MS if policy == "patient" else 0.0,
            workers=1,
        )

        async def step() -> None:
            await settle(batcher, model, 1, holds_partial=sim.waits and not sim.closing)
            stats = batcher.stats()
            assert (stats.batches, stats.queued_rows) == (len(sim.batches), len(sim.queue))
            assert len(model.calls) == min(len(sim.batches), model.passes + 1)

        async def run_out(batches: float = math.inf) -> None:
            while sim.busy and batches > 0:
                model.release(1)
                sim.finish()
                await step()
                batches -= 1

        tasks = []
        async with batcher:
            try:
                if blocked:  # a full batch of its own kind (code 0)
                    x = np.zeros((max_batch_size, 1))
                    tasks.append(asyncio.ensure_future(batcher.infer_many(x)))
                    sim.admit([(0, -1, j, -1) for j in range(max_batch_size)])
                    await step()
                i = 0
                for tick, releases in ticks:
                    rows = []
                    for _ in tick:
                        r = reqs[i]
                        infer = batcher.infer if r.many is None else batcher.infer_many
                        x = make_input(i, r)
                        tasks.append(asyncio.ensure_future(infer(x, priority=r.priority)))
                        rows += [(r.priority, i, j, r.kind) for j in range(r.many or 1)]
                        i += 1
                    sim.admit(rows)
                    await step()
                    await run_out(releases)
                await run_out()
                if sim.queue:  # partial batches held by the policy leave as the batcher closes
                    closing = asyncio.ensure_future(batcher.aclose())
                    sim.close()
                    await step()
                    await run_out()
                    await closing
            finally:
                model.open()
            outcomes = await asyncio.gather(*tasks)
        return model, outcomes[1:] if blocked else outcomes, batcher.stats()

    model, outcomes, stats = asyncio.run(drive_ordered())

    expected = [[code(i, j, False) if i >= 0 else 0 for _, i, j, _ in b] for b in sim.batches]
    assert [list(call.codes) for call in model.calls] == expected
    assert model.peak == 1
    assert dict(stats.dispatch_reasons) == sim.reasons
    assert dict(stats.batch_sizes) == Counter(len(batch) for batch in sim.batches)
    for i, (r, out) in enumerate(zip(reqs, outcomes, strict=True)):
        assert np.array_equal(out, make_input(i, r) * 2 + 1)
