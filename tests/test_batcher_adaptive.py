"""The engine with policy="adaptive" on a real event loop.

Batches are held behind gates, so what is queued and what is in flight when a request
arrives is known exactly. The policy's cost model is a fake that already knows its line
(10 ms a batch + 1 ms a row) and learns nothing more, so every prediction is known; a spy on
the policy records each request at the door with the clock the batcher read. A request is
admitted when predicted done by 48 ms: the 50 ms objective less 2 ms of headroom. While
anything is ahead of it, its own batch is costed full (8 rows: 18 ms). The one thing no test
controls is how long ago the running batch started, so each accept or refuse below holds for
any elapsed time: the running batch is predicted to free its worker between now and 11 ms
from now.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np
import pytest

from carpool import (
    AdaptivePolicy,
    Admission,
    Batcher,
    BatcherStats,
    CostCurve,
    CostModel,
    Overloaded,
    QueueFull,
    QueueView,
)
from carpool.policy import Decision

KEY = (np.ndarray, (1,), np.dtype(np.int64))  # the collation key of np.array([i])
REFUSED = 99  # the value of every row a test expects to be refused


class FakeCost(CostModel):
    """A cost model that already knows its curves and learns nothing more; the batches it
    is told about are kept in ``seen``."""

    def __init__(self, curves: Mapping[Hashable, CostCurve]) -> None:
        super().__init__()
        self.curves = dict(curves)
        self.seen: list[tuple[int, float, Hashable]] = []

    def observe(self, rows: int, seconds: float, key: Hashable = None) -> None:
        self.seen.append((rows, seconds, key))

    def curve(self, key: Hashable = None) -> CostCurve | None:
        return self.curves.get(key, self.curves.get(None))


LINE = CostCurve(0.010, 0.001, 1.0, samples=100)


def line() -> FakeCost:
    return FakeCost({None: LINE})


def t(rows: int) -> float:
    """The fake's seconds for a batch of ``rows``, computed as the policy computes them."""
    return LINE.predict(rows)


class Spy(AdaptivePolicy):
    """The adaptive policy, recording what it was asked and what it answered."""

    def __init__(self, latency_slo_ms: float, *, cost: CostModel) -> None:
        super().__init__(latency_slo_ms, cost=cost)
        self.admitted: list[tuple[Admission, float, float | None]] = []
        self.views: list[tuple[QueueView, float, Decision]] = []

    def admit(self, request: Admission, now: float) -> float | None:
        late = super().admit(request, now)
        self.admitted.append((request, now, late))
        return late

    def decide(self, view: QueueView, now: float) -> Decision:
        decision = super().decide(view, now)
        self.views.append((view, now, decision))
        return decision


class Gate:
    """An async model that records each batch and blocks until released."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, batch: np.ndarray) -> np.ndarray:
        self.batches.append([int(v) for v in batch[:, 0]])
        self.entered.set()
        await self.release.wait()
        return batch * 10

    def open(self) -> None:
        self.release.set()

    def rows(self) -> list[int]:
        return sorted(v for batch in self.batches for v in batch)


class Turnstile:
    """An async model that holds each batch behind a gate of its own, opened by its index."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self._entered: list[asyncio.Event] = []
        self._release: list[asyncio.Event] = []

    @staticmethod
    def _event(events: list[asyncio.Event], index: int) -> asyncio.Event:
        while len(events) <= index:
            events.append(asyncio.Event())
        return events[index]

    async def __call__(self, batch: np.ndarray) -> np.ndarray:
        index = len(self.batches)
        self.batches.append([int(v) for v in batch[:, 0]])
        self._event(self._entered, index).set()
        await self._event(self._release, index).wait()
        return batch * 10

    async def entered(self, index: int) -> None:
        await self._event(self._entered, index).wait()

    def open(self, index: int) -> None:
        self._event(self._release, index).set()


async def settle() -> None:
    """Let every ready callback run (admission, the scheduler) a few rounds."""
    for _ in range(5):
        await asyncio.sleep(0)


def column(start: int, stop: int) -> np.ndarray:
    return np.arange(start, stop).reshape(-1, 1)


def accounted(stats: BatcherStats) -> None:
    """Every accepted request has exactly one outcome, and none is left pending."""
    done = stats.completed + stats.failed + stats.expired + stats.cancelled
    assert stats.submitted == done + stats.pending
    assert stats.pending == 0


def overloaded_message(error: Overloaded) -> str:
    return (
        f"Overloaded: {error.queued} rows queued ahead; this request would finish in about "
        f"{error.predicted_ms:.0f} ms, past its {error.budget_ms:.0f} ms latency objective. "
        "Retry later, relax the objective, or add workers."
    )


# construction


async def test_adaptive_by_name_serves_requests() -> None:
    async with Batcher(lambda b: b + 1, policy="adaptive", latency_slo_ms=50) as batcher:
        assert isinstance(batcher.policy, AdaptivePolicy)
        assert batcher.policy.latency_slo == 0.05
        assert batcher.learned() == "nothing yet"
        outs = await asyncio.gather(*(batcher.infer(np.array([i])) for i in range(20)))
        stats = batcher.stats()
    assert [o.tolist() for o in outs] == [[i + 1] for i in range(20)]
    assert (stats.submitted, stats.completed, stats.rejected, stats.overloaded) == (20, 20, 0, 0)
    assert stats.rows == 20
    accounted(stats)


def test_adaptive_by_name_needs_a_latency_objective() -> None:
    with pytest.raises(ValueError, match="needs a latency objective") as info:
        Batcher(lambda b: b, policy="adaptive")
    assert str(info.value) == (
        "policy 'adaptive' needs a latency objective: set latency_slo_ms (e.g. 50 for 50 ms)"
    )


@pytest.mark.parametrize("policy", ["eager", "fixed"])
def test_latency_slo_belongs_to_the_adaptive_policy_only(policy: str) -> None:
    with pytest.raises(ValueError, match="objective of policy='adaptive'") as info:
        Batcher(lambda b: b, policy=policy, latency_slo_ms=50)
    assert str(info.value) == (
        "latency_slo_ms is the objective of policy='adaptive'; set that policy, or drop "
        "latency_slo_ms"
    )


@pytest.mark.parametrize("slo", [0, -1.5, math.nan])
def test_latency_slo_is_validated(slo: float) -> None:
    with pytest.raises(ValueError, match="latency_slo_ms") as info:
        Batcher(lambda b: b, policy="adaptive", latency_slo_ms=slo)
    assert str(info.value) == f"latency_slo_ms must be finite and > 0, got {slo!r}"


def test_an_adaptive_policy_object_brings_its_own_objective() -> None:
    policy = AdaptivePolicy(20, cost=line())
    batcher = Batcher(lambda b: b, policy=policy)
    assert batcher.policy is policy


# warmup


@pytest.mark.parametrize(
    ("max_batch_size", "sizes"),
    [(8, [1, 2, 4, 8]), (6, [1, 3, 6]), (32, [1, 8, 16, 32]), (1, [1])],
)
async def test_warmup_warms_then_times_each_size_twice_while_entering(
    max_batch_size: int, sizes: list[int]
) -> None:
    seen: list[int] = []

    async def model(batch: np.ndarray) -> np.ndarray:
        seen.append(len(batch))
        return batch

    batcher = Batcher(
        model,
        policy="adaptive",
        latency_slo_ms=50,
        max_batch_size=max_batch_size,
        warmup=np.zeros(3),
    )
    policy = batcher.policy
    assert isinstance(policy, AdaptivePolicy)
    async with batcher:
        profiled = batcher.stats()
        # one untimed pass to warm the model, then two timed ones
        assert seen == sizes * 3
        assert policy.cost.observed == 2 * len(sizes)
        assert (profiled.batches, profiled.rows, profiled.submitted) == (0, 0, 0)
        assert dict(profiled.dispatch_reasons) == {}
        assert profiled.model_ms.count == 0  # profile batches are not served batches
        assert profiled.cost_curve is not None
        assert profiled.cost_curve.samples == 2 * len(sizes)
        assert profiled.cost_curve == policy.cost.curve((np.ndarray, (3,), np.dtype(np.float64)))
        assert batcher.learned().startswith("policy adaptive, objective 50 ms: t(b) = ")
        assert batcher.learned().endswith(f" {2 * len(sizes)} batches); 0 refused as overloaded")
        assert (await batcher.infer(np.ones(3))).tolist() == [1.0, 1.0, 1.0]
        served = batcher.stats()
    assert seen == sizes * 3 + [1]
    assert (served.batches, dict(served.batch_sizes)) == (1, {1: 1})
    assert served.prediction_ratio is not None  # warm: even the first batch was predicted
    assert served.prediction_ratio.count == 1
    assert policy.cost.observed == 2 * len(sizes) + 1


async def test_warmup_runs_a_thread_model_in_the_executor() -> None:
    threads: set[str] = set()

    def model(batch: np.ndarray) -> np.ndarray:
        threads.add(threading.current_thread().name)
        return batch

    batcher = Batcher(
        model,
        policy="adaptive",
        latency_slo_ms=50,
        max_batch_size=4,
        warmup=np.zeros(2),
        name="profiled",
    )
    async with batcher:
        assert (await batcher.infer(np.ones(2))).tolist() == [1.0, 1.0]
        stats = batcher.stats()
    assert stats.batches == 1
    assert stats.cost_curve is not None
    assert stats.cost_curve.samples == 2 * 3 + 1  # sizes 1, 2, 4 timed twice, the request
    assert threads
    assert all(name.startswith("profiled") for name in threads)


# learning from served batches


async def test_a_cold_policy_learns_from_the_batches_it_serves() -> None:
    async with Batcher(lambda b: b, policy="adaptive", latency_slo_ms=50) as batcher:
        assert batcher.stats().cost_curve is None
        assert batcher.stats().prediction_ratio is None
        for i in range(3):  # one after another: three batches of one row
            assert (await batcher.infer(np.array([i]))).tolist() == [i]
        stats = batcher.stats()
        learned = batcher.learned()
    assert stats.batches == 3
    assert stats.cost_curve is not None
    assert stats.cost_curve.samples == 3
    # the first batch ran before anything was learned: only the next two had a prediction
    assert stats.prediction_ratio is not None
    assert stats.prediction_ratio.count == 2
    assert learned == (
        f"policy adaptive, objective 50 ms: {stats.cost_curve}; 0 refused as overloaded"
    )


async def test_every_batch_is_reported_to_the_policy_with_its_rows_and_key() -> None:
    gate = Gate()
    cost = line()
    async with Batcher(gate, policy=AdaptivePolicy(50, cost=cost), max_batch_size=4) as batcher:
        first = asyncio.ensure_future(batcher.infer(np.array([0])))
        await gate.entered.wait()
        rest = [asyncio.ensure_future(batcher.infer(np.array([i]))) for i in range(1, 7)]
        await settle()
        gate.open()
        await asyncio.gather(first, *rest)
        stats = batcher.stats()
    assert [rows for rows, _, _ in cost.seen] == [len(b) for b in gate.batches] == [1, 4, 2]
    assert all(key == KEY and seconds >= 0 for _, seconds, key in cost.seen)
    assert stats.prediction_ratio is not None
    assert stats.prediction_ratio.count == 3  # the fake is warm from the start


# what the batcher tells the policy


async def test_requests_carry_their_deadline_to_the_door_and_to_the_scheduler() -> None:
    policy = Spy(50, cost=line())
    async with Batcher(lambda b: b, policy=policy) as batcher:
        await batcher.infer(np.array([1]))
        await batcher.infer(np.array([2]), timeout_ms=20)
        await batcher.infer(np.array([3]), timeout_ms=80)  # looser than the objective
    deadlines = [request.deadline - now for request, now, _ in policy.admitted]
    assert deadlines == [pytest.approx(0.05), pytest.approx(0.02), pytest.approx(0.05)]
    for (request, now, late), (view, _, _) in zip(policy.admitted, policy.views, strict=True):
        assert late is None
        assert view.head_arrival == now
        assert view.head_deadline == request.deadline
        assert (request.rows, request.rows_ahead, request.key, request.workers) == (1, 0, KEY, 1)
        assert request.in_flight == view.in_flight == ()
        assert (view.head_key, view.workers, view.max_batch_size) == (KEY, 1, 32)


async def test_the_policy_sees_the_running_batches_with_their_start() -> None:
    gate = Gate()
    policy = Spy(50, cost=line())
    async with Batcher(gate, policy=policy, workers=2, max_batch_size=8) as batcher:
        first = asyncio.ensure_future(batcher.infer(np.array([0])))
        await gate.entered.wait()
        second = asyncio.ensure_future(batcher.infer_many(column(1, 4)))
        await settle()
        assert len(gate.batches) == 2
        third = asyncio.ensure_future(batcher.infer(np.array([4])))
        await settle()
        gate.open()
        await asyncio.gather(first, second, third)
    # (start, rows) of each batch, the start being when a worker claimed it: after the policy
    # decided to dispatch it, before the next request came to the door
    (first_view, t0, _), (second_view, t1, _), (third_view, _, _) = policy.views
    (zero, _, _), (one, at1, _), (two, at2, _) = policy.admitted
    (s0, _), (s1, _) = two.in_flight
    assert s0 is not None
    assert s1 is not None
    assert t0 <= s0 <= at1 <= t1 <= s1 <= at2
    assert (zero.in_flight, one.in_flight, two.in_flight) == ((), ((s0, 1),), ((s0, 1), (s1, 3)))
    assert (one.workers, two.workers, two.rows_ahead) == (2, 2, 0)
    assert (first_view.in_flight, first_view.busy_workers, first_view.idle_workers) == ((), 0, 2)
    assert (second_view.in_flight, second_view.busy_workers) == (((s0, 1),), 1)
    assert second_view.head_rows == 3
    assert third_view.in_flight in {((s1, 3),), ((s0, 1),), ()}  # after the gate opened


async def test_a_staged_batch_has_no_start_until_a_worker_claims_it() -> None:
    model = Turnstile()
    policy = Spy(50, cost=line())
    async with Batcher(model, policy=policy, max_batch_size=8) as batcher:
        running = asyncio.ensure_future(batcher.infer(np.array([0])))
        await model.entered(0)
        staged = asyncio.ensure_future(batcher.infer_many(column(1, 9)))  # full: staged
        await settle()
        behind = asyncio.ensure_future(batcher.infer(np.array([9])))
        await settle()
        opened = time.monotonic()  # the batcher's clock
        model.open(0)
        await model.entered(1)  # the staged batch runs now
        last = asyncio.ensure_future(batcher.infer(np.array([10])))
        await settle()
        model.open(1)
        model.open(2)
        outs = await asyncio.gather(running, staged, behind, last)
    (_, decided, _) = policy.views[0]
    (zero, _, _), (one, at1, _), (two, at2, _), (three, at3, _) = policy.admitted
    assert zero.in_flight == ()
    ((started, _),) = one.in_flight
    assert started is not None
    assert decided <= started <= at1
    assert two.in_flight == ((started, 1), (None, 8))  # staged behind the running batch
    ((claimed, _),) = three.in_flight
    assert claimed is not None  # started when its worker freed, not when it was staged
    assert at2 <= opened <= claimed <= at3
    assert three.in_flight == ((claimed, 8),)
    assert (one.rows_ahead, two.rows_ahead, three.rows_ahead) == (0, 0, 1)
    assert all(late is None for _, _, late in policy.admitted)
    assert model.batches == [[0], list(range(1, 9)), [9, 10]]
    assert [o.tolist() for o in outs] == [[0], (column(1, 9) * 10).tolist(), [90], [100]]


# admission


async def test_overload_is_refused_at_once_and_what_fits_is_served() -> None:
    gate = Gate()
    cost = line()
    policy = Spy(50, cost=cost)
    async with Batcher(gate, policy=policy, max_batch_size=8) as batcher:
        running = asyncio.ensure_future(batcher.infer(np.array([0])))
        await gate.entered.wait()  # 1 row running: frees its worker within 11 ms
        # 0-11 ms + 8 rows (18 ms) = 29 ms at most: in time; staged as a full batch
        staged = asyncio.ensure_future(batcher.infer_many(column(1, 9)))
        await settle()
        assert (batcher.stats().running_rows, batcher.stats().queued_rows) == (9, 0)
        # 0-11 + 18 + 7 rows costed full (18 ms) = 47 ms at most: in time
        queued = asyncio.ensure_future(batcher.infer_many(column(9, 16)))
        # 0-11 + 18 + 8 rows (18 ms) = 47 ms at most: in time
        last = asyncio.ensure_future(batcher.infer(np.array([16])))
        await settle()
        assert (batcher.stats().running_rows, batcher.stats().queued_rows) == (9, 8)

        # 8 more rows: 0-11 + 18 + 18 + 18 = 54 ms at least, past 48 ms
        with pytest.raises(Overloaded) as info:
            await batcher.infer_many(np.full((8, 1), REFUSED))
        error = info.value
        request, now, late = policy.admitted[-1]
        (started, one), (staged_at, eight) = request.in_flight
        assert (one, eight, request.rows_ahead, request.rows) == (1, 8, 8, 8)
        assert started is not None
        assert started <= now
        assert staged_at is None  # staged behind the running batch: not started
        assert request.deadline == now + 0.05
        assert late is not None
        # the running batch, then the staged one, the 8 rows ahead, its own 8
        assert late == max(now, started + t(1)) + t(8) + t(8) + t(8)
        assert (error.queued, error.rows, error.max_queue_size) == (8, 8, 0)
        assert error.predicted_ms == pytest.approx((late - now) * 1000.0, abs=1e-9)
        assert 54.0 - 1e-9 <= error.predicted_ms <= 65.0 + 1e-9
        assert error.budget_ms == pytest.approx(50.0, abs=1e-9)
        assert str(error) == overloaded_message(error)
        assert isinstance(error, QueueFull)

        # a single row is refused too: its own batch is costed full, as rows arriving meanwhile
        # fill it, so 0-11 + 18 + 18 + 18 = 54-65 ms
        with pytest.raises(Overloaded) as single:
            await batcher.infer(np.array([REFUSED]))
        request, now, late = policy.admitted[-1]
        assert request.in_flight == ((started, 1), (None, 8))
        assert (request.rows_ahead, request.rows) == (8, 1)
        assert late == max(now, started + t(1)) + t(8) + t(8) + t(8)
        assert (single.value.queued, single.value.rows) == (8, 1)
        assert single.value.budget_ms == pytest.approx(50.0, abs=1e-9)
        refused = batcher.stats()
        assert (refused.rejected, refused.overloaded, refused.submitted) == (2, 2, 4)
        assert refused.queued_rows == 8  # nothing of the refused was queued

        gate.open()
        outs = await asyncio.gather(running, staged, queued, last)
        stats = batcher.stats()
        learned = batcher.learned()
    assert [o.tolist() for o in outs] == [
        [0],
        (column(1, 9) * 10).tolist(),
        (column(9, 16) * 10).tolist(),
        [160],
    ]
    assert gate.rows() == list(range(17))  # no refused row ever reached the model
    assert (stats.submitted, stats.completed, stats.rejected, stats.overloaded) == (4, 4, 2, 2)
    assert policy.overloaded == 2
    accounted(stats)
    assert stats.prediction_ratio is not None
    assert stats.prediction_ratio.count == len(gate.batches)
    assert learned == (
        "policy adaptive, objective 50 ms: t(b) = 10.00 ms + 1.000 ms x b "
        "(x1.00 margin, 100 batches); 2 refused as overloaded"
    )


async def test_a_timeout_refuses_what_the_objective_alone_admits() -> None:
    gate = Gate()
    policy = Spy(50, cost=line())
    async with Batcher(gate, policy=policy, max_batch_size=8) as batcher:
        running = asyncio.ensure_future(batcher.infer(np.array([0])))
        await gate.entered.wait()
        # 0-11 ms running + 8 rows (18 ms): 18-29 ms
        ahead = asyncio.ensure_future(batcher.infer_many(column(1, 8)))
        await settle()
        with pytest.raises(Overloaded) as info:
            await batcher.infer(np.array([REFUSED]), timeout_ms=15)
        assert info.value.budget_ms == pytest.approx(15.0, abs=1e-9)
        assert info.value.predicted_ms >= 18.0 - 1e-9
        # the same request under the 50 ms objective alone is admitted: 18-29 ms
        admitted = asyncio.ensure_future(batcher.infer(np.array([8])))
        # and so is one whose timeout is looser than the objective, the objective holding:
        # 0-11 + 8 rows ahead (18) + its own batch costed full (18) = 36-47 ms
        patient = asyncio.ensure_future(batcher.infer(np.array([9]), timeout_ms=600_000))
        await settle()
        gate.open()
        outs = await asyncio.gather(running, ahead, admitted, patient)
        stats = batcher.stats()
    (tight, at, _), (loose, loose_at, _) = policy.admitted[2], policy.admitted[4]
    assert (tight.deadline, loose.deadline) == (at + 0.015, loose_at + 0.05)
    assert [o.tolist() for o in (outs[0], outs[2], outs[3])] == [[0], [80], [90]]
    assert gate.rows() == list(range(10))
    assert (stats.submitted, stats.completed, stats.rejected, stats.overloaded) == (4, 4, 1, 1)
    assert stats.expired == 0
    accounted(stats)


async def test_a_high_priority_request_only_waits_for_what_is_served_before_it() -> None:
    gate = Gate()
    policy = Spy(50, cost=line())
    async with Batcher(gate, policy=policy, max_batch_size=8) as batcher:
        running = asyncio.ensure_future(batcher.infer(np.array([0])))
        await gate.entered.wait()
        staged = asyncio.ensure_future(batcher.infer_many(column(1, 9)))
        await settle()
        # 7 rows at priority 0, costed full: 0-11 + 18 + 18 = 36-47 ms
        backlog = asyncio.ensure_future(batcher.infer_many(column(9, 16)))
        await settle()
        # 8 rows at priority 1, behind the backlog: 0-11 + 18 + 8 (18) + 7 costed full (18)
        # = 54-65 ms
        with pytest.raises(Overloaded):
            await batcher.infer_many(np.full((8, 1), REFUSED), priority=1)
        # the same 8 rows at priority -1, ahead of the backlog: 0-11 + 18 + 18 = 36-47 ms
        # (admission still plans the staged batch first; it goes back to the queue after)
        urgent = asyncio.ensure_future(batcher.infer_many(column(16, 24), priority=-1))
        await settle()
        gate.open()
        outs = await asyncio.gather(running, staged, backlog, urgent)
        stats = batcher.stats()
    refused, admitted = policy.admitted[-2][0], policy.admitted[-1][0]
    assert (refused.rows_ahead, admitted.rows_ahead) == (7, 0)
    assert outs[3].tolist() == (column(16, 24) * 10).tolist()
    # the urgent rows ran before the staged batch and the backlog, which arrived earlier
    assert gate.batches == [[0], list(range(16, 24)), list(range(1, 9)), list(range(9, 16))]
    assert (stats.submitted, stats.completed, stats.overloaded) == (4, 4, 1)
    accounted(stats)


async def test_the_refusal_counts_only_the_rows_queued_ahead_of_the_request() -> None:
    # An urgent request refused while a backlog of a lower priority waits: the message must
    # not blame rows that would have run after it.
    gate = Gate()
    policy = Spy(50, cost=line())
    async with Batcher(gate, policy=policy, max_batch_size=8) as batcher:
        running = asyncio.ensure_future(batcher.infer(np.array([0])))
        await gate.entered.wait()
        staged = asyncio.ensure_future(batcher.infer_many(column(1, 9)))
        await settle()
        backlog = asyncio.ensure_future(batcher.infer_many(column(9, 15)))  # 6 rows, priority 0
        await settle()
        # 40 rows at priority -1, nothing ahead: 18 staged + 5 x 18 = 108 ms at least
        with pytest.raises(Overloaded) as info:
            await batcher.infer_many(np.full((40, 1), REFUSED), priority=-1)
        gate.open()
        await asyncio.gather(running, staged, backlog)
    assert policy.admitted[-1][0].rows_ahead == 0
    assert info.value.queued == 0
    assert str(info.value).startswith("Overloaded: 0 rows queued ahead;")


async def test_every_accepted_request_gets_exactly_one_answer_under_a_burst() -> None:
    gate = Gate()
    policy = Spy(50, cost=line())
    async with Batcher(gate, policy=policy, max_batch_size=8) as batcher:
        running = asyncio.ensure_future(batcher.infer(np.array([0])))
        await gate.entered.wait()
        tasks: list[asyncio.Task[Any]] = []
        for i in range(1, 41):
            tasks.append(asyncio.ensure_future(batcher.infer(np.array([i]))))
            await asyncio.sleep(0)  # the task is admitted or refused; a full batch staged
        # refused at the door, before any batch ran; the rest wait for the gate
        refused = [i for i, task in enumerate(tasks, 1) if task.done()]
        assert all(isinstance(tasks[i - 1].exception(), Overloaded) for i in refused)
        accepted = [task for task in tasks if not task.done()]
        await settle()
        gate.open()
        outs = await asyncio.gather(running, *accepted)
        stats = batcher.stats()
    served = [int(o[0]) // 10 for o in outs]
    # The i-th row has i - 1 rows ahead of it (queued, or staged as a full batch) if all
    # before it were admitted, and its own batch is costed full (18 ms). Rows 1-16 are done
    # within 11 ms + 18 + 18 = 47 ms, in time; from row 17 on, 18 x 3 = 54 ms at least, late:
    # whatever the running batch's elapsed time, exactly rows 1-16 are admitted.
    assert served == list(range(17))
    assert refused == list(range(17, 41))
    assert len(accepted) == 16
    assert gate.rows() == served
    assert (stats.submitted, stats.completed) == (len(accepted) + 1, len(accepted) + 1)
    assert (stats.rejected, stats.overloaded, policy.overloaded) == (len(refused),) * 3
    accounted(stats)


async def test_without_a_learned_cost_everything_is_admitted() -> None:
    gate = Gate()
    async with Batcher(gate, policy="adaptive", latency_slo_ms=1, max_batch_size=4) as batcher:
        running = asyncio.ensure_future(batcher.infer(np.array([0])))
        await gate.entered.wait()
        rest = [asyncio.ensure_future(batcher.infer(np.array([i]))) for i in range(1, 30)]
        await settle()
        stats = batcher.stats()
        assert (stats.rejected, stats.queued_rows + stats.running_rows) == (0, 30)
        gate.open()
        await asyncio.gather(running, *rest)
        stats = batcher.stats()
    assert (stats.submitted, stats.completed, stats.overloaded) == (30, 30, 0)
    accounted(stats)


def test_submit_from_a_thread_gets_overloaded_through_its_future() -> None:
    entered, release = threading.Event(), threading.Event()

    def model(batch: np.ndarray) -> np.ndarray:
        entered.set()
        assert release.wait(10)
        return batch

    with Batcher(model, policy=AdaptivePolicy(50, cost=line()), max_batch_size=8) as batcher:
        first = batcher.submit(np.array([0]))
        assert entered.wait(10)
        futures = [batcher.submit(np.array([i])) for i in range(1, 41)]
        admitted = batcher.stats()  # runs on the loop, after every submit was admitted
        # the refused futures are done at once; the rest wait for the model
        refused = [i for i, f in enumerate(futures, 1) if f.done()]
        assert all(isinstance(futures[i - 1].exception(timeout=0), Overloaded) for i in refused)
        assert (admitted.rejected, admitted.overloaded) == (len(refused), len(refused))
        assert admitted.submitted == 41 - len(refused)
        release.set()
        served = [
            int(f.result(timeout=10)[0])
            for i, f in enumerate([first, *futures])
            if i not in refused
        ]
        stats = batcher.stats()
    # as in the burst above: exactly rows 1-16 are admitted
    assert served == list(range(17))
    assert refused == list(range(17, 41))
    assert (stats.submitted, stats.completed, stats.rejected) == (
        len(served),
        len(served),
        len(refused),
    )
    accounted(stats)


async def test_a_warmup_the_model_fails_on_leaves_the_policy_cold(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def model(batch: np.ndarray) -> np.ndarray:
        if (batch < 0).any():
            raise ValueError("negative input")
        return batch

    batcher = Batcher(
        model, policy="adaptive", latency_slo_ms=50, warmup=np.full(2, -1.0), name="m"
    )
    with caplog.at_level("WARNING", logger="carpool"):
        async with batcher:
            assert batcher.stats().cost_curve is None
            assert (await batcher.infer(np.ones(2))).tolist() == [1.0, 1.0]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        "batcher 'm': warm-up failed (ValueError: negative input); "
        "the first requests warm it instead"
    ]
    assert batcher.stats().batches == 1


async def test_a_warmup_slower_than_the_objective_warns(caplog: pytest.LogCaptureFixture) -> None:
    # The fake predicts 11 ms for one row whatever the profile measured.
    batcher = Batcher(
        lambda b: b, policy=AdaptivePolicy(5, cost=line()), warmup=np.zeros(1), name="slow"
    )
    with caplog.at_level("WARNING", logger="carpool"):
        async with batcher:
            with pytest.raises(Overloaded):
                await batcher.infer(np.zeros(1))
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        "batcher 'slow': the latency objective (5 ms) is below the time of one batch "
        "(11.0 ms): every request will be refused as overloaded"
    ]


# learned()


def test_learned_names_a_policy_without_a_cost_model() -> None:
    assert Batcher(lambda b: b, policy="eager").learned() == "policy eager has no cost model"
    assert Batcher(lambda b: b, policy="fixed").learned() == "policy fixed has no cost model"
