"""AdaptivePolicy is pure: a view (or a request at the door), a time, and a cost model in; a
decision out. A fake cost model that already knows its line makes every number exact."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from carpool.engine.options import make_policy
from carpool.policies.adaptive import AdaptivePolicy, completion
from carpool.policies.base import Dispatch, DispatchReason, WaitUntil
from carpool.policies.cost import CostCurve, CostModel
from conftest import FakeCost, admission, view

GAP_P90 = math.log(10.0)  # the next row's 90th-percentile gap, in mean gaps


def cost(fixed: float = 0.010, per_row: float = 0.001, margin: float = 1.0) -> FakeCost:
    """10 ms a batch plus 1 ms a row by default: waiting for rows pays near capacity."""
    return FakeCost({None: CostCurve(fixed, per_row, margin, samples=100)})


COLD = FakeCost({})


def policy(model: CostModel | None = None, slo_ms: float = 50.0) -> AdaptivePolicy:
    return AdaptivePolicy(slo_ms, cost=model if model is not None else cost())


def arrive(p: AdaptivePolicy, rows: int, now: float) -> None:
    """Rows arriving at the door (no deadline: always admitted)."""
    assert p.admit(admission(rows=rows, deadline=math.inf), now) is None


# arrival rate


def test_no_arrivals_no_rate() -> None:
    p = policy()
    assert p.arrival_rate(0.0) == 0.0
    assert p.arrival_rate(1e9) == 0.0


def test_arrival_rate_is_an_exponentially_decayed_count() -> None:
    p = policy()  # rate_window_s=1.0
    arrive(p, 1, now=10.0)
    assert p.arrival_rate(10.0) == 1.0
    assert p.arrival_rate(11.0) == pytest.approx(math.exp(-1), rel=1e-12)
    arrive(p, 3, now=10.5)
    assert p.arrival_rate(10.5) == pytest.approx(math.exp(-0.5) + 3, rel=1e-12)
    assert p.arrival_rate(12.5) == pytest.approx((math.exp(-0.5) + 3) * math.exp(-2), rel=1e-12)


def test_arrival_rate_window() -> None:
    p = AdaptivePolicy(50, cost=cost(), rate_window_s=0.5)
    arrive(p, 1, now=0.0)
    assert p.arrival_rate(0.0) == 2.0  # one row per half second
    assert p.arrival_rate(1.0) == pytest.approx(2 * math.exp(-2), rel=1e-12)


def test_requests_with_and_without_a_deadline_both_count_as_arrivals() -> None:
    p = policy()
    assert p.admit(admission(rows=2), now=10.0) is None
    assert p.admit(admission(rows=3, deadline=math.inf), now=10.0) is None
    assert p.arrival_rate(10.0) == 5.0


# decide


def busy(rate: float = 1000.0, model: CostModel | None = None, at: float = 10.0) -> AdaptivePolicy:
    """A policy that saw ``rate`` rows arrive in the last instant: rate rows/s at ``at``."""
    p = policy(model)
    arrive(p, int(rate), now=at)
    assert p.arrival_rate(at) == rate
    return p


def test_a_full_batch_goes_at_once() -> None:
    assert busy().decide(view(head_rows=8), now=10.0) == Dispatch(8, DispatchReason.FULL)
    assert busy().decide(view(head_rows=20), now=10.0) == Dispatch(8, DispatchReason.FULL)


def test_a_full_batch_goes_at_once_even_when_cold() -> None:
    p = policy(COLD)
    assert p.decide(view(head_rows=9), now=10.0) == Dispatch(8, DispatchReason.FULL)


def test_cold_it_never_waits() -> None:
    p = busy(model=COLD)
    assert p.decide(view(head_rows=3), now=10.0) == Dispatch(3, DispatchReason.WORKER_IDLE)


def test_without_arrivals_it_never_waits() -> None:
    p = policy()
    assert p.decide(view(head_rows=3), now=10.0) == Dispatch(3, DispatchReason.WORKER_IDLE)


def test_at_low_rate_a_lone_row_runs_at_once() -> None:
    p = busy(rate=1.0)  # the next row is due in 2.3 s; the batch takes 11 ms
    assert p.decide(view(), now=10.0) == Dispatch(1, DispatchReason.WORKER_IDLE)


def test_at_high_rate_a_small_head_waits_for_the_next_row() -> None:
    # 1000 rows/s: the next row is in by ln(10) ms (p90), well before the 5 ms window ends.
    # Now: the head is done in 11 ms; a row arriving meanwhile waits for it, then runs with
    # the 11 rows that came since (a full batch of 8: 18 ms): worst 11 + 18 - 2.3 = 26.7 ms.
    # Waiting: the next row by 2.3 ms, then 2 rows in 12 ms: worst 14.3 ms.
    p = busy()
    assert p.decide(view(), now=10.0) == WaitUntil(10.0 + GAP_P90 / 1000.0)


def test_the_wait_never_passes_the_window_of_the_head() -> None:
    p = busy(at=10.003)
    now = 10.003  # the head has waited 3 ms of 5: 2 ms left, the next row is due in 2.3 ms
    assert p.decide(view(), now=now) == WaitUntil(10.0 + 0.005)


def test_the_expected_wake_up_is_the_earlier_of_the_gap_and_the_window() -> None:
    p = busy()
    for now in (10.0, 10.001, 10.002, 10.0035, 10.0049):
        rate = p.arrival_rate(now)
        expected = min(now + GAP_P90 / rate, 10.0 + 0.005)
        assert p.decide(view(), now=now) == WaitUntil(expected)


def test_once_the_head_waited_max_wait_it_goes() -> None:
    window = 2.0**-7  # 7.8125 ms, exact in binary: the boundary is exact
    p = busy()
    at_edge = view(max_wait=window)
    just_before = p.decide(at_edge, now=10.0 + window - 1e-6)
    assert just_before == WaitUntil(10.0 + window)
    assert p.decide(at_edge, now=10.0 + window) == Dispatch(1, DispatchReason.WAIT_ELAPSED)
    assert p.decide(at_edge, now=11.0) == Dispatch(1, DispatchReason.WAIT_ELAPSED)


def test_zero_max_wait_never_waits() -> None:
    p = busy()
    assert p.decide(view(max_wait=0.0), now=10.0) == Dispatch(1, DispatchReason.WORKER_IDLE)


def test_when_the_head_deadline_forbids_the_wait_it_goes_with_reason_deadline() -> None:
    p = busy()
    done_if_waiting = 10.0 + (GAP_P90 / 1000.0 + 0.012)  # the next row, then 2 rows: 12 ms
    late = view(head_deadline=10.010)
    assert p.decide(late, now=10.0) == Dispatch(1, DispatchReason.DEADLINE)
    just = view(head_deadline=done_if_waiting)  # finishing exactly at the deadline is fine
    assert p.decide(just, now=10.0) == WaitUntil(10.0 + GAP_P90 / 1000.0)
    assert p.decide(view(head_deadline=math.nextafter(done_if_waiting, 0)), now=10.0) == (
        Dispatch(1, DispatchReason.DEADLINE)
    )


def test_waiting_does_not_pay_without_a_fixed_cost() -> None:
    # 1 ms a row and nothing per batch: a bigger batch saves nothing, so even at 1000 rows/s
    # waiting only adds the gap.
    p = busy(model=cost(fixed=0.0, per_row=0.001))
    assert p.decide(view(), now=10.0) == Dispatch(1, DispatchReason.WORKER_IDLE)


def test_waiting_stops_paying_once_the_head_waited_long_enough() -> None:
    # With a 100 ms window the policy could wait long, but the head's own latency soon
    # outweighs what one more row saves: waiting pays while waited + 2.3 + 12 < 11 + 18 - 2.3,
    # that is while the head has waited under ~12.3 ms.
    p = busy()
    long_window = view(max_wait=0.1)
    assert isinstance(p.decide(long_window, now=10.012), WaitUntil)
    assert p.decide(long_window, now=10.013) == Dispatch(1, DispatchReason.WORKER_IDLE)


def test_decide_uses_the_curve_of_the_head_key() -> None:
    model = FakeCost(
        {
            None: CostCurve(0.010, 0.001, 1.0, samples=100),
            "per-row only": CostCurve(0.0, 0.001, 1.0, samples=100),
        }
    )
    p = busy(model=model)
    assert p.decide(view(head_key="per-row only"), now=10.0) == Dispatch(
        1, DispatchReason.WORKER_IDLE
    )
    assert p.decide(view(head_key="other"), now=10.0) == WaitUntil(10.0 + GAP_P90 / 1000.0)


def test_a_real_cost_model_fed_exact_batches_decides_the_same() -> None:
    learned = CostModel()
    for rows in [1, 8] * 8:
        learned.observe(rows, 0.010 + 0.001 * rows)
    p = busy(model=learned)
    decision = p.decide(view(), now=10.0)
    assert isinstance(decision, WaitUntil)
    assert decision.time == pytest.approx(10.0 + GAP_P90 / 1000.0, rel=1e-12)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(
    arrivals=st.lists(
        st.tuples(st.floats(0.0, 0.02), st.integers(1, 200)), min_size=0, max_size=20
    ),
    fixed=st.floats(0.0, 0.05),
    per_row=st.floats(0.0, 0.005),
    margin=st.floats(1.0, 3.0),
    head_rows=st.integers(1, 16),
    max_batch_size=st.integers(1, 32),
    waited=st.floats(0.0, 0.02),
    max_wait=st.floats(0.0, 0.05),
    budget=st.one_of(st.just(math.inf), st.just(math.inf), st.floats(0.0, 0.1)),
    later=st.floats(0.0, 0.01),
)
def test_decisions_stay_in_range_under_random_arrivals(
    arrivals: list[tuple[float, int]],
    fixed: float,
    per_row: float,
    margin: float,
    head_rows: int,
    max_batch_size: int,
    waited: float,
    max_wait: float,
    budget: float,
    later: float,
) -> None:
    p = policy(cost(fixed, per_row, margin))
    now = 100.0
    for gap, rows in arrivals:
        now += gap
        arrive(p, rows, now)
    now += later
    v = view(
        queued_rows=head_rows,
        head_rows=head_rows,
        head_arrival=now - waited,
        max_batch_size=max_batch_size,
        max_wait=max_wait,
        head_deadline=now + budget,
    )
    decision = p.decide(v, now=now)
    if isinstance(decision, Dispatch):
        assert 1 <= decision.rows <= max_batch_size
        assert decision.rows == min(head_rows, max_batch_size)
        if head_rows >= max_batch_size:
            assert decision.reason is DispatchReason.FULL
    else:
        assert head_rows < max_batch_size
        assert now <= decision.time <= v.head_arrival + max_wait
        assert now - v.head_arrival < max_wait


# admission: the predicted completion
#
# The fake line: t(1) = 11 ms, t(3) = 13 ms, t(4) = 14 ms, t(8) = 18 ms. While anything is
# in flight or queued ahead, the batches holding the request's own rows are costed full
# (8 rows: 18 ms), as rows arriving meanwhile fill them.


def test_completion_of_a_lone_row_on_an_idle_worker() -> None:
    assert completion(admission(), 10.0, cost()) == pytest.approx(10.011, rel=1e-12)


def test_completion_after_the_rows_ahead_in_full_batches() -> None:
    # 10 rows ahead plus its own: 8 (18 ms), then 3 costed full (18 ms)
    done = completion(admission(rows_ahead=10), 10.0, cost())
    assert done == pytest.approx(10.036, rel=1e-12)


def test_completion_of_a_multi_row_request() -> None:
    # 12 rows of its own, nothing ahead: 8 (18 ms), then 4 (14 ms)
    assert completion(admission(rows=12), 10.0, cost()) == pytest.approx(10.032, rel=1e-12)


# admission: its own batch, at its size when idle, full when busy


def test_with_nothing_ahead_its_own_batch_is_costed_at_its_size() -> None:
    assert completion(admission(rows=3), 10.0, cost()) == pytest.approx(10.013, rel=1e-12)


def test_with_rows_ahead_its_own_batch_is_costed_full() -> None:
    # 1 row ahead and its 3 share one batch of 4 rows, costed as 8: 18 ms, not 14
    busy = admission(rows=3, rows_ahead=1)
    assert completion(busy, 10.0, cost()) == pytest.approx(10.018, rel=1e-12)


def test_with_a_batch_in_flight_its_own_batch_is_costed_full() -> None:
    # 1 row running from 10.0 (frees 10.011), then its 3 rows costed as 8: 18 ms, not 13
    running = admission(rows=3, in_flight=((10.0, 1),))
    assert completion(running, 10.0, cost()) == pytest.approx(10.029, rel=1e-12)
    staged = admission(rows=3, in_flight=((None, 1),))  # staged: it starts now, the same
    assert completion(staged, 10.0, cost()) == pytest.approx(10.029, rel=1e-12)


def test_when_busy_the_last_partial_batch_of_a_multi_row_request_is_costed_full() -> None:
    # 1 row running (frees 10.011), then its 12 rows: 8 (18 ms), 4 costed as 8 (18 ms)
    busy = admission(rows=12, in_flight=((10.0, 1),))
    assert completion(busy, 10.0, cost()) == pytest.approx(10.047, rel=1e-12)


# admission: what is in flight, running batches from their start, staged ones after them


def test_completion_waits_for_the_running_batch() -> None:
    # 4 rows started at 9.995 take 14 ms: the worker frees at 10.009
    running = admission(in_flight=((9.995, 4),))
    assert completion(running, 10.0, cost()) == pytest.approx(10.027, rel=1e-12)


def test_a_running_batch_frees_its_worker_by_its_start_time() -> None:
    earlier = admission(in_flight=((9.990, 4),))  # started 5 ms before: frees 10.004
    assert completion(earlier, 10.0, cost()) == pytest.approx(10.022, rel=1e-12)


def test_a_running_batch_past_its_prediction_frees_the_worker_now() -> None:
    overdue = admission(in_flight=((9.9, 4),))
    assert completion(overdue, 10.0, cost()) == pytest.approx(10.018, rel=1e-12)


def test_a_staged_batch_runs_in_full_from_when_a_worker_frees() -> None:
    # no start yet: its 14 ms run from now, then its own row
    staged = admission(in_flight=((None, 4),))
    assert completion(staged, 10.0, cost()) == pytest.approx(10.032, rel=1e-12)


def test_staged_batches_run_after_the_running_one() -> None:
    # one worker: 4 rows running (frees 10.009), 8 staged (18 ms), then its own row
    staged = admission(in_flight=((9.995, 4), (None, 8)))
    assert completion(staged, 10.0, cost()) == pytest.approx(10.045, rel=1e-12)


def test_running_batches_are_placed_before_staged_ones_whatever_the_order() -> None:
    listed_first = admission(in_flight=((None, 8), (9.995, 4)))
    assert completion(listed_first, 10.0, cost()) == pytest.approx(10.045, rel=1e-12)


def test_a_staged_batch_takes_an_idle_worker_at_once() -> None:
    # two workers: 4 rows running on one (frees 10.009), 8 staged on the other (10.018),
    # then its own row on the first to free (10.009 + 18 ms)
    two = admission(workers=2, in_flight=((9.995, 4), (None, 8)))
    assert completion(two, 10.0, cost()) == pytest.approx(10.027, rel=1e-12)


def test_batches_running_beyond_the_workers_queue_like_staged_ones() -> None:
    # A worker just freed: its next batch started before the finished one left. One worker:
    # the first frees at 10.004, the extra's 18 ms follow from there, then its own row.
    extra = admission(in_flight=((9.990, 4), (9.999, 8)))
    assert completion(extra, 10.0, cost()) == pytest.approx(10.040, rel=1e-12)


def test_completion_with_two_workers() -> None:
    # running: 4 rows from 9.995 (frees 10.009) and 8 rows from 9.998 (frees 10.016);
    # staged: 8 rows on the first free worker (10.009 + 18 ms = 10.027);
    # then 8 rows ahead on the other (10.016 + 18 ms = 10.034), then its own row, costed
    # full, on the first again (10.027 + 18 ms = 10.045).
    two = admission(workers=2, rows_ahead=8, in_flight=((9.995, 4), (9.998, 8), (None, 8)))
    assert completion(two, 10.0, cost()) == pytest.approx(10.045, rel=1e-12)


def test_two_idle_workers_share_the_rows_ahead() -> None:
    # 8 rows ahead on one worker (18 ms), its own row, costed full, on the other (18 ms)
    two = admission(workers=2, rows_ahead=8)
    assert completion(two, 10.0, cost()) == pytest.approx(10.018, rel=1e-12)
    one = admission(workers=1, rows_ahead=8)
    assert completion(one, 10.0, cost()) == pytest.approx(10.036, rel=1e-12)


def test_a_request_split_over_two_workers_is_done_when_its_slower_batch_is() -> None:
    # 9 rows of its own on two idle workers: 8 rows (18 ms) on one and 1 row (11 ms) on the
    # other, at once. Its last row is back at 10.018, not when the 1-row batch ends.
    split = admission(workers=2, rows=9)
    assert completion(split, 10.0, cost()) == pytest.approx(10.018, rel=1e-12)


def test_completion_includes_the_margin() -> None:
    assert completion(admission(), 10.0, cost(margin=2.0)) == pytest.approx(10.022, rel=1e-12)


def test_completion_uses_the_curve_of_the_request_key() -> None:
    model = FakeCost(
        {None: CostCurve(0.010, 0.001, 1.0, 100), "long": CostCurve(0.020, 0.004, 1.0, 100)}
    )
    assert completion(admission(key="long"), 10.0, model) == pytest.approx(10.024, rel=1e-12)


# admission: accept or refuse (a 50 ms objective less 2 ms of headroom: done by 10.048)


def test_admits_everything_while_cold() -> None:
    p = policy(COLD)
    hopeless = admission(rows_ahead=10_000, deadline=10.000001)
    assert p.admit(hopeless, now=10.0) is None
    assert p.overloaded == 0


def test_admits_everything_without_a_deadline() -> None:
    p = policy()
    assert p.admit(admission(rows_ahead=10_000, deadline=math.inf), now=10.0) is None
    assert p.overloaded == 0


def test_admits_what_finishes_by_its_deadline_less_the_headroom() -> None:
    p = policy()
    assert p.admit(admission(rows_ahead=10), now=10.0) is None  # 10.036
    near = admission(rows_ahead=8, in_flight=((9.998, 1),))  # 10.009 + 18 + 18 = 10.045
    assert p.admit(near, now=10.0) is None
    assert p.overloaded == 0
    # before the deadline, but inside the headroom: 10.013 + 18 + 18 = 10.049
    inside = admission(rows_ahead=8, in_flight=((9.998, 5),))
    assert p.admit(inside, now=10.0) == pytest.approx(10.049, rel=1e-12)
    assert p.overloaded == 1


def test_refuses_what_would_finish_late_and_returns_the_predictedcompletion() -> None:
    p = policy()
    # 20 rows ahead + 1: 8 (18), 8 (18), 5 costed full (18) = 54 ms, past 48 ms
    late = p.admit(admission(rows_ahead=20), now=10.0)
    assert late == pytest.approx(10.054, rel=1e-12)
    assert p.overloaded == 1
    # the running batch pushes a request that fits on an idle worker past its deadline
    idle = admission(rows_ahead=8)  # 18 + 18 = 36 ms: in time
    assert p.admit(idle, now=10.0) is None
    crowded = admission(rows_ahead=8, in_flight=((10.0, 8),))  # 18 + 18 + 18 = 54 ms: late
    assert p.admit(crowded, now=10.0) == pytest.approx(10.054, rel=1e-12)
    assert p.overloaded == 2


def test_in_flight_and_rows_ahead_add_up_against_the_deadline() -> None:
    p = policy()
    ahead_only = admission(rows_ahead=15)  # 8 (18) + 8 (18) = 36 ms
    assert p.admit(ahead_only, now=10.0) is None
    plus_running = admission(rows_ahead=15, in_flight=((9.996, 4),))  # frees at 10 ms: 46 ms
    assert p.admit(plus_running, now=10.0) is None
    plus_staged = admission(rows_ahead=15, in_flight=((9.996, 4), (None, 1)))  # 10 + 11 + 36
    assert p.admit(plus_staged, now=10.0) == pytest.approx(10.057, rel=1e-12)
    assert p.overloaded == 1


def test_a_batch_started_earlier_admits_what_the_same_batch_staged_refuses() -> None:
    # 8 rows ahead and its own: 36 ms after the worker frees. 4 rows that started 10 ms ago
    # free it at 10.004 (40 ms: in time); staged, they run from now (50 ms: late).
    p = policy()
    assert p.admit(admission(rows_ahead=8, in_flight=((9.990, 4),)), now=10.0) is None
    staged = p.admit(admission(rows_ahead=8, in_flight=((None, 4),)), now=10.0)
    assert staged == pytest.approx(10.050, rel=1e-12)
    assert p.overloaded == 1


def test_a_multi_row_request_needs_room_for_all_its_rows() -> None:
    p = policy()
    assert p.admit(admission(rows=16), now=10.0) is None  # 18 + 18 = 36 ms
    assert p.admit(admission(rows=24), now=10.0) == pytest.approx(10.054, rel=1e-12)  # 3 x 18


def test_priority_only_counts_the_rows_served_before_it() -> None:
    # The same queue, seen by a request of its own level (20 rows ahead) and by a more
    # urgent one (nothing ahead): the batcher passes rows_ahead by priority.
    p = policy()
    assert p.admit(admission(rows_ahead=20), now=10.0) is not None
    assert p.admit(admission(rows_ahead=0), now=10.0) is None
    assert p.overloaded == 1


def test_a_tighter_deadline_refuses_what_the_objective_admits() -> None:
    p = policy()
    assert p.admit(admission(rows_ahead=10, deadline=10.05), now=10.0) is None  # 36 ms
    assert p.admit(admission(rows_ahead=10, deadline=10.02), now=10.0) == pytest.approx(
        10.036, rel=1e-12
    )


def test_refused_requests_are_counted() -> None:
    p = policy()
    for _ in range(3):
        assert p.admit(admission(rows_ahead=100), now=10.0) is not None
    assert p.admit(admission(), now=10.0) is None
    assert p.overloaded == 3


def test_a_cost_model_that_saw_one_batch_size_admits_a_full_batch() -> None:
    # One batch of 1 row in 11 ms is all fixed cost: 8 rows are predicted 11 ms too, in time
    # (split half and half, 8 rows would have been predicted 49.5 ms: refused).
    learned = CostModel()
    learned.observe(1, 0.011)
    p = AdaptivePolicy(50, cost=learned)
    assert completion(admission(rows=8), 10.0, learned) == pytest.approx(10.011, rel=1e-12)
    assert p.admit(admission(rows=8), now=10.0) is None
    assert p.overloaded == 0


# admission: the headroom

# 2**-7 s a batch plus 2**-10 s a row: every sum below is exact in binary.
DYADIC = FakeCost({None: CostCurve(2.0**-7, 2.0**-10, 1.0, samples=100)})


@pytest.mark.parametrize("headroom_ms", [0.0, 1.953125])  # none, and 2**-9 s exactly
def test_admits_exactly_up_to_the_deadline_less_the_headroom(headroom_ms: float) -> None:
    p = AdaptivePolicy(50, cost=DYADIC, headroom_ms=headroom_ms)
    assert p.headroom == headroom_ms / 1000.0
    done = 10.0 + 2.0**-7 + 2.0**-10  # one row on an idle worker
    assert completion(admission(), 10.0, DYADIC) == done
    deadline = done + p.headroom
    assert deadline - p.headroom == done  # the boundary is exact, not rounded
    assert p.admit(admission(deadline=deadline), now=10.0) is None
    assert p.overloaded == 0
    just_late = admission(deadline=math.nextafter(deadline, 0.0))
    assert p.admit(just_late, now=10.0) == done
    assert p.overloaded == 1


@pytest.mark.parametrize(
    ("slo_ms", "headroom_ms", "headroom"),
    [
        (50, 2.0, 0.002),
        (50, 4.5, 0.0045),
        (50, 0.0, 0.0),
        (10, 2.0, 0.001),  # a tenth of the objective
        (12.5, 2.0, 0.00125),
        (5, 3.0, 0.0005),
    ],
)
def test_the_headroom_is_at_most_a_tenth_of_the_objective(
    slo_ms: float, headroom_ms: float, headroom: float
) -> None:
    assert AdaptivePolicy(slo_ms, headroom_ms=headroom_ms).headroom == headroom


def test_the_headroom_defaults_to_two_milliseconds() -> None:
    assert AdaptivePolicy(50).headroom == 0.002
    by_name = make_policy("adaptive", latency_slo_ms=50)
    assert isinstance(by_name, AdaptivePolicy)
    assert by_name.headroom == 0.002


def test_the_clamp_follows_the_objective_not_the_request_deadline() -> None:
    # A lone row takes 11 ms. Under a 20 ms objective, 10 ms of headroom is clamped to 2:
    # done by 18 ms, in time (with 10 ms it would be late).
    tight = AdaptivePolicy(20, cost=cost(), headroom_ms=10.0)
    assert tight.admit(admission(deadline=10.02), now=10.0) is None
    # Under a 200 ms objective the 10 ms stand, even for a request whose own timeout leaves
    # it 20 ms: done by 10 ms, late.
    loose = AdaptivePolicy(200, cost=cost(), headroom_ms=10.0)
    assert loose.admit(admission(deadline=10.02), now=10.0) == pytest.approx(10.011, rel=1e-12)
    assert (tight.overloaded, loose.overloaded) == (0, 1)


# construction


def test_make_policy_adaptive_needs_a_latency_objective() -> None:
    with pytest.raises(ValueError, match="needs a latency objective") as info:
        make_policy("adaptive")
    assert str(info.value) == (
        "policy 'adaptive' needs a latency objective: set latency_slo_ms (e.g. 50 for 50 ms)"
    )


def test_make_policy_adaptive() -> None:
    p = make_policy("adaptive", latency_slo_ms=50)
    assert isinstance(p, AdaptivePolicy)
    assert p.latency_slo == 0.05
    assert isinstance(p.cost, CostModel)
    assert p.cost.observed == 0
    assert (repr(p), str(p)) == ("AdaptivePolicy(latency_slo_ms=50)", "adaptive")
    assert p.overloaded == 0
    other = make_policy("adaptive", latency_slo_ms=50)
    assert isinstance(other, AdaptivePolicy)
    assert other.cost is not p.cost  # each batcher learns its own model


def test_a_given_cost_model_is_the_one_used() -> None:
    model = CostModel()
    p = AdaptivePolicy(12.5, cost=model)
    assert p.cost is model
    assert repr(p) == "AdaptivePolicy(latency_slo_ms=12.5)"


def test_observe_feeds_the_cost_model() -> None:
    model = CostModel()
    p = AdaptivePolicy(50, cost=model)
    p.observe(4, 0.014, "k")
    p.observe(1, 0.011)
    assert model.observed == 2
    k = model.curve("k")
    assert k is not None
    assert k.samples == 1


@pytest.mark.parametrize("slo", [0, 0.0, -5, math.nan, -math.inf, math.inf])
def test_latency_slo_must_be_positive(slo: float) -> None:
    with pytest.raises(ValueError, match="latency_slo_ms") as info:
        AdaptivePolicy(slo)
    assert str(info.value) == f"latency_slo_ms must be finite and > 0, got {slo!r}"


@pytest.mark.parametrize("slo", ["50", True, None])
def test_latency_slo_must_be_a_number(slo: object) -> None:
    with pytest.raises(TypeError, match="latency_slo_ms must be a number of milliseconds"):
        AdaptivePolicy(slo)  # type: ignore[arg-type]


@pytest.mark.parametrize("window", [0.0, -1.0, math.nan])
def test_rate_window_must_be_positive(window: float) -> None:
    with pytest.raises(ValueError, match="rate_window_s") as info:
        AdaptivePolicy(50, rate_window_s=window)
    assert str(info.value) == f"rate_window_s must be > 0, got {window!r}"


@pytest.mark.parametrize("headroom_ms", [-1.0, -1e-9, math.nan, math.inf, -math.inf])
def test_headroom_must_be_finite_and_not_negative(headroom_ms: float) -> None:
    with pytest.raises(ValueError, match="headroom_ms") as info:
        AdaptivePolicy(50, headroom_ms=headroom_ms)
    assert str(info.value) == f"headroom_ms must be finite and >= 0, got {headroom_ms!r}"
