"""The engine users hold, on a real event loop: its options at the door, its lifecycle
(enter, drain on close, cancellation, once only) and its request API (``infer``,
``infer_many``, ``submit``). Events order what happens; no test depends on timing."""

from __future__ import annotations

import asyncio
import math
import threading
from typing import Any

import numpy as np
import pytest

from carpool import AdaptivePolicy, Batcher, BatcherClosed, CollationError
from conftest import Gate, accounted, line, rows, settle


async def test_each_caller_gets_its_own_row() -> None:
    async with Batcher(lambda b: b * 2 + 1, max_batch_size=8) as batcher:
        outs = await asyncio.gather(*(batcher.infer(np.full(3, i)) for i in range(20)))
    assert [o.tolist() for o in outs] == [[2 * i + 1] * 3 for i in range(20)]


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


async def test_submit_works_on_an_async_batcher_too() -> None:
    async with Batcher(lambda b: b + 1) as batcher:
        future = batcher.submit(np.array([1]))
        assert (await asyncio.wrap_future(future)).tolist() == [2]


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
