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
import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from carpool.cost import CostModel

__all__ = [
    "AdaptivePolicy",
    "Admission",
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
    DEADLINE = "deadline"  # waiting would pay, but the head's deadline does not allow it
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
    head_deadline: float = math.inf  # the earliest deadline among the head's rows
    head_key: Hashable = None  # the head's collation key: its shape, its length bucket
    workers: int = 1
    # (start time, rows) of every batch dispatched and not finished, oldest first; the start
    # is None while the batch is staged behind a running one.
    in_flight: tuple[tuple[float | None, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Admission:
    """A request at the door, for policies that admit (see :class:`AdaptivePolicy`)."""

    rows: int
    deadline: float  # seconds on the batcher's clock; inf when it has none
    rows_ahead: int  # queued rows served before it (its priority level and more urgent)
    key: Hashable
    workers: int
    max_batch_size: int
    in_flight: tuple[tuple[float | None, int], ...]


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


# The next row has arrived by this many mean gaps, 9 times in 10 (Poisson: -ln(0.1)).
_GAP_P90 = math.log(10.0)


class AdaptivePolicy:
    """Deadline-aware batching from a learned cost model: state the latency objective, not
    the batch window.

    * Every request's deadline is its arrival plus ``latency_slo_ms`` (or its own, tighter,
      timeout).
    * **Admission**: a request whose predicted completion (the batches running and staged,
      the rows queued ahead of it, then its own batch, at the cost model's 90th percentile,
      plus ``headroom_ms`` to deliver the answer) is past its deadline is refused at once
      with :class:`~carpool.errors.Overloaded`, rather than served late; under overload
      the queue holds only what can still make it. Its own batch is costed full when
      anything is ahead of it, as rows arriving meanwhile fill it.
    * **Dispatch**: a free worker takes the queue's head now (work-conserving, like
      ``eager``) unless waiting for one more row pays: waiting runs ``n + 1`` rows a moment
      later, dispatching now runs ``n`` rows and leaves the rows arriving meanwhile for a
      batch after it. The policy waits when the worst latency among these rows is lower
      that way, judged with a pessimistic arrival (the next row's 90th-percentile gap), only
      while the head's deadline still holds, and never longer than ``max_wait_ms``. At low
      load that never pays (a lone row runs at once); near capacity it fills batches.

    ``decide``, ``admit`` and ``observe`` are pure apart from the cost model and the arrival
    rate they update; the batcher passes the clock in.
    """

    def __init__(
        self,
        latency_slo_ms: float,
        *,
        cost: CostModel | None = None,
        rate_window_s: float = 1.0,
        headroom_ms: float = 2.0,
    ) -> None:
        if isinstance(latency_slo_ms, bool) or not isinstance(latency_slo_ms, int | float):
            kind = type(latency_slo_ms).__name__
            raise TypeError(f"latency_slo_ms must be a number of milliseconds, got {kind}")
        if not 0 < latency_slo_ms < math.inf:
            raise ValueError(f"latency_slo_ms must be finite and > 0, got {latency_slo_ms!r}")
        if not rate_window_s > 0:
            raise ValueError(f"rate_window_s must be > 0, got {rate_window_s!r}")
        if not 0 <= headroom_ms < math.inf:
            raise ValueError(f"headroom_ms must be finite and >= 0, got {headroom_ms!r}")
        self.latency_slo = latency_slo_ms / 1000.0
        # Admission plans to finish this much before the deadline (at most a tenth of the
        # objective): answering callers, resolving futures and writing responses, takes
        # time after the batch ends.
        self.headroom = min(headroom_ms, latency_slo_ms / 10) / 1000.0
        self.cost = cost if cost is not None else CostModel()
        self._window = rate_window_s
        self._rate = 0.0  # rows/s, exponentially decayed over the window
        self._rate_at = -math.inf
        self.overloaded = 0

    def __repr__(self) -> str:
        return f"AdaptivePolicy(latency_slo_ms={self.latency_slo * 1000:g})"

    def __str__(self) -> str:
        return "adaptive"

    # ------------------------------------------------------------ what it learns

    def arrival_rate(self, now: float) -> float:
        """Rows per second arriving lately (an exponentially decayed count)."""
        if self._rate_at == -math.inf:
            return 0.0
        return self._rate * math.exp(-(now - self._rate_at) / self._window)

    def _arrived(self, rows: int, now: float) -> None:
        self._rate = self.arrival_rate(now) + rows / self._window
        self._rate_at = now

    def observe(self, rows: int, seconds: float, key: Hashable = None) -> None:
        """A batch of ``rows`` rows ran for ``seconds``; from any thread."""
        self.cost.observe(rows, seconds, key)

    # ------------------------------------------------------------ admission

    def admit(self, request: Admission, now: float) -> float | None:
        """None to accept; else the predicted completion time, past the deadline. The
        arrival rate counts the rows accepted: those that will join batches."""
        cost = self.cost
        if request.deadline != math.inf and cost.curve(request.key) is not None:
            done = _completion(request, now, cost)
            if done > request.deadline - self.headroom:
                self.overloaded += 1
                return done
        self._arrived(request.rows, now)
        return None

    # ------------------------------------------------------------ dispatch

    def decide(self, view: QueueView, now: float) -> Decision:
        n, most = view.head_rows, view.max_batch_size
        if n >= most:
            return Dispatch(most, DispatchReason.FULL)
        curve = self.cost.curve(view.head_key)
        rate = self.arrival_rate(now)
        waited = now - view.head_arrival
        if waited >= view.max_wait and view.max_wait > 0:
            return Dispatch(n, DispatchReason.WAIT_ELAPSED)
        if curve is None or rate <= 0 or waited >= view.max_wait:
            return Dispatch(n, DispatchReason.WORKER_IDLE)
        gap = _GAP_P90 / rate
        run_now = curve.predict(n)
        after = curve.predict(max(1, min(most, round(rate * run_now))))
        # Dispatch now: the head is done after run_now; a row arriving at `gap` waits for
        # this batch, then runs in the next. Wait: everything runs at gap + run(n + 1).
        run_later = gap + curve.predict(n + 1)
        worst_now = max(waited + run_now, run_now + after - gap)
        worst_later = waited + run_later
        if worst_later >= worst_now:
            return Dispatch(n, DispatchReason.WORKER_IDLE)
        if now + run_later > view.head_deadline:
            return Dispatch(n, DispatchReason.DEADLINE)
        return WaitUntil(min(now + gap, view.head_arrival + view.max_wait))


def _completion(request: Admission, now: float, cost: CostModel) -> float:
    """When the request's last row is predicted to finish: the running batches on their
    workers, the staged ones after them, then the queue ahead of it in full batches, then
    its own. Its own batch is costed full when anything is ahead: under load, rows that
    arrive meanwhile fill it before it starts."""
    key, most, workers = request.key, request.max_batch_size, request.workers
    free = [now] * workers
    running = [(start, rows) for start, rows in request.in_flight if start is not None]
    staged = [rows for start, rows in request.in_flight if start is None]
    for i, (start, rows) in enumerate(running):
        took = cost.predict(rows, key) or 0.0
        if i < workers:
            free[i] = max(now, start + took)
        else:  # more running than workers (a worker just freed): it queues like a staged one
            staged.insert(0, rows)
    for rows in staged:
        at = free.index(min(free))
        free[at] += cost.predict(rows, key) or 0.0
    busy = bool(request.in_flight) or request.rows_ahead > 0
    left = request.rows_ahead + request.rows
    done = now
    while left > 0:
        rows = min(left, most)
        left -= rows
        own = left < request.rows  # this batch holds some of its rows
        at = free.index(min(free))
        free[at] += cost.predict(most if own and busy else rows, key) or 0.0
        if own:
            done = max(done, free[at])
    return done


_BY_NAME: dict[str, type[FixedPolicy] | type[EagerPolicy]] = {
    "eager": EagerPolicy,
    "fixed": FixedPolicy,
}


def make_policy(policy: str | Policy, *, latency_slo_ms: float | None = None) -> Policy:
    """A policy object from its name (``"eager"``, ``"fixed"``, ``"adaptive"``, which needs
    ``latency_slo_ms``) or a user's own object."""
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
