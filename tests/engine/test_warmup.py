"""What the batcher learns about its model: warm-up batches while entering, every model
call's time reported to the policy, and the one-line summary of what it learned."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from carpool import AdaptivePolicy, Batcher, Overloaded
from conftest import KEY, Gate, line, settle, times_ten


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


async def test_warmup_runs_a_plain_model_in_its_worker_thread() -> None:
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
    gate = Gate(times_ten)
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


async def test_a_warmup_the_model_exits_on_leaves_the_policy_cold(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def model(batch: np.ndarray) -> np.ndarray:
        if (batch < 0).any():
            raise SystemExit(3)
        return batch

    batcher = Batcher(
        model, policy="adaptive", latency_slo_ms=50, warmup=np.full(2, -1.0), name="m"
    )
    with caplog.at_level("WARNING", logger="carpool"):
        async with batcher:  # SystemExit from the worker thread would stop the loop
            assert (await batcher.infer(np.ones(2))).tolist() == [1.0, 1.0]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1
    assert warnings[0].startswith("batcher 'm': warm-up failed (ModelExit: the model raised")


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


def test_learned_names_a_policy_without_a_cost_model() -> None:
    assert Batcher(lambda b: b, policy="eager").learned() == "policy eager has no cost model"
    assert Batcher(lambda b: b, policy="fixed").learned() == "policy fixed has no cost model"
