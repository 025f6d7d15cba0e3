"""Policies are pure: a view and a time in, a decision out. No clock, no loop."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from carpool.policies.adaptive import AdaptivePolicy
from carpool.policies.base import (
    Dispatch,
    DispatchReason,
    EagerPolicy,
    FixedPolicy,
    PolicyHooks,
    QueueView,
    WaitUntil,
    schedule,
)
from conftest import view

# FixedPolicy


def test_fixed_waits_for_the_window_of_the_head() -> None:
    assert FixedPolicy().decide(view(), now=10.0) == WaitUntil(10.005)


def test_fixed_wait_is_anchored_to_the_head_arrival_not_now() -> None:
    assert FixedPolicy().decide(view(head_arrival=9.0, max_wait=2.0), now=10.5) == WaitUntil(11.0)


def test_fixed_dispatches_a_full_batch_at_once() -> None:
    decision = FixedPolicy().decide(view(queued_rows=8, head_rows=8), now=10.0)
    assert decision == Dispatch(8, DispatchReason.FULL)


def test_fixed_full_batch_is_capped_at_max_batch_size() -> None:
    decision = FixedPolicy().decide(view(queued_rows=20, head_rows=20), now=10.0)
    assert decision == Dispatch(8, DispatchReason.FULL)


def test_fixed_counts_only_rows_that_can_join_the_head() -> None:
    # 20 rows wait, but only 3 share the head's shape: not a full batch.
    decision = FixedPolicy().decide(view(queued_rows=20, head_rows=3), now=10.0)
    assert decision == WaitUntil(10.005)


def test_fixed_dispatches_exactly_when_the_wait_elapses() -> None:
    decision = FixedPolicy().decide(view(head_rows=3, max_wait=0.5), now=10.5)
    assert decision == Dispatch(3, DispatchReason.WAIT_ELAPSED)


def test_fixed_waits_just_before_the_boundary() -> None:
    decision = FixedPolicy().decide(view(head_rows=3, max_wait=0.5), now=10.499999)
    assert decision == WaitUntil(10.5)


def test_fixed_dispatches_after_the_wait_elapsed() -> None:
    decision = FixedPolicy().decide(view(head_rows=5), now=99.0)
    assert decision == Dispatch(5, DispatchReason.WAIT_ELAPSED)


def test_fixed_zero_wait_dispatches_immediately() -> None:
    decision = FixedPolicy().decide(view(head_rows=2, max_wait=0.0), now=10.0)
    assert decision == Dispatch(2, DispatchReason.WAIT_ELAPSED)


def test_fixed_full_wins_over_wait_elapsed() -> None:
    decision = FixedPolicy().decide(view(head_rows=9), now=50.0)
    assert decision == Dispatch(8, DispatchReason.FULL)


@given(
    head_rows=st.integers(1, 64),
    max_batch_size=st.integers(1, 64),
    head_arrival=st.floats(0, 1e6),
    max_wait=st.floats(0, 10),
    elapsed=st.floats(0, 20),
)
def test_fixed_decision_is_in_range(
    head_rows: int, max_batch_size: int, head_arrival: float, max_wait: float, elapsed: float
) -> None:
    v = view(
        queued_rows=head_rows,
        head_rows=head_rows,
        head_arrival=head_arrival,
        max_batch_size=max_batch_size,
        max_wait=max_wait,
    )
    now = head_arrival + elapsed
    decision = FixedPolicy().decide(v, now=now)
    if head_rows >= max_batch_size:
        assert decision == Dispatch(max_batch_size, DispatchReason.FULL)
    elif now >= head_arrival + max_wait:
        assert decision == Dispatch(head_rows, DispatchReason.WAIT_ELAPSED)
    else:
        assert decision == WaitUntil(head_arrival + max_wait)
        assert decision.time > now


# EagerPolicy


def test_eager_takes_what_is_queued_without_waiting() -> None:
    decision = EagerPolicy().decide(view(head_rows=3), now=10.0)
    assert decision == Dispatch(3, DispatchReason.WORKER_IDLE)


def test_eager_full_batch() -> None:
    decision = EagerPolicy().decide(view(queued_rows=30, head_rows=30), now=10.0)
    assert decision == Dispatch(8, DispatchReason.FULL)


def test_eager_exactly_full_is_full() -> None:
    decision = EagerPolicy().decide(view(queued_rows=8, head_rows=8), now=10.0)
    assert decision == Dispatch(8, DispatchReason.FULL)


@given(
    head_rows=st.integers(1, 64),
    max_batch_size=st.integers(1, 64),
    max_wait=st.floats(0, 1e3),
    now=st.floats(-1e6, 1e6),
)
def test_eager_never_waits(
    head_rows: int, max_batch_size: int, max_wait: float, now: float
) -> None:
    v = view(head_rows=head_rows, max_batch_size=max_batch_size, max_wait=max_wait)
    decision = EagerPolicy().decide(v, now=now)
    assert isinstance(decision, Dispatch)
    assert decision.rows == min(head_rows, max_batch_size)


# values


def test_decisions_and_views_are_frozen_values() -> None:
    assert Dispatch(3, DispatchReason.FULL) == Dispatch(3, DispatchReason.FULL)
    assert hash(WaitUntil(1.5)) == hash(WaitUntil(1.5))
    with pytest.raises(dataclasses.FrozenInstanceError):
        WaitUntil(1.0).time = 2.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        view().head_rows = 2  # type: ignore[misc]


def test_dispatch_reasons_are_plain_string_values() -> None:
    assert [r.value for r in DispatchReason] == [
        "full",
        "wait_elapsed",
        "worker_idle",
        "deadline",
        "drain",
    ]
    assert isinstance(DispatchReason.WAIT_ELAPSED, str)
    assert str(DispatchReason.DRAIN) == "drain"


# schedule: the rules every policy goes through


class Waits:
    """A policy that never dispatches: what the rules do around a waiting policy."""

    def __init__(self) -> None:
        self.asked: list[QueueView] = []

    def decide(self, view: QueueView, now: float) -> WaitUntil:
        self.asked.append(view)
        return WaitUntil(12.0)


def busy(**changes: Any) -> QueueView:
    """The one worker busy with one batch; eight rows of the head's shape queued."""
    fields = {"idle_workers": 0, "busy_workers": 1, "head_rows": 8, "queued_rows": 8}
    return view(**(fields | changes))


def test_while_every_worker_is_busy_a_full_head_batch_is_staged_without_asking() -> None:
    policy = Waits()
    assert schedule(policy, busy(), now=10.0) == Dispatch(8, DispatchReason.FULL)
    assert policy.asked == []


def test_while_busy_a_partial_head_batch_waits_for_a_worker() -> None:
    assert schedule(EagerPolicy(), busy(head_rows=7), now=10.0) == WaitUntil(math.inf)


def test_while_busy_another_shape_s_full_batch_does_not_overtake_the_head() -> None:
    decision = schedule(EagerPolicy(), busy(head_rows=1, full_queued=True), now=10.0)
    assert decision == WaitUntil(math.inf)


def test_at_most_one_batch_per_worker_is_staged() -> None:
    assert schedule(EagerPolicy(), busy(busy_workers=2), now=10.0) == WaitUntil(math.inf)
    two = busy(workers=2, busy_workers=3)
    assert schedule(EagerPolicy(), two, now=10.0) == Dispatch(8, DispatchReason.FULL)
    assert schedule(EagerPolicy(), busy(workers=2, busy_workers=4), now=10.0) == WaitUntil(math.inf)


def test_with_a_worker_idle_the_policy_decides() -> None:
    policy = Waits()
    assert schedule(policy, view(), now=10.0) == WaitUntil(12.0)
    assert policy.asked == [view()]
    assert schedule(EagerPolicy(), view(head_rows=3), now=10.0) == Dispatch(
        3, DispatchReason.WORKER_IDLE
    )


def test_while_closing_a_wait_becomes_a_drain() -> None:
    decision = schedule(Waits(), view(head_rows=3, closing=True), now=10.0)
    assert decision == Dispatch(3, DispatchReason.DRAIN)
    # a dispatch of the policy's own stands
    assert schedule(EagerPolicy(), view(closing=True), now=10.0) == Dispatch(
        1, DispatchReason.WORKER_IDLE
    )


def test_a_full_batch_never_waits_behind_the_head_s_partial_one() -> None:
    decision = schedule(Waits(), view(full_queued=True), now=10.0)
    assert decision == Dispatch(8, DispatchReason.FULL, source="full")
    assert schedule(Waits(), view(), now=10.0) == WaitUntil(12.0)


def test_hooks_are_read_once_with_defaults_for_a_policy_without_them() -> None:
    assert PolicyHooks.of(EagerPolicy()) == PolicyHooks()
    adaptive = AdaptivePolicy(50)
    hooks = PolicyHooks.of(adaptive)
    assert hooks.latency_slo == 0.05
    assert hooks.cost is adaptive.cost
    assert hooks.admit == adaptive.admit
    assert hooks.observe == adaptive.observe
