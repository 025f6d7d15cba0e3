"""Options checked at the door: the batcher's settings and each request's, and the policy a
``policy=`` argument names.

Type first, then range, naming the parameter (``max_batch_size must be >= 1, got 0``), so
a mistake surfaces where it was made. Imports the policies, nothing that runs them.
"""

from __future__ import annotations

import math

from carpool.adaptive import AdaptivePolicy
from carpool.policy import EagerPolicy, FixedPolicy, Policy

__all__ = ["check_bool", "check_int", "check_ms", "make_policy"]


def check_int(name: str, value: object, minimum: int) -> int:
    """``value`` if it is an int (not a bool) ``>= minimum``; else TypeError or ValueError."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_ms(name: str, value: object, *, positive: bool) -> float:
    """``value`` as float milliseconds: finite, ``>= 0`` (``> 0`` if ``positive``)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise TypeError(f"{name} must be a number of milliseconds, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{name} must be finite and {bound}, got {value}")
    return float(value)


def check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


_BY_NAME: dict[str, type[FixedPolicy] | type[EagerPolicy]] = {
    "eager": EagerPolicy,
    "fixed": FixedPolicy,
}


def make_policy(policy: str | Policy, *, latency_slo_ms: float | None = None) -> Policy:
    """A policy object from its name (``"eager"``, ``"fixed"``, ``"adaptive"``, which needs
    ``latency_slo_ms``) or a user's own object."""
    if latency_slo_ms is not None and policy != "adaptive":
        raise ValueError(
            "latency_slo_ms is the objective of policy='adaptive'; set that policy, or "
            "drop latency_slo_ms"
        )
    if policy == "adaptive":
        if latency_slo_ms is None:
            raise ValueError(
                "policy 'adaptive' needs a latency objective: set latency_slo_ms "
                "(e.g. 50 for 50 ms)"
            )
        return AdaptivePolicy(latency_slo_ms)
    if isinstance(policy, str):
        try:
            return _BY_NAME[policy]()
        except KeyError:
            names = ", ".join(repr(n) for n in [*_BY_NAME, "adaptive"])
            raise ValueError(
                f"policy must be one of {names} or a Policy object, got {policy!r}"
            ) from None
    candidate: object = policy  # callers without type checking pass anything
    if isinstance(candidate, type) or not isinstance(candidate, Policy):
        kind = (
            f"the class {candidate.__name__}"
            if isinstance(candidate, type)
            else (type(candidate).__name__)
        )
        raise TypeError(f"policy must be a name or an object with decide(view, now), got {kind}")
    return policy
