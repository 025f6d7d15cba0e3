"""Options checked at the door: the helpers' messages, and the policy a ``policy=`` names."""

from __future__ import annotations

import math

import pytest

from carpool.adaptive import AdaptivePolicy
from carpool.options import check_bool, check_int, check_ms, make_policy
from carpool.policy import Dispatch, DispatchReason, EagerPolicy, FixedPolicy, Policy, QueueView


def test_check_int_names_the_option_type_then_range() -> None:
    assert check_int("workers", 3, 1) == 3
    with pytest.raises(TypeError, match=r"^workers must be an int, got float$"):
        check_int("workers", 1.0, 1)
    with pytest.raises(TypeError, match=r"^workers must be an int, got bool$"):
        check_int("workers", True, 1)
    with pytest.raises(ValueError, match=r"^workers must be >= 1, got 0$"):
        check_int("workers", 0, 1)


def test_check_ms_takes_finite_milliseconds_as_float() -> None:
    assert check_ms("max_wait_ms", 5, positive=False) == 5.0
    assert isinstance(check_ms("max_wait_ms", 0, positive=False), float)
    with pytest.raises(ValueError, match=r"^timeout_ms must be finite and > 0, got 0$"):
        check_ms("timeout_ms", 0, positive=True)
    with pytest.raises(ValueError, match=r"^max_wait_ms must be finite and >= 0, got inf$"):
        check_ms("max_wait_ms", math.inf, positive=False)
    with pytest.raises(TypeError, match=r"^timeout_ms must be a number of milliseconds, got str$"):
        check_ms("timeout_ms", "5", positive=True)


def test_check_bool_refuses_truthy_values() -> None:
    assert check_bool("isolate_errors", False) is False
    with pytest.raises(TypeError, match=r"^isolate_errors must be a bool, got int$"):
        check_bool("isolate_errors", 1)


def test_latency_slo_ms_needs_the_adaptive_policy() -> None:
    with pytest.raises(ValueError, match="latency_slo_ms is the objective of policy='adaptive'"):
        make_policy("eager", latency_slo_ms=50)
    adaptive = make_policy("adaptive", latency_slo_ms=50)
    assert isinstance(adaptive, AdaptivePolicy)
    assert adaptive.latency_slo == 0.05


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
