"""The engine on a real event loop. Events order what happens; no test depends on timing."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest

import carpool
from carpool import (
    Batcher,
    BatcherClosed,
    BatchSizeMismatch,
    CollationError,
    DeadlineExceeded,
    QueueFull,
)


class Gate:
    """An async model that records each batch and blocks until released."""

    def __init__(self, fn: Any = None) -> None:
        self.batches: list[Any] = []
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.running = 0
        self.max_running = 0
        self.fn = fn if fn is not None else (lambda batch: batch)

    async def __call__(self, batch: Any) -> Any:
        self.batches.append(batch)
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        self.entered.set()
        try:
            await self.release.wait()
        finally:
            self.running -= 1
        return self.fn(batch)

    def open(self) -> None:
        self.release.set()


async def settle() -> None:
    """Let every ready callback run (admission, the scheduler) a few rounds."""
    for _ in range(5):
        await asyncio.sleep(0)


def rows(batch: Any) -> list[Any]:
    return [row.tolist() if hasattr(row, "tolist") else row for row in batch]


async def test_each_caller_gets_its_own_row() -> None:
    async with Batcher(lambda b: b * 2 + 1, max_batch_size=8) as batcher:
        outs = await asyncio.gather(*(batcher.infer(np.full(3, i)) for i in range(20)))
    assert [o.tolist() for o in outs] == [[2 * i + 1] * 3 for i in range(20)]


async def test_rows_arriving_while_the_worker_is_busy_form_one_batch() -> None:
    gate = Gate()
    async with Batcher(gate, max_batch_size=16) as batcher:
        first = asyncio.ensure_future(batcher.infer(np.array([0])))
        await gate.entered.wait()
        rest = [asyncio.ensure_future(batcher.infer(np.array([i]))) for i in range(1, 11)]
        await settle()
        assert len(gate.batches) == 1  # nothing sealed while the only worker is busy
        assert (batcher.stats().running_rows, batcher.stats().queued_rows) == (1, 10)
        gate.open()
        await asyncio.gather(first, *rest)
        stats = batcher.stats()
        assert stats.running_rows == 0
    assert [rows(b) for b in gate.batches] == [[[0]], [[i] for i in range(1, 11)]]
    assert dict(stats.batch_sizes) == {1: 1, 10: 1}
    assert dict(stats.dispatch_reasons) == {"worker_idle": 2}


async def test_batches_never_exceed_max_batch_size() -> None:
    gate = Gate()
    async with Batcher(gate, max_batch_size=4) as batcher:
        first = asyncio.ensure_future(batcher.infer(np.array([0])))
        await gate.entered.wait()
        rest = [asyncio.ensure_future(batcher.infer(np.array([i]))) for i in range(1, 11)]
        await settle()
        gate.open()
        outs = await asyncio.gather(first, *rest)
        stats = batcher.stats()
    assert [o.tolist() for o in outs] == [[i] for i in range(11)]
    assert [len(b) for b in gate.batches] == [1, 4, 4, 2]
    assert dict(stats.dispatch_reasons) == {"worker_idle": 2, "full": 2}


async def test_eager_runs_a_lone_request_at_once() -> None:
    async with Batcher(lambda b: b, policy="eager", max_wait_ms=60_000) as batcher:
        assert (await batcher.infer(np.array([7]))).tolist() == [7]
        assert dict(batcher.stats().dispatch_reasons) == {"worker_idle": 1}


async def test_fixed_dispatches_a_full_batch_without_waiting() -> None:
    seen: list[int] = []

    def model(batch: np.ndarray) -> np.ndarray:
        seen.append(len(batch))
        return batch

    async with Batcher(model, policy="fixed", max_batch_size=4, max_wait_ms=60_000) as batcher:
        await asyncio.gather(*(batcher.infer(np.array([i])) for i in range(8)))
        assert dict(batcher.stats().dispatch_reasons) == {"full": 2}
    assert seen == [4, 4]


async def test_fixed_with_zero_wait_dispatches_partial_batches() -> None:
    async with Batcher(lambda b: b, policy="fixed", max_batch_size=8, max_wait_ms=0) as b:
        await asyncio.gather(*(b.infer(np.array([i])) for i in range(3)))
        assert dict(b.stats().dispatch_reasons) == {"wait_elapsed": 1}


async def test_closing_drains_a_partial_batch_at_once() -> None:
    batcher = Batcher(lambda b: b, policy="fixed", max_batch_size=8, max_wait_ms=3_600_000)
    async with batcher:
        pending = [asyncio.ensure_future(batcher.infer(np.array([i]))) for i in range(3)]
        await settle()
        assert not any(p.done() for p in pending)  # fixed holds them for an hour...
    assert [p.result().tolist() for p in pending] == [[0], [1], [2]]  # ...close does not
    stats = batcher.stats()
    assert dict(stats.dispatch_reasons) == {"drain": 1}
    assert (stats.completed, stats.pending) == (3, 0)


async def test_requests_of_different_shapes_are_batched_apart() -> None:
    gate = Gate()
    async with Batcher(gate, max_batch_size=16) as batcher:
        first = asyncio.ensure_future(batcher.infer(np.zeros(2)))
        await gate.entered.wait()
        shapes = [2, 3, 2, 3, 4, 2]
        rest = [asyncio.ensure_future(batcher.infer(np.full(n, i))) for i, n in enumerate(shapes)]
        await settle()
        gate.open()
        outs = await asyncio.gather(first, *rest)
    assert [o.tolist() for o in outs[1:]] == [[i] * n for i, n in enumerate(shapes)]
    assert [b.shape for b in gate.batches] == [(1, 2), (3, 2), (2, 3), (1, 4)]


async def test_infer_many_rows_join_other_requests_and_large_ones_are_split() -> None:
    gate = Gate()
    async with Batcher(gate, max_batch_size=4) as batcher:
        first = asyncio.ensure_future(batcher.infer(np.array([100])))
        await gate.entered.wait()
        small = asyncio.ensure_future(batcher.infer(np.array([50])))
        big = asyncio.ensure_future(batcher.infer_many(np.arange(10).reshape(10, 1)))
        await settle()
        gate.open()
        assert (await first).tolist() == [100]
        assert (await small).tolist() == [50]
        assert (await big).tolist() == [[i] for i in range(10)]
    assert [rows(b) for b in gate.batches] == [
        [[100]],
        [[50], [0], [1], [2]],
        [[3], [4], [5], [6]],
        [[7], [8], [9]],
    ]


async def test_infer_many_with_lists_and_dicts() -> None:
    async with Batcher(lambda b: [x * 10 for x in b], max_batch_size=3) as batcher:
        assert await batcher.infer_many([1, 2, 3, 4, 5]) == [10, 20, 30, 40, 50]

    def per_key(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"sum": batch["a"] + batch["b"], "a": batch["a"]}

    async with Batcher(per_key, max_batch_size=2) as batcher:
        out = await batcher.infer_many({"a": np.arange(3), "b": np.ones(3, int)})
        one = await batcher.infer({"a": np.int64(5), "b": np.int64(1)})
    assert out["sum"].tolist() == [1, 2, 3]
    assert out["a"].tolist() == [0, 1, 2]
    assert (int(one["sum"]), int(one["a"])) == (6, 5)


async def test_infer_many_needs_a_row() -> None:
    async with Batcher(lambda b: b) as batcher:
        with pytest.raises(CollationError, match="at least one row"):
            await batcher.infer_many(np.zeros((0, 3)))


async def test_queue_full_is_immediate_and_queues_nothing() -> None:
    gate = Gate()
    async with Batcher(gate, max_batch_size=8, max_queue_size=3) as batcher:
        first = asyncio.ensure_future(batcher.infer(np.array([0])))
        await gate.entered.wait()  # the first row left the queue: 3 slots free
        queued = [asyncio.ensure_future(batcher.infer(np.array([i]))) for i in (1, 2)]
        await settle()
        with pytest.raises(QueueFull) as info:
            await batcher.infer_many(np.zeros((2, 1), int))
        assert (info.value.max_queue_size, info.value.queued, info.value.rows) == (3, 2, 2)
        assert "max_queue_size=3" in str(info.value)
        last = asyncio.ensure_future(batcher.infer(np.array([3])))  # exactly fills the bound
        await settle()
        gate.open()
        outs = await asyncio.gather(first, *queued, last)
        stats = batcher.stats()
    assert [o.tolist() for o in outs] == [[0], [1], [2], [3]]
    assert (stats.submitted, stats.completed, stats.rejected) == (4, 4, 1)
    assert sum(len(b) for b in gate.batches) == 4


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


async def test_priority_orders_the_queue_fifo_within_a_level() -> None:
    gate = Gate()
    async with Batcher(gate, max_batch_size=3) as batcher:
        running = asyncio.ensure_future(batcher.infer(np.array([99]), priority=5))
        await gate.entered.wait()
        plan = [(10, 5), (11, 0), (12, -1), (13, 0), (14, 5), (15, -1)]
        futures = [asyncio.ensure_future(batcher.infer(np.array([v]), priority=p)) for v, p in plan]
        await settle()
        gate.open()
        await asyncio.gather(running, *futures)
    # the running batch is never overtaken; then -1s, 0s, 5s, each level in arrival order
    assert [rows(b) for b in gate.batches] == [[[99]], [[12], [15], [11]], [[13], [10], [14]]]


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


async def test_a_model_error_reaches_only_the_failing_rows() -> None:
    calls: list[int] = []

    def model(batch: np.ndarray) -> np.ndarray:
        calls.append(len(batch))
        if (batch < 0).any():
            raise ValueError("negative input")
        return batch * 2

    async with Batcher(model, max_batch_size=8) as batcher:
        results = await asyncio.gather(
            *(batcher.infer(np.array([v])) for v in [1, 2, -3, 4, 5, 6, 7, 8]),
            return_exceptions=True,
        )
        stats = batcher.stats()
    error = results[2]
    assert isinstance(error, ValueError)
    assert str(error) == "negative input"
    assert any("on a batch of 1 rows" in note for note in error.__notes__)
    assert [r.tolist() for i, r in enumerate(results) if i != 2] == [
        [2], [4], [8], [10], [12], [14], [16]
    ]  # fmt: skip
    # halves re-run down to the bad row: 8 -> 4 (bad) -> 2 (ok), 2 (bad) -> 1 (bad), 1 -> 4 (ok)
    assert calls == [8, 4, 2, 2, 1, 1, 4]
    assert (stats.completed, stats.failed) == (7, 1)


async def test_without_isolation_the_whole_batch_fails() -> None:
    def model(batch: np.ndarray) -> np.ndarray:
        if (batch < 0).any():
            raise ValueError("negative input")
        return batch

    async with Batcher(model, max_batch_size=4, isolate_errors=False) as batcher:
        results = await asyncio.gather(
            *(batcher.infer(np.array([v])) for v in [1, -2, 3, 4]), return_exceptions=True
        )
        assert (await batcher.infer(np.array([5]))).tolist() == [5]  # the next batch is fine
    assert all(isinstance(r, ValueError) for r in results)


async def test_wrong_row_count_is_an_error_for_the_whole_batch() -> None:
    async with Batcher(lambda b: b[:-1], max_batch_size=4) as batcher:
        results = await asyncio.gather(
            *(batcher.infer(np.array([v])) for v in range(4)), return_exceptions=True
        )
    assert all(isinstance(r, BatchSizeMismatch) for r in results)
    error = results[0]
    assert isinstance(error, BatchSizeMismatch)
    assert (error.expected, error.actual) == (4, 3)
    assert "returned 3 rows" in str(error)
    assert "batch of 4 rows" in str(error)


async def test_workers_run_batches_concurrently_and_results_route_correctly() -> None:
    releases = [asyncio.Event(), asyncio.Event()]
    entered: list[asyncio.Event] = [asyncio.Event(), asyncio.Event()]
    order: list[int] = []

    async def model(batch: np.ndarray) -> np.ndarray:
        index = len(order)
        order.append(index)
        entered[index].set()
        await releases[index].wait()
        return batch + 1000 * index

    async with Batcher(model, max_batch_size=4, workers=2) as batcher:
        first = asyncio.ensure_future(batcher.infer(np.array([1])))
        await entered[0].wait()
        second = asyncio.ensure_future(batcher.infer(np.array([2])))
        await entered[1].wait()  # both workers busy at once
        releases[1].set()  # the later batch finishes first
        assert (await second).tolist() == [1002]
        assert not first.done()
        releases[0].set()
        assert (await first).tolist() == [1]


async def test_a_plain_model_runs_in_worker_threads() -> None:
    threads: set[int] = set()

    def model(batch: np.ndarray) -> np.ndarray:
        threads.add(threading.get_ident())
        return batch

    async with Batcher(model) as batcher:
        await batcher.infer(np.array([1]))
    assert threads
    assert threading.get_ident() not in threads


async def test_torch_tensors_are_stacked_and_split() -> None:
    import torch

    async with Batcher(lambda b: b.sum(dim=1, keepdim=True), max_batch_size=4) as batcher:
        outs = await asyncio.gather(*(batcher.infer(torch.full((3,), float(i))) for i in range(6)))
    assert [o.tolist() for o in outs] == [[3.0 * i] for i in range(6)]


async def test_close_finishes_accepted_requests_then_refuses_new_ones() -> None:
    gate = Gate()
    batcher = Batcher(gate, max_batch_size=2)
    async with batcher:
        accepted = [asyncio.ensure_future(batcher.infer(np.array([i]))) for i in range(5)]
        await gate.entered.wait()
        closing = asyncio.ensure_future(batcher.aclose())
        await settle()
        with pytest.raises(BatcherClosed, match="is closing"):
            await batcher.infer(np.array([9]))
        assert not closing.done()
        gate.open()
        await closing
    assert [a.result().tolist() for a in accepted] == [[i] for i in range(5)]
    with pytest.raises(BatcherClosed, match="is closed"):
        await batcher.infer(np.array([9]))
    stats = batcher.stats()
    assert (stats.submitted, stats.completed, stats.pending, stats.rejected) == (5, 5, 0, 2)


async def test_cancelling_the_owner_answers_every_pending_request() -> None:
    gate = Gate()
    batcher = Batcher(gate, max_batch_size=2)
    requests: list[asyncio.Future[Any]] = []

    async def owner() -> None:
        async with batcher:
            requests.extend(asyncio.ensure_future(batcher.infer(np.array([i]))) for i in range(4))
            await gate.entered.wait()
            await asyncio.Event().wait()  # until cancelled

    task = asyncio.ensure_future(owner())
    await gate.entered.wait()
    await settle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    outcomes = await asyncio.gather(*requests, return_exceptions=True)
    assert all(isinstance(o, BatcherClosed) for o in outcomes)
    assert "was cancelled" in str(outcomes[0])
    stats = batcher.stats()
    assert (stats.submitted, stats.failed, stats.pending) == (4, 4, 0)


async def test_infer_before_start_or_from_another_thread_is_refused() -> None:
    batcher = Batcher(lambda b: b)
    with pytest.raises(BatcherClosed, match="not started"):
        await batcher.infer(np.array([1]))
    async with batcher:
        errors: list[BaseException] = []

        def elsewhere() -> None:
            try:
                asyncio.run(batcher.infer(np.array([1])))
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=elsewhere)
        thread.start()
        await asyncio.to_thread(thread.join)
    assert isinstance(errors[0], RuntimeError)
    assert "submit()" in str(errors[0])


async def test_a_batcher_runs_once() -> None:
    batcher = Batcher(lambda b: b)
    async with batcher:
        pass
    with pytest.raises(RuntimeError, match="runs once"):
        async with batcher:
            pass


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"max_batch_size": 0}, ValueError, "max_batch_size must be >= 1, got 0"),
        ({"max_batch_size": 2.0}, TypeError, "max_batch_size must be an int, got float"),
        ({"max_batch_size": True}, TypeError, "max_batch_size must be an int, got bool"),
        ({"max_wait_ms": -1}, ValueError, "max_wait_ms must be finite and >= 0, got -1"),
        ({"max_wait_ms": float("nan")}, ValueError, "max_wait_ms must be finite"),
        ({"max_wait_ms": "5"}, TypeError, "max_wait_ms must be a number of milliseconds"),
        ({"max_queue_size": 0}, ValueError, "max_queue_size must be >= 1, got 0"),
        ({"workers": 0}, ValueError, "workers must be >= 1, got 0"),
        ({"policy": "fastest"}, ValueError, "policy must be one of 'eager', 'fixed'"),
        ({"policy": 3}, TypeError, "policy must be a name or an object with decide"),
        ({"isolate_errors": 1}, TypeError, "isolate_errors must be a bool, got int"),
    ],
)
def test_options_are_validated_at_the_door(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        Batcher(lambda b: b, **kwargs)


def test_model_fn_must_be_callable() -> None:
    with pytest.raises(TypeError, match="model_fn must be callable, got int"):
        Batcher(3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"timeout_ms": 0}, ValueError, "timeout_ms must be finite and > 0, got 0"),
        ({"timeout_ms": "1"}, TypeError, "timeout_ms must be a number"),
        ({"priority": 1.5}, TypeError, "priority must be an int, got float"),
    ],
)
async def test_request_options_are_validated(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    async with Batcher(lambda b: b) as batcher:
        with pytest.raises(error, match=message):
            await batcher.infer(np.array([1]), **kwargs)
        with pytest.raises(error, match=message):
            batcher.submit(np.array([1]), **kwargs)
        assert batcher.stats().submitted == 0


async def test_a_custom_policy_decides() -> None:
    class AtLeastThree:
        def decide(
            self, view: carpool.QueueView, now: float
        ) -> carpool.Dispatch | carpool.WaitUntil:
            if view.head_rows >= 3:
                return carpool.Dispatch(3, carpool.DispatchReason.FULL)
            return carpool.WaitUntil(float("inf"))

    seen: list[int] = []

    def model(batch: np.ndarray) -> np.ndarray:
        seen.append(len(batch))
        return batch

    async with Batcher(model, policy=AtLeastThree(), max_batch_size=8) as batcher:
        first = [asyncio.ensure_future(batcher.infer(np.array([i]))) for i in range(2)]
        await settle()
        assert seen == []
        last = asyncio.ensure_future(batcher.infer(np.array([2])))
        await asyncio.gather(*first, last)
    assert seen == [3]


async def test_submit_works_on_an_async_batcher_too() -> None:
    async with Batcher(lambda b: b + 1) as batcher:
        future = batcher.submit(np.array([1]))
        assert (await asyncio.wrap_future(future)).tolist() == [2]


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_more_urgent_request_overtakes_a_staged_batch(kind: str) -> None:
    """Defect 1 of issue 10: while the worker is busy, a full batch is staged; a more
    urgent request that arrives later must still run before it."""
    entered, release = threading.Event(), threading.Event()
    batches: list[list[int]] = []

    def enter(batch: np.ndarray) -> None:
        batches.append([int(v) for v in batch[:, 0]])
        entered.set()

    def model(batch: np.ndarray) -> np.ndarray:
        enter(batch)
        assert release.wait(10)
        return batch

    async def async_model(batch: np.ndarray) -> np.ndarray:
        enter(batch)
        await asyncio.to_thread(release.wait, 10)
        return batch

    async with Batcher(model if kind == "sync" else async_model, max_batch_size=1) as batcher:
        running = asyncio.ensure_future(batcher.infer(np.array([0]), priority=3))
        assert await asyncio.to_thread(entered.wait, 10)
        queued = [
            asyncio.ensure_future(batcher.infer(np.array([i]), priority=3)) for i in (1, 2, 3)
        ]
        await settle()
        assert batcher.stats().running_rows == 2  # one running, one staged behind it
        urgent = asyncio.ensure_future(batcher.infer(np.array([9]), priority=-2))
        await settle()
        release.set()
        await asyncio.gather(running, *queued, urgent)
        stats = batcher.stats()
    assert batches == [[0], [9], [1], [2], [3]]
    assert (stats.batches, stats.rows, dict(stats.batch_sizes)) == (5, 5, {1: 5})
    assert (stats.queue_wait_ms.count, stats.completed) == (5, 5)
