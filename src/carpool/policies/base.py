"""WHEN a batch leaves: the policy contract, the rules every policy goes through, and the eager
and fixed policies. A policy sees a :class:`QueueView` and ``now`` and answers
:class:`Dispatch` or :class:`WaitUntil`: no clock, no I/O, so
``EagerPolicy().decide(view, now=10.0)`` is a whole unit test. The batcher asks
:func:`schedule`, which applies the rules that hold whatever the policy."""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from carpool.policies.cost import CostModel

# Batches staged per worker while every worker is busy (rule 1 of :func:`schedule`); 0 forms a
# batch only when a worker is free. Private: benchmarks/engine/reform.py measures the two.
_STAGED_PER_WORKER = 1

__all__ = [
    "Admission",
    "Decision",
    "Dispatch",
    "DispatchReason",
    "EagerPolicy",
    "FixedPolicy",
    "Policy",
    "PolicyHooks",
    "QueueView",
    "WaitUntil",
    "schedule",
]


class DispatchReason(enum.StrEnum):
    """Why a batch left the queue; counted in ``Batcher.stats().dispatch_reasons``."""

    FULL = "full"  # max_batch_size rows were waiting
    WAIT_ELAPSED = "wait_elapsed"  # the head of the queue waited max_wait_ms
    WORKER_IDLE = "worker_idle"  # a worker was free and the policy does not wait
    DEADLINE = "deadline"  # waiting would pay, but the head's deadline does not allow it
    DRAIN = "drain"  # the batcher is closing: everything accepted goes now


@dataclass(frozen=True, slots=True)
class QueueView:
    """What a policy may know. Times are seconds on the batcher's monotonic clock."""

    queued_rows: int  # every row waiting, of any shape
    head_rows: int  # rows that can join the next batch (same shape as the queue's head)
    head_arrival: float  # when the request at the head of the queue arrived
    idle_workers: int  # workers free to run a batch now (>= 1 when a policy is asked)
    busy_workers: int  # batches dispatched and not finished, staged ones included
    max_batch_size: int
    max_wait: float  # seconds; max_wait_ms / 1000
    head_deadline: float = math.inf  # the earliest deadline among the head's rows
    head_key: Hashable = None  # the head's collation key: its shape, its length bucket
    workers: int = 1
    # (start time, rows) of every batch dispatched and not finished, oldest first; the start
    # is None while the batch is staged behind a running one.
    in_flight: tuple[tuple[float | None, int], ...] = ()
    closing: bool = False  # the batcher is draining: no new rows will come
    full_queued: bool = False  # some shape (the head's or another) has max_batch_size rows


@dataclass(frozen=True, slots=True)
class Admission:
    """A request at the door, for policies that admit (see ``AdaptivePolicy``)."""

    rows: int
    deadline: float  # seconds on the batcher's clock; inf when it has none
    rows_ahead: int  # queued rows served before it (its priority level and more urgent)
    key: Hashable
    workers: int
    max_batch_size: int
    in_flight: tuple[tuple[float | None, int], ...]


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Form a batch of ``rows`` rows now.

    ``source="head"``: from the rows that can join the head of the queue (``rows`` is clamped
    to ``[1, head_rows]``). ``source="full"``: from the most urgent shape that has
    ``max_batch_size`` rows queued (``view.full_queued``), or the head's if none has.
    """

    rows: int
    reason: DispatchReason
    source: Literal["head", "full"] = "head"


@dataclass(frozen=True, slots=True)
class WaitUntil:
    """Ask again at ``time`` (or earlier, when a request arrives or a worker frees up)."""

    time: float


Decision = Dispatch | WaitUntil


@runtime_checkable
class Policy(Protocol):
    """Decides when the batch at the head of the queue should go: any object with ``decide``.

    ``decide`` is asked only while a worker is idle and rows are queued (:func:`schedule`
    handles the rest). A policy may also have any of these hooks; the batcher reads them once,
    as :meth:`PolicyHooks.of` does, and a policy without one gets its default:

    ``latency_slo: float``
        Seconds; each request's deadline is its arrival plus this (or its own ``timeout_ms``,
        if tighter), shown to ``decide`` as ``view.head_deadline``. Default: no deadline.
    ``admit(request: Admission, now: float) -> float | None``
        Asked for every request at the door: ``None`` accepts it, a predicted completion time
        refuses it with :class:`~carpool.errors.Overloaded`. Default: accept everything.
    ``observe(rows: int, seconds: float, key: Hashable) -> None``
        Told every model call's rows, duration and collation key, from the worker's thread;
        warm-up batches are timed for it too. Default: not told.
    ``cost: CostModel``
        What ``observe`` fits; the batcher reports its curve in ``stats().cost_curve`` and
        the ratio of measured to predicted times. Default: none.
    """

    def decide(self, view: QueueView, now: float) -> Decision: ...


@dataclass(frozen=True, slots=True)
class PolicyHooks:
    """The optional hooks of a policy (see :class:`Policy`), each ``None`` when it lacks it."""

    latency_slo: float | None = None
    admit: Callable[[Admission, float], float | None] | None = None
    observe: Callable[[int, float, Hashable], None] | None = None
    cost: CostModel | None = None

    @classmethod
    def of(cls, policy: Policy) -> PolicyHooks:
        """The hooks ``policy`` has: the one place the batcher looks them up."""
        return cls(
            latency_slo=getattr(policy, "latency_slo", None),
            admit=getattr(policy, "admit", None),
            observe=getattr(policy, "observe", None),
            cost=getattr(policy, "cost", None),
        )


def schedule(policy: Policy, view: QueueView, now: float) -> Decision:
    """What the batcher does now, with rows queued: the rules every policy goes through.

    1. **Staging.** While every worker is busy, ``policy.decide`` is not asked: the rows queued
       meanwhile grow into one larger batch (as Triton's dynamic batcher does). But a full
       head batch cannot grow, so it is dispatched at once, *staged*: a worker starts it the
       moment it frees up, without waiting for the event loop. At most one batch per worker is
       staged (``busy_workers < 2 * workers``). It stays re-formable until it starts: a more
       urgent request arriving meanwhile sends its rows back to the queue (the batcher does
       that), so priorities hold.
    2. **The policy decides**, with at least one worker idle.
    3. **Draining.** While closing, a wait becomes ``Dispatch(head_rows, DRAIN)``: no new rows
       can come.
    4. **Full batches first.** When the policy waits while some shape has a full batch
       queued, that batch goes now (``source="full"``): it cannot grow by waiting.
    """
    most = view.max_batch_size
    if view.idle_workers < 1:
        staged = _STAGED_PER_WORKER
        if view.head_rows >= most and view.busy_workers < (1 + staged) * view.workers:
            return Dispatch(most, DispatchReason.FULL)
        return WaitUntil(math.inf)  # a worker freeing up asks again
    decision = policy.decide(view, now)
    if isinstance(decision, Dispatch):
        return decision
    if view.closing:
        return Dispatch(view.head_rows, DispatchReason.DRAIN)
    if view.full_queued:
        return Dispatch(most, DispatchReason.FULL, source="full")
    return decision


class FixedPolicy:
    """The classic rule: dispatch when ``max_batch_size`` rows wait, or when the head of the
    queue has waited ``max_wait_ms``. Predictable, but every partial batch pays the full wait."""

    def __str__(self) -> str:
        return "fixed"

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

    def __str__(self) -> str:
        return "eager"

    def decide(self, view: QueueView, now: float) -> Decision:
        if view.head_rows >= view.max_batch_size:
            return Dispatch(view.max_batch_size, DispatchReason.FULL)
        return Dispatch(view.head_rows, DispatchReason.WORKER_IDLE)
