"""The adaptive policy: batching for a latency objective, from a learned cost model.

Pure like every policy: the batcher passes the clock in; the only state is the cost model and
the arrival rate that ``admit`` and ``observe`` update. Imports ``carpool.policies.cost`` and the
policy contract (``carpool.policies.base``), nothing else.
"""

from __future__ import annotations

import math
from collections.abc import Hashable

from carpool.policies.base import (
    Admission,
    Decision,
    Dispatch,
    DispatchReason,
    QueueView,
    WaitUntil,
)
from carpool.policies.cost import CostModel

__all__ = ["AdaptivePolicy", "completion"]


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
            done = completion(request, now, cost)
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


def completion(request: Admission, now: float, cost: CostModel) -> float:
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
