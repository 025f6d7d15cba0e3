"""The batcher's scheduler, on its event loop: requests into the queue, batches out. It asks
:func:`~carpool.policies.base.schedule` what to do with the queue's head, dispatches to the
executor and parks until the named time or a change; a more urgent arrival sends staged
batches back to be formed again. Only the batcher imports it."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any

from carpool.collation.collate import Collator
from carpool.collation.tokens import Meter
from carpool.engine.executor import BatchExecutor
from carpool.engine.inflight import Batch, InFlight
from carpool.engine.options import BatcherOptions
from carpool.engine.queue import RequestQueue
from carpool.engine.request import Request, Resolver
from carpool.engine.stats import StatsRecorder
from carpool.errors import BatcherClosed, ConfigError, ConfigTypeError, Overloaded
from carpool.policies.base import Admission, Dispatch, Policy, PolicyHooks, QueueView, schedule
from carpool.runners.threads import ModelThreads

__all__ = ["Scheduler"]

log = logging.getLogger("carpool")

_monotonic = time.monotonic  # the batcher's clock
# A padded model's batch is formed by length from the first SORT_WINDOW batches' worth of
# rows queued (infinity sorts up to 256 texts; 8 x 32 is the same).
SORT_WINDOW = 8
# Whether a more urgent arrival re-forms the staged batches. Private: only
# benchmarks/engine/reform.py turns it off, to measure what re-forming buys.
_REFORM = True


class Scheduler:
    """Decides, dispatches and runs the batches of one batcher."""

    def __init__(
        self,
        options: BatcherOptions,
        *,
        queue: RequestQueue[Request],
        stats: StatsRecorder,
        resolver: Resolver,
        executor: BatchExecutor[Request],
        collator: Collator,
        policy: Policy,
        hooks: PolicyHooks,
    ) -> None:
        self._name = options.name
        self._queue = queue
        self._stats = stats
        self._resolver = resolver
        self._executor = executor
        self._collator = collator
        self._policy = policy
        self._hooks = hooks
        self._slo = hooks.latency_slo  # read once: admission runs per request
        self._admit_hook = hooks.admit
        # Read on every decision: plain attributes, not lookups through the record.
        self._workers = options.workers
        self._max_batch_size = options.max_batch_size
        self._max_wait = options.max_wait_ms / 1000.0
        # Tokens (carpool.collation.tokens): a padded model's rows are measured by their length, any
        # model's by token_count; a padded model's batches are formed by length from a
        # queue deeper than one batch.
        self._budget = options.max_batch_tokens
        self._token_count = options.token_count
        self._pads = collator.pads
        self._measures = self._pads or self._token_count is not None
        self._sort_window = SORT_WINDOW * options.max_batch_size if self._pads else 0
        if self._budget is not None and not self._measures:
            raise ConfigError(
                "max_batch_tokens needs a way to count a request's tokens: give "
                "token_count=f (f(value) -> int), or a padded model (Model(padding=...))"
            )
        self.in_flight: InFlight[Request] = InFlight()
        self.pool: ModelThreads | None = None  # a plain model's threads, once the loop runs
        self.drained = False  # ended with every batch finished: its threads idle, exiting
        self.closing = False  # no new requests: drain, then stop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tg: asyncio.TaskGroup | None = None
        self._waiter: asyncio.Future[None] | None = None  # set while parked
        self._rewaited: set[Request] = set()  # back from a re-formed batch: wait already counted

    # ------------------------------------------------------------ admission

    def open(self, loop: asyncio.AbstractEventLoop, pool: ModelThreads | None) -> None:
        """Serve on ``loop``, a plain model's batches in ``pool``'s threads."""
        self._loop = loop
        self.pool = pool

    def admit(
        self, value: Any, span: int | None, timeout_ms: float | None, priority: int, future: Any
    ) -> Request:
        """Queue a request for ``value`` (``span`` rows, or one row without a batch axis),
        answered through ``future``; or raise why not: rows that cannot be batched
        (:class:`~carpool.errors.CollationError`), the policy refuses it
        (:class:`Overloaded`), or the queue is full (:class:`~carpool.errors.QueueFull`)."""
        key = self._collator.key(value, span is not None)
        now = _monotonic()
        request = Request(value, span, key, priority, now, future)
        if self._measures:
            self._measure(request)
        slo = self._slo
        if slo is not None:
            request.deadline = now + (slo if timeout_ms is None else min(slo, timeout_ms / 1e3))
        if self._admit_hook is not None:
            self._check_admission(request)
        try:
            self._queue.push(request)
        except Exception:
            self._stats.rejected += 1
            raise
        if timeout_ms is not None:
            assert self._loop is not None  # open() came first
            request.timer = self._loop.call_at(
                now + timeout_ms / 1000.0, self._resolver.expire, request, timeout_ms
            )
        if priority < self.in_flight.least_urgent and _REFORM:
            self._reform(priority)
        waiter = self._waiter  # wake() inlined: this runs once per request
        if waiter is not None:
            self._waiter = None
            waiter.set_result(None)
        return request

    def _measure(self, request: Request) -> None:
        """A request's padded length and its tokens (the real ones, by ``token_count``; else
        its rows at their padded length)."""
        value = request.value
        length = self._collator.length(value, request.span is not None) if self._pads else 0
        request.length = length
        count = self._token_count
        tokens = count(value) if count is not None else request.rows * length
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
            raise ConfigTypeError(
                f"token_count must return an int >= 0 (the request's tokens), got {tokens!r}"
            )
        request.tokens = tokens

    def _check_admission(self, request: Request) -> None:
        assert self._admit_hook is not None
        now = request.arrival
        ahead = self._queue.rows_ahead(request.priority)
        admission = Admission(
            rows=request.rows,
            deadline=request.deadline,
            rows_ahead=ahead,
            key=request.key,
            workers=self._workers,
            max_batch_size=self._max_batch_size,
            in_flight=self.in_flight.view(),
        )
        late = self._admit_hook(admission, now)
        if late is not None:
            self._stats.rejected += 1
            self._stats.overloaded += 1
            raise Overloaded(
                predicted_ms=(late - now) * 1000.0,
                budget_ms=(request.deadline - now) * 1000.0,
                queued=ahead,
                rows=request.rows,
            )

    def _reform(self, priority: int) -> None:
        """A request of ``priority`` arrived: the batches not started that hold less urgent
        rows go back to the queue, to be formed again with it in its place."""
        undone = []
        for batch in self.in_flight.displaced_by(priority):
            if not self._resolver.void(batch):  # started meanwhile: it and older ones stay
                break
            undone.append(batch)
        for batch in undone:  # newest first: each goes back in front of the later ones
            live = [s for s in batch.segments if s[0].future is not None]
            self._queue.restore(live)
            self._rewaited.update(entry for entry, start, _ in live if not start)
            self.in_flight.remove(batch)
            self._stats.unbatch(batch.rows, batch.reason, batch.tokens)

    # ------------------------------------------------------------ the scheduler task

    def wake(self) -> None:
        """Wake the scheduler if it is parked; it re-reads everything when it runs."""
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def serve(self) -> None:
        """The engine task: the scheduler and every batch in one TaskGroup, until closing and
        drained (or cancelled). On the way out, whatever is still queued gets
        :class:`BatcherClosed` and the worker threads are let go."""
        error: BaseException | None = None
        try:
            async with asyncio.TaskGroup() as tg:
                await self._run(tg)
        except BaseException as exc:
            error = exc
            raise
        finally:
            self.closing = True
            self.drained = error is None
            reason = (
                "was cancelled"
                if isinstance(error, asyncio.CancelledError)
                else (f"stopped after an internal error ({error!r})" if error else "is closed")
            )
            self._resolver.fail(self._queue.drain(), BatcherClosed(self._name, reason))
            if self.pool is not None:
                self.pool.shutdown()
            if error is not None and not isinstance(error, asyncio.CancelledError):
                log.error("batcher %r stopped after an internal error", self._name, exc_info=error)

    async def _run(self, tg: asyncio.TaskGroup) -> None:
        """Until closing and drained: ask the policy, dispatch into ``tg``, park."""
        self._tg = tg
        queue = self._queue
        loop = asyncio.get_running_loop()
        while True:
            wait_until = math.inf
            head = queue.head() if queue.rows else None
            if head is not None:
                now = _monotonic()
                decision = schedule(self._policy, self._view(head, now), now)
                if isinstance(decision, Dispatch):
                    self._dispatch(head, decision, now)
                    continue
                wait_until = decision.time
            else:
                self._rewaited.clear()  # every entry in it has been dispatched or answered
                if self.closing and not self.in_flight:
                    return
            # Nothing runs between deciding and parking, so no wake-up can be missed.
            waiter = self._waiter = loop.create_future()
            if wait_until == math.inf:
                await waiter
            else:
                timer = loop.call_at(wait_until, self.wake)
                try:
                    await waiter
                finally:
                    timer.cancel()

    def _view(self, head: Request, now: float) -> QueueView:
        queue = self._queue
        most = self._max_batch_size
        head_rows = queue.rows_like(head)
        spent = False  # the budget fills a batch before max_batch_size does
        if self._budget is not None and head_rows > 1:
            meter = Meter(self._budget)
            head_rows = queue.rows_fitting(head, most, meter)
            spent = meter.full
        busy = len(self.in_flight)
        return QueueView(
            queued_rows=queue.rows,
            head_rows=head_rows,
            head_arrival=head.arrival,
            idle_workers=max(0, self._workers - busy),
            busy_workers=busy,
            max_batch_size=most,
            max_wait=self._max_wait,
            head_deadline=head.deadline,
            head_key=head.key,
            workers=self._workers,
            in_flight=self.in_flight.view(),
            closing=self.closing,
            full_queued=spent or head_rows >= most or queue.has_full(most),
        )

    def _dispatch(self, head: Request, decision: Dispatch, now: float) -> None:
        queue = self._queue
        if decision.source == "full":
            head = queue.head_of_full(self._max_batch_size) or head
        rows = max(1, min(decision.rows, queue.rows_like(head), self._max_batch_size))
        meter = Meter(self._budget) if self._measures else None
        segments = queue.pop_batch(head, rows, meter, self._sort_window)
        if meter is not None:
            rows = meter.rows  # what the budget let in: the rows the batch really runs
        batch = Batch(segments, rows, decision.reason)
        stats = self._stats
        if meter is not None:
            batch.tokens = (meter.computed, meter.real)
        stats.batch(rows, decision.reason, batch.tokens)
        waited = [entry for entry, start, _ in segments if not start]
        if self._rewaited:
            waited = [entry for entry in waited if entry not in self._rewaited]
            self._rewaited.difference_update(entry for entry, _, _ in segments)
        stats.waited([now - entry.arrival for entry in waited])
        self.in_flight.add(batch)
        assert self._tg is not None
        self._tg.create_task(self._run_batch(batch))

    async def _run_batch(self, batch: Batch[Request]) -> None:
        try:
            parts = await self._executor.run(batch, self.pool)
        except BaseException as exc:
            self._finish(batch)
            if not batch.void:
                self._resolver.fail((entry for entry, _, _ in batch.segments), exc)
            raise
        self._finish(batch)
        if not batch.void:
            self._resolver.deliver(batch.segments, parts)
        # After the answers: callers that ask again at once join the next batch.
        self.wake()

    def _finish(self, batch: Batch[Request]) -> None:
        if not batch.void:  # a re-formed batch left the books when it went back
            self.in_flight.remove(batch)
            self._stats.running_rows -= batch.rows
