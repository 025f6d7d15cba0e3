"""The engine users hold: the one place where queue, policy, workers and the clock meet.

Everything here runs on one event loop (the batcher's): admission, the scheduler task, batch
tasks, deadline timers and resolution. Other threads reach it only through :meth:`submit`,
whose requests cross into the loop through one inbox, and through the blocking facade in
``carpool.blocking``.

Lifecycle: ``async with Batcher(...)`` owns an engine task holding a TaskGroup for the
scheduler and every batch; leaving the block (or ``aclose()``) stops admission, runs what was
accepted to completion, and only then returns. Every accepted request gets exactly one
outcome: its result, its own model error, ``DeadlineExceeded``, or ``BatcherClosed`` if the
engine is torn down by cancellation.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from threading import get_ident as _get_ident
from types import TracebackType
from typing import Any, Self

from carpool.blocking import FUTURE_DONE, Inbox, LoopThread, settle
from carpool.collate import Collator
from carpool.cost import CostModel
from carpool.errors import BatcherClosed, CollationError, DeadlineExceeded, Overloaded
from carpool.policy import Admission, Dispatch, DispatchReason, Policy, QueueView, make_policy
from carpool.queue import Entry, RequestQueue, Segment
from carpool.stats import BatcherStats, StatsRecorder
from carpool.worker import BatchRunner, Failure, is_async_callable

__all__ = ["Batcher"]

log = logging.getLogger("carpool")

# The batcher's clock; asyncio's loop.time() reads the same one through a method call.
_monotonic = time.monotonic
_Future = asyncio.Future  # what loop.create_future() makes, without its Python frame


class _State(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"


class _Request(Entry):
    """A queue entry plus what it takes to answer its caller exactly once."""

    __slots__ = ("deadline", "future", "pending", "pieces", "running", "timer")

    def __init__(
        self, value: Any, span: int | None, key: Any, priority: int, arrival: float, future: Any
    ) -> None:
        # Entry's fields, set here rather than through Entry.__init__: this is the hot path.
        self.value = value
        self.span = span
        self.rows = 1 if span is None else span
        self.key = key
        self.priority = priority
        self.arrival = arrival
        self.seq = 0
        self.taken = 0
        self.queued = False
        # asyncio.Future (infer) or concurrent.futures.Future (submit); None once answered,
        # which also breaks the cycle between a submit future and its request.
        self.future = future
        self.running = False  # some of its rows reached the model
        self.timer: asyncio.TimerHandle | None = None
        self.pending = self.rows  # rows whose output has not come back yet
        self.pieces: list[tuple[int, Any]] | None = None  # outputs of a split request
        self.deadline = math.inf  # what a deadline-aware policy plans for


def _check_int(name: str, value: object, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_ms(name: str, value: object, *, positive: bool) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise TypeError(f"{name} must be a number of milliseconds, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{name} must be finite and {bound}, got {value}")
    return float(value)


class Batcher:
    """Collects single requests into batches for ``model_fn`` and hands each caller its rows.

    ``model_fn`` takes one stacked batch and returns outputs indexable along axis 0, one row
    per input row. A plain function runs in ``workers`` threads; an ``async def`` runs on the
    loop. See the README for the policies and the admission rules.

    ``policy="adaptive"`` with ``latency_slo_ms`` batches for a latency objective and refuses
    at once what cannot make it (:class:`~carpool.errors.Overloaded`). ``warmup``, one example
    row, runs a few batches of it while entering (the model's own warm-up), and lets the
    adaptive policy time them, so that it starts with a fitted cost model.
    """

    def __init__(
        self,
        model_fn: Callable[[Any], Any],
        *,
        max_batch_size: int = 32,  # Triton and TorchServe examples start here; fits most GPUs
        max_wait_ms: float = 5.0,  # TF Serving's and Ray's order of magnitude; eager never waits
        policy: str | Policy = "eager",
        max_queue_size: int | None = None,  # rows; None: bounded only by memory
        workers: int = 1,  # one model replica; more overlap GIL-releasing models
        isolate_errors: bool = True,
        name: str | None = None,
        collator: Collator | None = None,
        latency_slo_ms: float | None = None,
        warmup: Any = None,
    ) -> None:
        if not callable(model_fn):
            raise TypeError(f"model_fn must be callable, got {type(model_fn).__name__}")
        self.max_batch_size = _check_int("max_batch_size", max_batch_size, 1)
        self.max_wait_ms = _check_ms("max_wait_ms", max_wait_ms, positive=False)
        if max_queue_size is not None:
            _check_int("max_queue_size", max_queue_size, 1)
        self.max_queue_size = max_queue_size
        self.workers = _check_int("workers", workers, 1)
        if not isinstance(isolate_errors, bool):
            raise TypeError(f"isolate_errors must be a bool, got {type(isolate_errors).__name__}")
        self.isolate_errors = isolate_errors
        self.name = name if name is not None else getattr(model_fn, "__name__", "model")
        self.model_fn = model_fn
        if latency_slo_ms is not None and policy != "adaptive":
            raise ValueError(
                "latency_slo_ms is the objective of policy='adaptive'; set that policy, or "
                "drop latency_slo_ms"
            )
        self.policy = make_policy(policy, latency_slo_ms=latency_slo_ms)
        # Duck-typed extras a policy may have: a latency objective, admission, a cost model.
        self._slo: float | None = getattr(self.policy, "latency_slo", None)
        self._cost: CostModel | None = getattr(self.policy, "cost", None)
        self._admits: Callable[[Admission, float], float | None] | None = getattr(
            self.policy, "admit", None
        )
        self._observe: Callable[[int, float, Any], None] | None = getattr(
            self.policy, "observe", None
        )
        self._warmup = warmup
        # id(segments) of each batch not finished -> (start time, or None while staged; rows)
        self._in_flight: dict[int, tuple[float | None, int]] = {}
        self._collator = collator if collator is not None else Collator()
        self._is_async = is_async_callable(model_fn)

        self._state = _State.NEW
        self._queue = RequestQueue(max_queue_size)
        self._stats = StatsRecorder()
        self._runner = BatchRunner(
            model_fn,
            is_async=self._is_async,
            collator=self._collator,
            isolate_errors=isolate_errors,
            name=self.name,
            workers=self.workers,
            record_model_time=self._modelled,
            claim=self._claim,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread_id = 0
        self._engine: asyncio.Task[None] | None = None
        self._tg: asyncio.TaskGroup | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._waiter: asyncio.Future[None] | None = None  # the parked scheduler's wake-up
        self._busy = 0
        self._inbox = Inbox(self._admit_one, self._cancel)
        self._portal: LoopThread | None = None
        # Orders a batch starting in a worker thread against a deadline or cancel on the loop,
        # so a request is either withdrawn before its rows run or reported as running.
        self._claim_lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"<Batcher {self.name!r} {self._state.value} max_batch_size={self.max_batch_size} "
            f"max_wait_ms={self.max_wait_ms:g} workers={self.workers}>"
        )

    # ----------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> Self:
        self._open(asyncio.get_running_loop())
        if self._warmup is not None:
            try:
                await self._profile(self._warmup)
            except Exception as exc:  # the model's own error on the example
                log.warning(
                    "batcher %r: warm-up failed (%s: %s); the first requests warm it instead",
                    self.name,
                    type(exc).__name__,
                    exc,
                )
            except BaseException:  # cancelled while warming up: leave nothing running
                await self._abort()
                raise
        return self

    def _open(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the engine on ``loop``, the running loop of the calling thread."""
        if self._state is not _State.NEW:
            raise RuntimeError(f"Batcher {self.name!r} is {self._state.value}; it runs once")
        self._loop = loop
        self._loop_thread_id = threading.get_ident()
        self._inbox.bind(loop)
        if not self._is_async:
            self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix=self.name)
        self._state = _State.RUNNING
        self._engine = loop.create_task(self._run_engine(), name=f"carpool:{self.name}")

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None and not isinstance(exc, Exception):
            await self._abort()
        else:
            await self.aclose()

    async def aclose(self, *, timeout: float | None = None) -> None:  # noqa: ASYNC109 - a drain bound, not a cancel
        """Stop accepting, finish every request already accepted, then return.

        With ``timeout`` (seconds), whatever is still pending after it gets
        :class:`BatcherClosed` instead (a model call still running is abandoned, not killed).
        """
        if self._state is _State.NEW:
            self._state = _State.CLOSED
            return
        if self._state is _State.RUNNING:
            # Admit what submit() already handed over: its futures were returned before close.
            self._inbox.take()
            self._state = _State.CLOSING
            self._notify()
        if self._engine is None:
            return
        if timeout is None:
            await asyncio.shield(self._engine)
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._engine), timeout)
        except TimeoutError:
            log.warning("batcher %r: drain timed out after %gs; cancelling", self.name, timeout)
            await self._abort()

    async def _abort(self) -> None:
        """Cancellation of the owner: stop now; whatever was pending gets BatcherClosed."""
        if self._state is _State.RUNNING:
            self._state = _State.CLOSING
        if self._engine is not None and not self._engine.done():
            self._engine.cancel()
            try:
                await self._engine
            except asyncio.CancelledError:
                pass

    def __enter__(self) -> Self:
        """Run the batcher on its own event loop in a background thread."""
        if self._state is not _State.NEW:
            raise RuntimeError(f"Batcher {self.name!r} is {self._state.value}; it runs once")
        self._portal = LoopThread(self, name=f"carpool-{self.name}")
        self._portal.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """The blocking ``aclose()``: for batchers entered with ``with``."""
        if self._portal is None:
            if self._state is _State.NEW:
                self._state = _State.CLOSED
                return
            raise RuntimeError(
                f"Batcher {self.name!r} runs on an event loop; use 'await batcher.aclose()'"
            )
        self._portal.stop()

    async def _run_engine(self) -> None:
        error: BaseException | None = None
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                await self._schedule()
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._state = _State.CLOSED
            self._tg = None
            reason = (
                "was cancelled"
                if isinstance(error, asyncio.CancelledError)
                else (f"stopped after an internal error ({error!r})" if error else "is closed")
            )
            for entry in self._queue.drain():
                self._answer(entry, None, BatcherClosed(self.name, reason))  # type: ignore[arg-type]
            self._inbox.reject(BatcherClosed(self.name))
            if self._executor is not None:
                self._executor.shutdown(wait=False)
            if error is not None and not isinstance(error, asyncio.CancelledError):
                log.error("batcher %r stopped after an internal error", self.name, exc_info=error)

    async def _profile(self, example: Any) -> None:
        """Warm the model before the first request: batches of ``example`` rows at sizes
        1 .. max_batch_size, once for the model's own warm-up (caches, lazy setup, kernels);
        then, for a policy that learns a cost model, twice timed. None count in stats."""
        most = self.max_batch_size
        sizes = sorted({1, max(1, most // 4), max(1, most // 2), most})
        observe = self._observe
        key = self._collator.key(example)
        for i, rows in enumerate(sizes * (3 if observe is not None else 1)):
            batch = self._collator.stack([example] * rows)
            started = time.perf_counter()
            if self._is_async:
                await self.model_fn(batch)
            else:
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(self._executor, self.model_fn, batch)
            if observe is not None and i >= len(sizes):
                observe(rows, time.perf_counter() - started, key)
        if observe is None:
            return
        log.info("batcher %r: %s", self.name, self.learned())
        one = self._cost.predict(1, key) if self._cost is not None else None
        if self._slo is not None and one is not None and one > self._slo:
            log.warning(
                "batcher %r: the latency objective (%g ms) is below the time of one batch "
                "(%.1f ms): every request will be refused as overloaded",
                self.name,
                self._slo * 1000,
                one * 1000,
            )

    def learned(self) -> str:
        """One line on what the policy learned (its cost curve), or that it learns nothing."""
        cost = self._cost
        curve = cost.curve() if cost is not None else None
        if curve is None:
            return f"policy {self.policy} has no cost model" if cost is None else "nothing yet"
        slo = f", objective {self._slo * 1000:g} ms" if self._slo is not None else ""
        overloaded = getattr(self.policy, "overloaded", 0)
        return f"policy {self.policy}{slo}: {curve}; {overloaded} refused as overloaded"

    def _modelled(self, rows: int, seconds: float, key: Any) -> None:
        """A model call's duration, from the worker that made it."""
        self._stats.modelled(seconds)
        if self._observe is not None:
            predicted = self._cost.predict(rows, key) if self._cost is not None else None
            if predicted:
                self._stats.prediction_ratios.append(seconds / predicted)
            self._observe(rows, seconds, key)

    # ----------------------------------------------------------------- requests

    async def infer(self, x: Any, *, timeout_ms: float | None = None, priority: int = 0) -> Any:
        """The model's output row for one input row ``x``.

        Raises :class:`QueueFull`, :class:`DeadlineExceeded`, :class:`BatcherClosed`,
        :class:`CollationError`, or whatever ``model_fn`` raised on this row.
        """
        loop = self._loop
        if loop is None or _get_ident() != self._loop_thread_id:
            loop = self._check_loop()
        fut: asyncio.Future[Any] = _Future(loop=loop)
        request = self._admit(x, None, timeout_ms, priority, fut)
        try:
            return await fut
        except asyncio.CancelledError:
            self._cancel(request)
            raise

    async def infer_many(
        self, xs: Any, *, timeout_ms: float | None = None, priority: int = 0
    ) -> Any:
        """Outputs for ``xs``, which carries k >= 1 rows along axis 0.

        Its rows share batches with other requests; more than ``max_batch_size`` rows are
        split over several batches and reassembled in order.
        """
        loop = self._check_loop()
        rows = self._collator.rows(xs)
        if rows < 1:
            raise CollationError("infer_many needs at least one row, got 0", field="input")
        fut = loop.create_future()
        request = self._admit(xs, rows, timeout_ms, priority, fut)
        try:
            return await fut
        except asyncio.CancelledError:
            self._cancel(request)
            raise

    def submit(
        self, x: Any, *, timeout_ms: float | None = None, priority: int = 0
    ) -> concurrent.futures.Future[Any]:
        """``infer`` from any thread: a future of the output row.

        Raises :class:`BatcherClosed` at once when not running; admission errors
        (:class:`QueueFull`, bad input) arrive through the future. Cancelling the future
        withdraws the request if it has not run yet.
        """
        if priority.__class__ is not int:
            _check_int("priority", priority, -(2**63))
        if timeout_ms is not None:
            _check_ms("timeout_ms", timeout_ms, positive=True)
        if self._loop is None or self._state is not _State.RUNNING:
            raise self._closed_error()
        fut = self._inbox.put(x, timeout_ms, priority)
        if self._closed:  # closed meanwhile: the engine may have drained the inbox already
            self._inbox.reject(BatcherClosed(self.name))
        return fut

    def stats(self) -> BatcherStats:
        """A consistent snapshot of counters and latency percentiles; from any thread."""
        loop = self._loop
        if (
            loop is not None
            and self._state is not _State.CLOSED
            and _get_ident() != self._loop_thread_id
        ):
            answer: concurrent.futures.Future[BatcherStats] = concurrent.futures.Future()

            def snap() -> None:
                answer.set_result(self._snapshot())

            try:
                loop.call_soon_threadsafe(snap)
                while not self._closed:
                    try:
                        return answer.result(timeout=0.05)
                    except concurrent.futures.TimeoutError:
                        continue  # the loop may have stopped before running snap
            except RuntimeError:  # the loop is gone: the counters no longer move
                pass
        return self._snapshot()

    def _snapshot(self) -> BatcherStats:
        if self._state is _State.RUNNING and _get_ident() == self._loop_thread_id:
            # Count what submit() already handed over, even if its wake-up is still on its way.
            self._inbox.take()
        curve = self._cost.curve() if self._cost is not None else None
        return self._stats.snapshot(self._queue.pushed, self._queue.rows, curve)

    # ----------------------------------------------------------------- on the loop

    @property
    def _closed(self) -> bool:
        return self._state is _State.CLOSED

    def _check_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None or self._state is not _State.RUNNING:
            raise self._closed_error()
        if _get_ident() != self._loop_thread_id:
            raise RuntimeError(
                f"Batcher {self.name!r} runs on another event loop or thread; "
                "call submit() from other threads"
            )
        return loop

    def _closed_error(self) -> BatcherClosed:
        if self._state is _State.NEW:
            return BatcherClosed(self.name, "is not started")
        if self._state is _State.CLOSING:
            return BatcherClosed(self.name, "is closing")
        return BatcherClosed(self.name)

    def _admit(
        self, value: Any, span: int | None, timeout_ms: float | None, priority: int, future: Any
    ) -> _Request:
        if self._state is not _State.RUNNING:
            self._stats.rejected += 1
            raise self._closed_error()
        if priority.__class__ is not int:
            _check_int("priority", priority, -(2**63))
        if timeout_ms is not None:
            timeout_ms = _check_ms("timeout_ms", timeout_ms, positive=True)
        key = self._collator.key(value, span is not None)
        now = _monotonic()
        request = _Request(value, span, key, priority, now, future)
        if self._slo is not None:
            deadline = now + self._slo
            if timeout_ms is not None:
                deadline = min(deadline, now + timeout_ms / 1000.0)
            request.deadline = deadline
        if self._admits is not None:
            ahead = self._queue.rows_ahead(priority)
            late = self._admits(
                Admission(
                    rows=request.rows,
                    deadline=request.deadline,
                    rows_ahead=ahead,
                    key=key,
                    workers=self.workers,
                    max_batch_size=self.max_batch_size,
                    in_flight=tuple(self._in_flight.values()),
                ),
                now,
            )
            if late is not None:
                self._stats.rejected += 1
                self._stats.overloaded += 1
                raise Overloaded(
                    predicted_ms=(late - now) * 1000.0,
                    budget_ms=(request.deadline - now) * 1000.0,
                    queued=ahead,
                    rows=request.rows,
                )
        try:
            self._queue.push(request)
        except Exception:
            self._stats.rejected += 1
            raise
        if timeout_ms is not None:
            request.timer = self._loop.call_at(  # type: ignore[union-attr]
                now + timeout_ms / 1000.0, self._expire, request, timeout_ms
            )
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            waiter.set_result(None)
        return request

    def _notify(self) -> None:
        """Wake the scheduler if it is parked; it re-reads everything when it runs."""
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _admit_one(
        self, value: Any, timeout_ms: float | None, priority: int, future: Any
    ) -> _Request:
        return self._admit(value, None, timeout_ms, priority, future)

    def _claim(self, segments: list[Segment]) -> list[int] | None:
        """As a batch starts: mark its requests running; the indices of those still
        unanswered, or None when all are (the common case)."""
        batch = id(segments)
        flight = self._in_flight.get(batch)
        if flight is not None:  # a staged batch starts only now: what admission plans with
            self._in_flight[batch] = (_monotonic(), flight[1])
        with self._claim_lock:
            for entry, _, _ in segments:
                if entry.future is None:  # type: ignore[attr-defined]
                    break
                entry.running = True  # type: ignore[attr-defined]
            else:
                return None
            live = []
            for i, (entry, _, _) in enumerate(segments):
                if entry.future is not None:  # type: ignore[attr-defined]
                    entry.running = True  # type: ignore[attr-defined]
                    live.append(i)
            return live

    def _expire(self, request: _Request, timeout_ms: float) -> None:
        with self._claim_lock:
            fut = request.future
            if fut is None:
                return
            request.future = None
            stage = "running" if request.running else "queued"
        self._queue.remove(request)
        self._stats.expired += 1
        settle(fut, None, DeadlineExceeded(timeout_ms=timeout_ms, stage=stage))

    def _cancel(self, request: _Request) -> None:
        with self._claim_lock:
            if request.future is None:
                return
            request.future = None
        if request.timer is not None:
            request.timer.cancel()
        self._queue.remove(request)
        self._stats.cancelled += 1

    def _answer(self, request: _Request, value: Any, error: BaseException | None) -> None:
        """Give ``request`` its one outcome, unless it already has one."""
        fut = request.future
        if fut is None:
            return
        request.future = None
        if request.timer is not None:
            request.timer.cancel()
        if error is None:
            self._stats.completed += 1
        else:
            self._queue.remove(request)  # rows of a split request still queued
            self._stats.failed += 1
        settle(fut, value, error)

    # ----------------------------------------------------------------- scheduling

    async def _schedule(self) -> None:
        queue = self._queue
        policy = self.policy
        loop = asyncio.get_running_loop()
        max_wait = self.max_wait_ms / 1000.0
        max_rows = self.max_batch_size
        while True:
            wait_until = math.inf
            if queue.rows and self._busy >= self.workers:
                # Every worker is busy. Stage a batch that is already full, so that a worker
                # starts it the moment it frees up: a full batch cannot grow by waiting.
                if self._busy < 2 * self.workers:
                    full = queue.head_of_full(max_rows)
                    if full is not None:
                        self._dispatch(full, max_rows, max_rows, DispatchReason.FULL, _monotonic())
                        continue
            elif queue.rows:
                head = queue.head()
                assert head is not None
                head_rows = queue.rows_like(head)
                now = _monotonic()
                decision = policy.decide(
                    QueueView(
                        queued_rows=queue.rows,
                        head_rows=head_rows,
                        head_arrival=head.arrival,
                        idle_workers=self.workers - self._busy,
                        busy_workers=self._busy,
                        max_batch_size=self.max_batch_size,
                        max_wait=max_wait,
                        head_deadline=head.deadline,  # type: ignore[attr-defined]
                        head_key=head.key,
                        workers=self.workers,
                        in_flight=tuple(self._in_flight.values()),
                    ),
                    now,
                )
                if isinstance(decision, Dispatch):
                    self._dispatch(head, head_rows, decision.rows, decision.reason, now)
                    continue
                if self._state is _State.CLOSING:
                    self._dispatch(head, head_rows, head_rows, DispatchReason.DRAIN, now)
                    continue
                # A full batch of another shape never waits behind the head's partial one.
                full = queue.head_of_full(max_rows)
                if full is not None:
                    self._dispatch(full, max_rows, max_rows, DispatchReason.FULL, now)
                    continue
                wait_until = decision.time
            elif self._state is not _State.RUNNING and not self._busy:
                return
            # Nothing runs between deciding and parking, so no wake-up can be missed.
            waiter = self._waiter = loop.create_future()
            if wait_until == math.inf:
                await waiter
            else:
                timer = loop.call_at(wait_until, self._notify)
                try:
                    await waiter
                finally:
                    timer.cancel()

    def _dispatch(self, head: Entry, head_rows: int, rows: int, reason: str, now: float) -> None:
        rows = max(1, min(rows, head_rows, self.max_batch_size))
        segments = self._queue.pop_batch(head, rows)
        stats = self._stats
        stats.batch(rows, reason)
        stats.waited([now - entry.arrival for entry, start, _ in segments if not start])
        self._busy += 1
        batch = id(segments)
        self._in_flight[batch] = (None, rows)
        assert self._tg is not None
        self._tg.create_task(self._run_batch(segments, rows, batch))

    async def _run_batch(self, segments: list[Segment], rows: int, batch: int) -> None:
        try:
            parts = await self._runner.run(segments, self._executor)
        except BaseException as exc:
            closed = BatcherClosed(self.name, "was cancelled")
            for entry, _, _ in segments:
                error = closed if isinstance(exc, asyncio.CancelledError) else exc
                self._answer(entry, None, error)  # type: ignore[arg-type]
            raise
        finally:
            self._busy -= 1
            del self._in_flight[batch]
            self._stats.running_rows -= rows
            self._notify()
        completed = 0
        for (entry, start, stop), part in zip(segments, parts, strict=True):
            request: _Request = entry  # type: ignore[assignment]
            fut = request.future
            if fut is None:  # cancelled or expired meanwhile
                continue
            if part.__class__ is Failure:
                self._answer(request, None, part.error)
            elif request.span is None or (start == 0 and stop == request.rows):
                # _answer inlined: this loop runs once per row of every batch
                completed += 1
                request.future = None
                if request.timer is not None:
                    request.timer.cancel()
                try:
                    fut.set_result(part)
                except FUTURE_DONE:  # the caller cancelled its concurrent future meanwhile
                    pass
            else:
                self._gather(request, start, stop, part)
        self._stats.completed += completed

    def _gather(self, request: _Request, start: int, stop: int, part: Any) -> None:
        if request.pieces is None:
            request.pieces = []
        request.pieces.append((start, part))
        request.pending -= stop - start
        if request.pending:
            return
        request.pieces.sort(key=lambda piece: piece[0])
        try:
            value = self._collator.concat([piece for _, piece in request.pieces])
        except Exception as exc:
            self._answer(request, None, exc)
            return
        request.pieces = None
        self._answer(request, value, None)
