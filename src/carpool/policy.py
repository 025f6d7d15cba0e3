"""WHEN to dispatch a batch: pure decisions from a snapshot of the queue and a clock.

A policy sees a :class:`QueueView` and ``now`` (seconds on the batcher's monotonic clock)
and answers :class:`Dispatch` (form a batch of ``rows`` now) or :class:`WaitUntil` (ask again
at that time, or sooner if something changes). No event loop, no clock reads, no I/O here, so
``EagerPolicy().decide(view, now=10.0)`` is a whole unit test.

The batcher consults a policy only when a worker is free and rows are queued: while every
worker is busy the queue keeps growing into one larger batch (as Triton's dynamic batcher
does), instead of sealing small batches that then wait for a slot. While draining on close,
a ``WaitUntil`` is overridden: nothing waits once no new rows can come.

Writing your own: any object with ``decide(view, now) -> Dispatch | WaitUntil`` works; pass it
as ``Batcher(..., policy=MyPolicy())``. ``rows`` is clamped to ``[1, head_rows]``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = [
    "Decision",
    "Dispatch",
    "DispatchReason",
    "EagerPolicy",
    "FixedPolicy",
    "Policy",
    "QueueView",
    "WaitUntil",
    "make_policy",
]


class DispatchReason(enum.StrEnum):
    """Why a batch left the queue; counted in ``Batcher.stats().dispatch_reasons``."""

    FULL = "full"  # max_batch_size rows were waiting
    WAIT_ELAPSED = "wait_elapsed"  # the head of the queue waited max_wait_ms
    WORKER_IDLE = "worker_idle"  # a worker was free and the policy does not wait
    DRAIN = "drain"  # the batcher is closing: everything accepted goes now


@dataclass(frozen=True, slots=True)
class QueueView:
    """What a policy may know. Times are seconds on the batcher's monotonic clock."""

    queued_rows: int  # every row waiting, of any shape
    head_rows: int  # rows that can join the next batch (same shape as the queue's head)
    head_arrival: float  # when the request at the head of the queue arrived
    idle_workers: int  # workers free to run a batch now (>= 1 when a policy is asked)
    busy_workers: int  # batches running now
    max_batch_size: int
    max_wait: float  # seconds; max_wait_ms / 1000


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Form a batch of ``rows`` rows from the head of the queue now."""

    rows: int
    reason: DispatchReason


@dataclass(frozen=True, slots=True)
class WaitUntil:
    """Ask again at ``time`` (or earlier, when a request arrives or a worker frees up)."""

    time: float


Decision = Dispatch | WaitUntil


@runtime_checkable
class Policy(Protocol):
    """Decides when the batch at the head of the queue should go."""

    def decide(self, view: QueueView, now: float) -> Decision: ...


class FixedPolicy:
    """The classic rule: dispatch when ``max_batch_size`` rows wait, or when the head of the
    queue has waited ``max_wait_ms``. Predictable, but every partial batch pays the full wait."""

    def decide(self, view: QueueView, now: float) -> Decision:
        if view.head_rows >= view.max_batch_size:
            return Dispatch(view.max_batch_size, DispatchReason.FULL)
        due = view.head_arrival + view.max_wait
        if now >= due:
            return Dispatch(view.head_rows, DispatchReason.WAIT_ELAPSED)
        return WaitUntil(due)


class EagerPolicy:
    """Work-conserving: a free worker takes whatever is queued now.

    At low load a request runs the moment it arrives (no batching delay); at high load the
    workers are busy, rows pile up meanwhile, and each batch leaves full. No deliberate wait,
    so ``max_wait_ms`` never adds latency here.
    """

    def decide(self, view: QueueView, now: float) -> Decision:
        if view.head_rows >= view.max_batch_size:
            return Dispatch(view.max_batch_size, DispatchReason.FULL)
        return Dispatch(view.head_rows, DispatchReason.WORKER_IDLE)


_BY_NAME: dict[str, type[FixedPolicy] | type[EagerPolicy]] = {
    "eager": EagerPolicy,
    "fixed": FixedPolicy,
}


def make_policy(policy: str | Policy) -> Policy:
    """A policy object from its name (``"eager"``, ``"fixed"``) or a user's own object."""
    if isinstance(policy, str):
        try:
            return _BY_NAME[policy]()
        except KeyError:
            names = ", ".join(repr(n) for n in _BY_NAME)
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
