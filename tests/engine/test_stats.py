"""Counters, nearest-rank percentiles and the frozen snapshot; durations are passed in."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from carpool.engine.stats import (
    LATENCY_BOUNDS,
    SAMPLE_WINDOW,
    BatcherStats,
    BatchTimes,
    Histogram,
    HistogramSnapshot,
    Percentiles,
    StatsRecorder,
)
from carpool.policies.base import DispatchReason

# Percentiles


def test_percentiles_of_1_to_100_ms() -> None:
    samples = [i / 1000 for i in range(1, 101)]
    random.Random(7).shuffle(samples)  # order of arrival does not matter
    assert Percentiles.of(samples) == Percentiles(p50=50.0, p90=90.0, p99=99.0, count=100)


def test_percentiles_of_nothing_are_zero() -> None:
    assert Percentiles.of([]) == Percentiles(p50=0.0, p90=0.0, p99=0.0, count=0)
    assert Percentiles() == Percentiles.of(iter(()))


def test_percentiles_of_one_sample() -> None:
    assert Percentiles.of([0.25]) == Percentiles(p50=250.0, p90=250.0, p99=250.0, count=1)


def test_percentiles_nearest_rank_of_ten() -> None:
    # ranks: p50 -> 5th, p90 -> 9th, p99 -> ceil(9.9) = 10th
    samples = [0.010, 0.020, 0.030, 0.040, 0.050, 0.060, 0.070, 0.080, 0.090, 1.0]
    result = Percentiles.of(samples)
    assert result == Percentiles(p50=0.050 * 1000, p90=0.090 * 1000, p99=1000.0, count=10)


def test_percentiles_of_two() -> None:
    assert Percentiles.of([0.002, 0.001]) == Percentiles(p50=1.0, p90=2.0, p99=2.0, count=2)


def test_percentiles_accept_any_iterable() -> None:
    assert Percentiles.of(x / 1000 for x in (3, 1, 2)).p50 == 2.0


@given(st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=300))
def test_percentiles_are_samples_in_order(samples: list[float]) -> None:
    result = Percentiles.of(samples)
    ms = sorted(s * 1000.0 for s in samples)
    assert result.count == len(samples)
    assert ms[0] <= result.p50 <= result.p90 <= result.p99 <= ms[-1]
    for p, q in ((result.p50, 0.5), (result.p90, 0.9), (result.p99, 0.99)):
        assert p in ms
        # nearest rank: at least q of the samples are <= p, fewer than q are < p
        assert sum(x <= p for x in ms) >= q * len(ms) - 1e-9
        assert sum(x < p for x in ms) < q * len(ms)


def test_percentiles_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Percentiles().p50 = 1.0  # type: ignore[misc]


# StatsRecorder


def test_fresh_recorder_snapshot() -> None:
    stats = StatsRecorder().snapshot(submitted=0, queued_rows=0)
    empty = HistogramSnapshot(LATENCY_BOUNDS, (0,) * len(LATENCY_BOUNDS), 0, 0.0)
    assert stats == BatcherStats(
        submitted=0,
        completed=0,
        failed=0,
        expired=0,
        cancelled=0,
        rejected=0,
        pending=0,
        queued_rows=0,
        running_rows=0,
        batches=0,
        rows=0,
        batch_sizes={},
        dispatch_reasons={},
        queue_wait_ms=Percentiles(),
        model_ms=Percentiles(),
        queue_wait_seconds=empty,
        model_seconds=empty,
    )
    assert stats.mean_batch_size == 0.0


def test_counts_and_pending_arithmetic() -> None:
    recorder = StatsRecorder()
    recorder.completed = 9
    recorder.failed = 3
    recorder.expired = 2
    recorder.cancelled = 1
    recorder.rejected = 4
    stats = recorder.snapshot(submitted=20, queued_rows=7)
    assert (stats.submitted, stats.completed, stats.failed, stats.expired) == (20, 9, 3, 2)
    assert (stats.cancelled, stats.rejected, stats.queued_rows) == (1, 4, 7)
    assert stats.pending == 5  # 20 - (9 + 3 + 2 + 1); rejected were never submitted
    assert stats.submitted == (
        stats.completed + stats.failed + stats.expired + stats.cancelled + stats.pending
    )


def test_batches_rows_sizes_and_mean() -> None:
    recorder = StatsRecorder()
    recorder.batch(8, DispatchReason.FULL)
    recorder.batch(2, DispatchReason.WAIT_ELAPSED)
    recorder.batch(8, DispatchReason.FULL)
    recorder.batch(4, DispatchReason.DRAIN)
    stats = recorder.snapshot(submitted=0, queued_rows=0)
    assert (stats.batches, stats.rows) == (4, 22)
    assert stats.mean_batch_size == 5.5
    assert dict(stats.batch_sizes) == {2: 1, 4: 1, 8: 2}
    assert list(stats.batch_sizes) == [2, 4, 8]  # sorted by size


def test_unbatch_takes_back_a_batch_that_never_started() -> None:
    recorder = StatsRecorder()
    recorder.batch(8, DispatchReason.FULL)
    recorder.batch(2, DispatchReason.WORKER_IDLE)
    before = recorder.snapshot(submitted=0, queued_rows=0)
    recorder.batch(8, DispatchReason.FULL)
    recorder.batch(3, DispatchReason.DEADLINE)
    recorder.unbatch(3, DispatchReason.DEADLINE)
    recorder.unbatch(8, DispatchReason.FULL)
    assert recorder.snapshot(submitted=0, queued_rows=0) == before
    assert dict(before.dispatch_reasons) == {"full": 1, "worker_idle": 1}  # no zero counts
    assert recorder.running_rows == 10


def test_dispatch_reasons_are_keyed_by_plain_strings() -> None:
    recorder = StatsRecorder()
    recorder.batch(1, DispatchReason.WORKER_IDLE)
    recorder.batch(1, DispatchReason.WORKER_IDLE)
    recorder.batch(3, "full")
    recorder.batch(3, DispatchReason.FULL)
    reasons = recorder.snapshot(submitted=0, queued_rows=0).dispatch_reasons
    assert dict(reasons) == {"worker_idle": 2, "full": 2}
    assert all(type(k) is str for k in reasons)


def test_latency_percentiles_in_the_snapshot() -> None:
    recorder = StatsRecorder()
    recorder.queue_waits.extend(i / 1000 for i in range(1, 101))
    recorder.model_times.append(0.004)
    stats = recorder.snapshot(submitted=0, queued_rows=0)
    assert stats.queue_wait_ms == Percentiles(p50=50.0, p90=90.0, p99=99.0, count=100)
    assert stats.model_ms == Percentiles(p50=4.0, p90=4.0, p99=4.0, count=1)


def test_latency_samples_keep_only_the_recent_window() -> None:
    recorder = StatsRecorder()
    recorder.model_times.extend([100.0] * 10)  # old outliers fall out of the window
    recorder.model_times.extend([0.001] * SAMPLE_WINDOW)
    stats = recorder.snapshot(submitted=0, queued_rows=0)
    assert stats.model_ms == Percentiles(p50=1.0, p90=1.0, p99=1.0, count=SAMPLE_WINDOW)


def test_snapshot_is_immutable() -> None:
    recorder = StatsRecorder()
    recorder.batch(2, DispatchReason.FULL)
    stats = recorder.snapshot(submitted=0, queued_rows=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.completed = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        stats.batch_sizes[2] = 10  # type: ignore[index]
    with pytest.raises(TypeError):
        stats.dispatch_reasons["full"] = 10  # type: ignore[index]


def test_snapshot_does_not_change_when_the_recorder_does() -> None:
    recorder = StatsRecorder()
    recorder.batch(2, DispatchReason.FULL)
    recorder.model_times.append(0.002)
    before = recorder.snapshot(submitted=0, queued_rows=3)
    recorder.batch(2, DispatchReason.FULL)
    recorder.batch(5, DispatchReason.DRAIN)
    recorder.model_times.append(0.009)
    assert (before.batches, before.rows, before.submitted) == (1, 2, 0)
    assert dict(before.batch_sizes) == {2: 1}
    assert dict(before.dispatch_reasons) == {"full": 1}
    assert before.model_ms.count == 1
    after = recorder.snapshot(submitted=0, queued_rows=0)
    assert dict(after.batch_sizes) == {2: 2, 5: 1}
    assert dict(after.dispatch_reasons) == {"full": 2, "drain": 1}


# Histogram


def test_histogram_counts_are_cumulative_and_bounds_inclusive() -> None:
    hist = Histogram((0.001, 0.01, 0.1))
    hist.add_many([0.0005, 0.001, 0.002, 0.05, 0.1, 3.0])
    hist.add_many([0.01])
    snap = hist.snapshot()
    assert snap.bounds == (0.001, 0.01, 0.1)
    assert snap.counts == (2, 4, 6)  # <= 1 ms: 0.5 ms and 1 ms; <= 10 ms adds 2 and 10 ms
    assert snap.count == 7  # 3 s is only in +Inf
    assert snap.sum == pytest.approx(3.1635)


def test_recorder_feeds_percentiles_and_histograms() -> None:
    recorder = StatsRecorder()
    recorder.waited([0.002, 0.004])
    recorder.model_call(2, 0.003, stack=0.001, split=0.002)
    stats = recorder.snapshot(submitted=2, queued_rows=0)
    assert (stats.queue_wait_ms.count, stats.queue_wait_seconds.count) == (2, 2)
    assert (stats.model_ms.p50, stats.model_seconds.count) == (3.0, 1)
    assert stats.queue_wait_seconds.counts[LATENCY_BOUNDS.index(0.005)] == 2
    assert stats.batch_times == {2: BatchTimes(stack=0.001, model=0.003, split=0.002)}


def test_model_calls_are_summed_per_batch_size_as_the_histogram_sums_them() -> None:
    """Triton's per-size compute phases: every call's seconds under its batch's size (a
    bisected batch's calls too, whatever their own rows), adding up to the model's total."""
    recorder = StatsRecorder()
    for size, model in ((4, 0.25), (4, 0.5), (1, 0.125), (4, 0.0625)):
        recorder.model_call(size, model, stack=0.001, split=0.002)
    before = recorder.snapshot(submitted=0, queued_rows=0)
    recorder.model_call(1, 1.0, stack=0.0, split=0.0)
    assert dict(before.batch_times) == {
        1: BatchTimes(stack=0.001, model=0.125, split=0.002),
        4: BatchTimes(stack=0.003, model=0.8125, split=0.006),
    }
    assert sum(before.batch_times.values(), BatchTimes()).model == before.model_seconds.sum
    with pytest.raises(TypeError):
        before.batch_times[2] = BatchTimes()  # type: ignore[index]
    after = recorder.snapshot(submitted=0, queued_rows=0)
    assert after.batch_times[1] == BatchTimes(stack=0.001, model=1.125, split=0.002)
