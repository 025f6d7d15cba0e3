"""Policies are pure: a view and a time in, a decision out. No clock, no loop."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from carpool.options import make_policy
from carpool.policy import (
    Dispatch,
    DispatchReason,
    EagerPolicy,
    FixedPolicy,
    Policy,
    QueueView,
    WaitUntil,
)


def view(**changes: Any) -> QueueView:
    """One row queued at t=10.0; batches of up to 8 rows; a 5 ms window; one idle worker."""
    base = QueueView(
        queued_rows=1,
        head_rows=1,
        head_arrival=10.0,
        idle_workers=1,
        busy_workers=0,
        max_batch_size=8,
        max_wait=0.005,
    )
    return dataclasses.replace(base, **changes)


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


# make_policy


def test_make_policy_by_name() -> None:
    assert type(make_policy("eager")) is EagerPolicy
    assert type(make_policy("fixed")) is FixedPolicy


def test_make_policy_gives_a_fresh_object_each_time() -> None:
    assert make_policy("fixed") is not make_policy("fixed")


def test_make_policy_passes_a_policy_object_through() -> None:
    policy = FixedPolicy()
    assert make_policy(policy) is policy


def test_make_policy_accepts_any_object_with_decide() -> None:
    class Always:
        def decide(self, view: QueueView, now: float) -> Dispatch:
            return Dispatch(1, DispatchReason.WORKER_IDLE)

    custom = Always()
    assert make_policy(custom) is custom
    assert isinstance(custom, Policy)


@pytest.mark.parametrize("name", ["Eager", "FIXED", "greedy", "", " eager"])
def test_make_policy_unknown_name_lists_the_known_ones(name: str) -> None:
    with pytest.raises(ValueError, match="policy must be one of") as info:
        make_policy(name)
    message = str(info.value)
    assert message == (
        f"policy must be one of 'eager', 'fixed', 'adaptive' or a Policy object, got {name!r}"
    )
    assert info.value.__cause__ is None
    assert info.value.__suppress_context__


@pytest.mark.parametrize(
    ("value", "kind"),
    [(None, "NoneType"), (3, "int"), (object(), "object"), (["eager"], "list")],
)
def test_make_policy_rejects_objects_without_decide(value: object, kind: str) -> None:
    with pytest.raises(TypeError) as info:
        make_policy(value)  # type: ignore[arg-type]
    assert str(info.value) == (
        f"policy must be a name or an object with decide(view, now), got {kind}"
    )


@pytest.mark.parametrize("cls", [EagerPolicy, FixedPolicy])
def test_make_policy_rejects_a_policy_class_instead_of_an_instance(cls: type) -> None:
    # A class has a `decide` attribute, but calling it as cls.decide(view, now) fails later,
    # far from the mistake; it must be refused at the door like any other non-policy.
    with pytest.raises(TypeError, match="policy must be a name or an object with decide"):
        make_policy(cls)  # type: ignore[arg-type]
