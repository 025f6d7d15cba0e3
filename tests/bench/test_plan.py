"""A run's steps planned (``carpool.bench.plan``): plans drawn from the options before
anything is sent, and each plan dealt over client processes."""

from __future__ import annotations

import numpy as np
import pytest

from bench.conftest import closed_plan, open_plan
from carpool.bench.arrivals import count_offsets, poisson_offsets
from carpool.bench.options import DURATION_S, Options
from carpool.bench.plan import Timing, plans, split
from carpool.bench.report.data import Load
from carpool.bench.targets.base import BenchError

# ----------------------------------------------------------------------------- plans


def test_closed_loop_plans_run_each_level_for_the_duration_or_the_requests() -> None:
    by_time = plans(Options(target="demo", mode="concurrency", values=(1, 8), warmup_s=0.5))
    assert [(p.load, p.duration_s, p.requests) for p in by_time] == [
        (Load("concurrency", 1), DURATION_S, None),
        (Load("concurrency", 8), DURATION_S, None),
    ]
    assert [(p.warmup_s, p.connections, p.offsets) for p in by_time] == [
        (0.5, 1, None),
        (0.5, 8, None),
    ]
    (counted,) = plans(Options(target="demo", mode="concurrency", values=(4,), requests=30))
    assert (counted.duration_s, counted.requests, counted.closed) == (None, 30, True)


def test_rate_plans_draw_their_send_times_from_the_seed() -> None:
    options = Options(target="demo", mode="rate", values=(50.0,), duration_s=2.0, seed=3)
    (plan,) = plans(options)
    assert (plan.load, plan.duration_s, plan.requests, plan.closed) == (
        Load("rate", 50.0),
        2.0,
        None,
        False,
    )
    np.testing.assert_array_equal(plan.offsets, poisson_offsets(50.0, 2.0, seed=3))
    warm = poisson_offsets(50.0, options.warmup_s, seed=4)  # warm-up arrivals seeded apart
    np.testing.assert_array_equal(plan.warmup_offsets, warm)
    assert plan.connections == options.connections


def test_rate_plans_by_count_and_without_warm_up() -> None:
    options = Options(target="demo", mode="rate", values=(20.0,), requests=7, warmup_s=0.0)
    (plan,) = plans(options)
    assert (plan.duration_s, plan.requests) == (None, 7)
    np.testing.assert_array_equal(plan.offsets, count_offsets(20.0, 7, seed=0))
    assert plan.warmup_offsets is not None
    assert plan.warmup_offsets.size == 0


def test_a_trace_is_replayed_from_its_first_send_time_and_cut() -> None:
    trace = np.asarray([10.0, 10.5, 11.0, 12.5])
    options = Options(target="demo", mode="trace", trace="t.csv", warmup_s=0.0)
    (plan,) = plans(options, trace=trace)
    assert plan.offsets is not None
    assert plan.offsets.tolist() == [0.0, 0.5, 1.0, 2.5]
    assert plan.load == Load("trace", 4 / 2.5)  # its mean rate
    assert (plan.duration_s, plan.requests) == (None, None)
    (cut,) = plans(Options(target="demo", mode="trace", trace="t.csv", duration_s=1.0), trace=trace)
    assert cut.offsets is not None
    assert cut.offsets.tolist() == [0.0, 0.5]
    (first,) = plans(Options(target="demo", mode="trace", trace="t.csv", requests=1), trace=trace)
    assert first.offsets is not None
    assert first.offsets.tolist() == [0.0]
    assert first.load == Load("trace", 1.0)  # one send: its rate is its count


def test_a_trace_with_nothing_to_replay_is_refused() -> None:
    options = Options(target="demo", mode="trace", trace="t.csv", duration_s=1.0)
    with pytest.raises(BenchError, match=r"--trace 't\.csv' has no send times to replay"):
        plans(options, trace=np.asarray([], dtype=np.float64))
    with pytest.raises(TypeError, match="needs the trace's send times"):
        plans(options)


def test_timing_closes_only_a_closed_loop_run_by_duration() -> None:
    timing = Timing.of(closed_plan(2, duration_s=3.0, warmup_s=1.0), lead_s=0.5)
    assert timing.window - timing.start == pytest.approx(1.0)
    assert timing.end is not None
    assert timing.end - timing.window == pytest.approx(3.0)
    assert Timing.of(closed_plan(2, requests=5)).end is None
    assert Timing.of(open_plan([0.0, 0.1])).end is None


# ----------------------------------------------------------------------------- split


def test_closed_loop_callers_and_requests_are_divided_over_processes() -> None:
    shares = split(closed_plan(5, requests=41), 2)
    assert [s.concurrency for s in shares] == [3, 2]
    assert [s.requests for s in shares] == [21, 20]
    assert [(s.first, s.stride) for s in shares] == [(0, 2), (1, 2)]
    idle = split(closed_plan(2, requests=9), 4)  # more processes than callers: two stay idle
    assert [s.concurrency for s in idle] == [1, 1, 0, 0]
    assert [s.requests for s in idle] == [5, 4, 0, 0]


def test_open_loop_send_times_are_dealt_round_robin() -> None:
    plan = open_plan([0.0, 0.1, 0.2, 0.3, 0.4], warmup=[0.01, 0.02, 0.03])
    shares = split(plan, 2)
    assert [s.offsets.tolist() for s in shares] == [[0.0, 0.2, 0.4], [0.1, 0.3]]  # type: ignore[union-attr]
    assert [s.warmup_offsets.tolist() for s in shares] == [[0.01, 0.03], [0.02]]  # type: ignore[union-attr]
    assert all(s.connections == 4 for s in shares)  # the pool is shared out too
