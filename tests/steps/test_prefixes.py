"""Prompt-state reuse through the step loop: the batcher's budget split over its replicas and
offered to each model once (threads and child processes), each tick's counts in its report,
their sums over the replicas in ``stats()`` (never going down when a replica restarts), and
one log line for a model that cannot reuse."""

from __future__ import annotations

import logging

import pytest

from carpool.errors import ConfigError
from carpool.steps.batcher import StepBatcher
from carpool.steps.model import PrefixCounts
from carpool.steps.replica import StepReplica, StepReport, Tick
from carpool.steps.stats import StepStats
from steps.models import Counter, Reusing

NO_REUSE = "cannot reuse prompt state"


def test_a_replica_offers_its_budget_once_and_reports_counts_after_each_tick() -> None:
    model = Reusing()
    replica = StepReplica(model, prefix_budget=100)
    assert model.budget == 100
    report = replica(Tick(joins=[(1, (1, 2, 3)), (2, (4,))]))
    assert report.outputs == [(1, (100, 0, 3)), (2, (100, 0, 1))]
    assert report.prefixes == PrefixCounts(hits=0, reused=0, computed=4)  # this tick's starts
    report = replica(Tick(joins=[(3, (1, 2, 3, 4))]))
    assert report.prefixes == PrefixCounts(hits=1, reused=3, computed=5)


def test_without_a_budget_a_model_is_never_asked_and_reports_nothing() -> None:
    model = Reusing()
    report = StepReplica(model)(Tick(joins=[(1, (1, 2))]))
    assert (model.budget, report.prefixes) == (0, None)
    assert StepReplica(Counter(), prefix_budget=100)(Tick()).prefixes is None


def test_counts_of_one_replica_are_exact() -> None:
    with StepBatcher(Reusing, prefix_cache_bytes=64) as batcher:
        assert batcher.stats().prefixes == PrefixCounts()  # it reuses: counted from 0
        outputs = [batcher.stream(p).collect_sync() for p in ((1, 2, 3), (1, 2, 3, 4), (5,))]
    assert outputs == [[(64, 0, 3)], [(64, 3, 1)], [(64, 0, 1)]]
    assert batcher.stats().prefixes == PrefixCounts(hits=1, reused=3, computed=5)
    assert batcher.prefixes == PrefixCounts(hits=1, reused=3, computed=5)


def test_each_thread_replica_gets_its_share() -> None:
    made: list[Reusing] = []

    def build() -> Reusing:
        made.append(Reusing())
        return made[-1]

    with StepBatcher(build, workers=3, prefix_cache_bytes=1000):
        assert [m.budget for m in made] == [333, 333, 333]


@pytest.mark.slow
def test_each_process_replica_gets_its_share_and_their_counts_sum() -> None:
    prompts = [(1, 2, 3), (1, 2, 3, 4), (1, 2, 3), (7, 8), (7, 8, 9), (1,)] * 2
    with StepBatcher(Reusing, workers=2, runner="process", prefix_cache_bytes=200) as batcher:
        streams = [batcher.stream(p) for p in prompts]
        outputs = [output for s in streams for output in s.collect_sync()]
    assert {budget for budget, _, _ in outputs} == {100}
    # each sequence's own reuse, wherever it ran, adds up to the sums over the replicas
    hits = sum(1 for _, reused, _ in outputs if reused)
    reused = sum(r for _, r, _ in outputs)
    computed = sum(c for _, _, c in outputs)
    assert computed + reused == sum(map(len, prompts))
    assert batcher.stats().prefixes == PrefixCounts(hits, reused, computed)


def test_sums_over_replicas_never_go_down_when_one_restarts() -> None:
    stats = StepStats()
    assert stats.snapshot().prefixes is None
    stats.observe_step(StepReport(prefixes=PrefixCounts(2, 10, 30)), 0.0, 0, replica=0)
    stats.observe_step(StepReport(prefixes=PrefixCounts(1, 5, 7)), 0.0, 0, replica=1)
    stats.observe_step(StepReport(), 0.0, 0, replica=1)  # a report without: the last stands
    assert stats.snapshot().prefixes == PrefixCounts(3, 15, 37)
    stats.observe_step(StepReport(prefixes=PrefixCounts(3, 12, 31)), 0.0, 0, replica=0)
    assert stats.prefixes() == PrefixCounts(4, 17, 38)
    stats.observe_prefixes(1, PrefixCounts(0, 0, 4))  # replica 1 restarted: a new model
    assert stats.snapshot().prefixes == PrefixCounts(4, 17, 42)


def test_a_model_that_cannot_reuse_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="carpool"):
        with StepBatcher(Counter, workers=2, name="counter", prefix_cache_bytes=64) as batcher:
            assert batcher.stream(2).collect_sync() == [1, 2]
        assert batcher.stats().prefixes is None
    said = [r.getMessage() for r in caplog.records if NO_REUSE in r.getMessage()]
    assert said == [
        "model counter cannot reuse prompt state (StepModel.reuse_prefixes): it works without it"
    ]


@pytest.mark.parametrize("budget", [0, 1])  # 1 byte over 2 replicas: no share, so off
def test_no_budget_asks_nothing_and_logs_nothing(
    budget: int, caplog: pytest.LogCaptureFixture
) -> None:
    made: list[Reusing] = []

    def build() -> Reusing:
        made.append(Reusing())
        return made[-1]

    with caplog.at_level(logging.INFO, logger="carpool"):
        with StepBatcher(build, workers=2, prefix_cache_bytes=budget) as batcher:
            assert batcher.stream((1, 2)).collect_sync() == [(0, 0, 2)]
        with StepBatcher(Counter, workers=2, prefix_cache_bytes=budget):
            pass
    assert [m.budget for m in made] == [0, 0]
    assert batcher.stats().prefixes is None
    assert not [r for r in caplog.records if NO_REUSE in r.getMessage()]


@pytest.mark.parametrize("budget", [-1, True, 1.5, ""])
def test_a_budget_that_is_not_bytes_is_refused(budget: object) -> None:
    with pytest.raises(ConfigError, match="prefix_cache_bytes must be"):
        StepBatcher(Counter, prefix_cache_bytes=budget)  # type: ignore[arg-type]
