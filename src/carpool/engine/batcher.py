"""The engine users hold: the one place where queue, policy, workers and the clock meet. All of it
runs on the batcher's event loop; other threads reach it through its
:class:`~carpool.engine.blocking.Portal`. Leaving ``async with`` (or ``aclose()``) stops
admission and runs what was accepted: every accepted request gets exactly one outcome."""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from threading import get_ident as _get_ident
from types import TracebackType
from typing import Any, Protocol, Self

from carpool.collation.collate import Collator
from carpool.engine.blocking import Portal
from carpool.engine.executor import BatchExecutor
from carpool.engine.options import DEFAULTS, BatcherOptions, OptionView, check_int, check_ms
from carpool.engine.queue import RequestQueue
from carpool.engine.request import Request, Resolver
from carpool.engine.scheduler import Scheduler
from carpool.engine.stats import BatcherStats, StatsRecorder
from carpool.engine.warmup import ModelTimes, learned, warm_up
from carpool.errors import BatcherClosed, CollationError
from carpool.policies.base import Policy, PolicyHooks
from carpool.runners import Replicas, make_replicas
from carpool.runners.threads import ModelThreads, is_async_callable

__all__ = ["Batcher"]

log = logging.getLogger("carpool")


class Settable(Protocol):
    """Where a request's outcome goes: an asyncio future, or a caller's own receiver."""

    def set_result(self, value: Any, /) -> None: ...
    def set_exception(self, exception: BaseException, /) -> None: ...


_Future = asyncio.Future  # what loop.create_future() makes, without its Python frame
_ANY_PRIORITY = -(2**63)  # priorities are any int; the check is for the type
_THREADS_EXIT_S = 10.0  # a drained batcher's threads are idle, exit at once: a bound all the same


def _build_replicas(
    spec: Any, options: BatcherOptions, collator: Collator, warmup: Any
) -> Replicas | None:
    """The model's replicas outside this process's threads, for a runner that has them;
    each runs the warm-up row, stacked, before it counts as ready."""
    if options.runner == "thread":
        return None
    return make_replicas(
        options.runner,
        spec,
        workers=options.workers,
        name=options.name,
        batch_timeout_ms=options.batch_timeout_ms,
        retry=options.retry,
        warmup=None if warmup is None else collator.stack([warmup], None),
        options=options.runner_options,
    )


class _State(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"


class Batcher:
    """Collects single requests into batches for ``model_fn`` and hands each caller its rows.

    ``model_fn`` takes one stacked batch and returns outputs indexable along axis 0, one row
    per input row. A plain function runs in ``workers`` threads; an ``async def`` runs on the
    loop. See docs/library.md for the policies and the admission rules.

    ``policy="adaptive"`` with ``latency_slo_ms`` batches for a latency objective and refuses
    at once what cannot make it (:class:`~carpool.errors.Overloaded`). ``warmup``, one example
    row, runs a few batches of it while entering (the model's own warm-up), and lets the
    adaptive policy time them, so that it starts with a fitted cost model.
    """

    # The options users read off a batcher, read-only: each is its record's.
    name: OptionView[str] = OptionView()
    max_batch_size: OptionView[int] = OptionView()
    max_wait_ms: OptionView[float] = OptionView()
    max_queue_size: OptionView[int | None] = OptionView()
    workers: OptionView[int] = OptionView()
    isolate_errors: OptionView[bool] = OptionView()
    runner: OptionView[str] = OptionView()
    batch_timeout_ms: OptionView[float | None] = OptionView()
    retry: OptionView[bool] = OptionView()
    runner_options: OptionView[Mapping[str, Any]] = OptionView()

    def __init__(
        self,
        model_fn: Callable[..., Any],
        *,
        # The defaults, each with its reason, are carpool.engine.options.BatcherOptions's.
        max_batch_size: int = DEFAULTS.max_batch_size,
        max_wait_ms: float = DEFAULTS.max_wait_ms,
        policy: str | Policy = DEFAULTS.policy,
        max_queue_size: int | None = DEFAULTS.max_queue_size,
        workers: int = DEFAULTS.workers,
        isolate_errors: bool = DEFAULTS.isolate_errors,
        name: str | None = None,  # None: model_fn's __name__
        collator: Collator | None = None,  # None: Collator(), numpy, torch, lists and dicts
        latency_slo_ms: float | None = DEFAULTS.latency_slo_ms,
        warmup: Any = None,  # None: no warm-up row
        runner: str = DEFAULTS.runner,
        batch_timeout_ms: float | None = DEFAULTS.batch_timeout_ms,
        retry: bool = DEFAULTS.retry,
        runner_options: Mapping[str, Any] | None = None,  # None: none (ray: address, ...)
        max_batch_tokens: int | None = DEFAULTS.max_batch_tokens,  # carpool.collation.tokens
        token_count: Callable[[Any], int] | None = DEFAULTS.token_count,  # value -> its tokens
    ) -> None:
        if not callable(model_fn):
            raise TypeError(f"model_fn must be callable, got {type(model_fn).__name__}")
        if name is None:
            name = getattr(model_fn, "__name__", DEFAULTS.name)
        options = BatcherOptions(
            max_batch_size=max_batch_size,
            max_wait_ms=max_wait_ms,
            policy=policy,
            max_queue_size=max_queue_size,
            workers=workers,
            isolate_errors=isolate_errors,
            name=name,
            latency_slo_ms=latency_slo_ms,
            runner=runner,
            batch_timeout_ms=batch_timeout_ms,
            retry=retry,
            runner_options={} if runner_options is None else runner_options,
            max_batch_tokens=max_batch_tokens, token_count=token_count,
        )  # fmt: skip
        self.options = options  # validated, read-only: what the parts below are built from
        self.model_fn = model_fn
        self.policy = options.new_policy()
        self._state = _State.NEW
        self._assemble(collator if collator is not None else Collator(), warmup)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread_id = 0
        self._engine: asyncio.Task[None] | None = None

    def _assemble(self, collator: Collator, warmup: Any) -> None:
        """Wire the parts: the replicas (for a runner that has them), the queue, the stats,
        who answers requests, who runs batches, who schedules them, and the portal other
        threads use."""
        self._hooks = PolicyHooks.of(self.policy)
        self._warmup_example = warmup
        self._collator = collator
        self._replicas = _build_replicas(self.model_fn, self.options, collator, warmup)
        self._is_async = self._replicas is None and is_async_callable(self.model_fn)
        self._queue: RequestQueue[Request] = RequestQueue(self.max_queue_size)
        self._stats = StatsRecorder()
        self._resolver = Resolver(
            self._queue,
            self._stats,
            self._collator,
            name=self.name,
            wake=lambda: self._scheduler.wake(),
        )
        replicas = self._replicas
        self._executor = BatchExecutor(
            self.model_fn if replicas is None else replicas.call,
            retry_fn=None if replicas is None else partial(replicas.call, retry=False),
            is_async=self._is_async,
            collator=self._collator,
            isolate_errors=self.isolate_errors,
            name=self.name,
            workers=self.workers,
            record_model_time=ModelTimes(self._stats, self._hooks),
            claim=self._resolver.claim,
        )
        self._scheduler = Scheduler(
            self.options,
            queue=self._queue,
            stats=self._stats,
            resolver=self._resolver,
            executor=self._executor,
            collator=self._collator,
            policy=self.policy,
            hooks=self._hooks,
        )
        # The thread-safe side: run on a loop thread, submit from any thread, close.
        self._portal = Portal(
            self, name=f"carpool-{self.name}", admit=self._admit, cancel=self._resolver.cancel
        )

    def __repr__(self) -> str:
        return (
            f"<Batcher {self.name!r} {self._state.value} max_batch_size={self.max_batch_size} "
            f"max_wait_ms={self.max_wait_ms:g} workers={self.workers}>"
        )

    # ----------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> Self:
        if self._replicas is not None and self._state is _State.NEW:
            await self._start_replicas(self._replicas)
        self._open(asyncio.get_running_loop())
        if self._warmup_example is not None:
            try:
                await self._warm_up(self._warmup_example)
            except BaseException:  # cancelled while warming up: leave nothing running
                await self._abort()
                raise
        return self

    async def _start_replicas(self, replicas: Replicas) -> None:
        """Load the model in every replica (in a thread: it takes seconds); a batcher whose
        replicas all failed to load is closed, with the reason raised."""
        try:
            await asyncio.to_thread(replicas.start)
        except BaseException:
            self._state = _State.CLOSED
            await asyncio.shield(asyncio.to_thread(replicas.close))
            raise

    def _open(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the engine on ``loop``, the running loop of the calling thread."""
        if self._state is not _State.NEW:
            raise RuntimeError(f"Batcher {self.name!r} is {self._state.value}; it runs once")
        self._loop = loop
        self._loop_thread_id = threading.get_ident()
        self._portal.bind(loop)
        pool = None if self._is_async else ModelThreads(self.workers, name=self.name, loop=loop)
        self._scheduler.open(loop, pool)
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
            self._portal.take()
            self._close_admission()
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
            self._close_admission()
        if self._engine is not None and not self._engine.done():
            self._engine.cancel()
            try:
                await self._engine
            except asyncio.CancelledError:
                pass

    # ----------------------------------------------------------------- from threads

    def __enter__(self) -> Self:
        """Run the batcher on its own event loop in a background thread."""
        self._portal.start()  # enters ``async with self`` there; raises what that raised
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """The blocking ``aclose()``: for batchers entered with ``with``. Once drained, it
        also waits for the model threads to exit, so none outlives it."""
        if self._state is _State.NEW:
            self._state = _State.CLOSED
            return
        if not self._portal.stop():
            raise RuntimeError(
                f"Batcher {self.name!r} runs on an event loop; use 'await batcher.aclose()'"
            )
        pool = self._scheduler.pool
        if pool is not None and self._scheduler.drained and not pool.join(_THREADS_EXIT_S):
            log.warning("batcher %r: its model threads still run after closing", self.name)

    def _close_admission(self) -> None:
        self._state = _State.CLOSING
        self._scheduler.closing = True
        self._scheduler.wake()

    async def _run_engine(self) -> None:
        try:
            await self._scheduler.serve()
        finally:
            self._state = _State.CLOSED
            self._portal.shut(BatcherClosed(self.name))
            if self._replicas is not None:  # drained (or aborted): stop the replicas
                await asyncio.shield(asyncio.to_thread(self._replicas.close))

    async def _warm_up(self, example: Any) -> None:
        pool = self._scheduler.pool
        await warm_up(
            lambda batch: self._executor.call(batch, pool),
            example,
            collator=self._collator,
            max_batch_size=self.max_batch_size,
            hooks=self._hooks,
            name=self.name,
            learned=self.learned,
        )

    def learned(self) -> str:
        """One line on what the policy learned (its cost curve), or that it learns nothing."""
        return learned(self.policy, self._hooks, self._stats.overloaded)

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
        request = self._admit(x, timeout_ms, priority, fut)
        try:  # inline, not a helper coroutine: this runs once per request
            return await fut
        except asyncio.CancelledError:
            self._resolver.cancel(request)
            raise

    async def infer_many(
        self, xs: Any, *, timeout_ms: float | None = None, priority: int = 0
    ) -> Any:
        """Outputs for ``xs``, which carries k >= 1 rows along axis 0.

        Its rows share batches with other requests; more than ``max_batch_size`` rows are
        split over several batches and reassembled in order.
        """
        fut = self._check_loop().create_future()
        withdraw = self.enqueue(xs, fut, timeout_ms=timeout_ms, priority=priority)
        try:
            return await fut
        except asyncio.CancelledError:
            withdraw()
            raise

    def enqueue(
        self,
        xs: Any,
        future: Settable,
        *,
        timeout_ms: float | None = None,
        priority: int = 0,
    ) -> Callable[[], None]:
        """``infer_many`` without a coroutine: ``xs``'s outputs (or its error) arrive
        through ``future``: an asyncio future of this batcher's loop, or anything with its
        ``set_result`` and ``set_exception``, called on the loop; call what it returns to
        withdraw the request (dropped if still queued). For a caller that answers many
        requests from one task (front-end processes, :mod:`carpool.server.frontends.hub`): a task a
        request would cost more than the rest of its trip. Raises as ``infer_many``
        refuses at admission."""
        self._check_loop()
        rows = self._collator.rows(xs)
        if rows < 1:
            raise CollationError("infer_many needs at least one row, got 0", field="input")
        return partial(self._resolver.cancel, self._admit(xs, timeout_ms, priority, future, rows))

    def submit(
        self, x: Any, *, timeout_ms: float | None = None, priority: int = 0
    ) -> concurrent.futures.Future[Any]:
        """``infer`` from any thread: a future of the output row.

        Raises :class:`BatcherClosed` at once when not running; admission errors
        (:class:`QueueFull`, bad input) arrive through the future. Cancelling the future
        withdraws the request if it has not run yet.
        """
        if priority.__class__ is not int:
            check_int("priority", priority, _ANY_PRIORITY)
        if timeout_ms is not None:
            check_ms("timeout_ms", timeout_ms, positive=True)
        if self._loop is None or self._state is not _State.RUNNING:
            raise self._closed_error()
        return self._portal.submit(x, timeout_ms, priority)

    def stats(self) -> BatcherStats:
        """A consistent snapshot of counters and latency percentiles; from any thread."""
        loop = self._loop
        if (
            loop is not None
            and self._state is not _State.CLOSED
            and _get_ident() != self._loop_thread_id
        ):
            snapshot = self._portal.call(self._snapshot)
            if snapshot is not None:
                return snapshot
        return self._snapshot()

    def _snapshot(self) -> BatcherStats:
        if self._state is _State.RUNNING and _get_ident() == self._loop_thread_id:
            # Count what submit() already handed over, even if its wake-up is still on its way.
            self._portal.take()
        cost = self._hooks.cost
        curve = cost.curve() if cost is not None else None
        snapshot = self._stats.snapshot(self._queue.pushed, self._queue.rows, curve)
        if self._replicas is None:
            return replace(snapshot, workers_alive=self.workers)
        pool = self._replicas.stats()
        return replace(
            snapshot,
            workers_alive=pool.alive,
            worker_restarts=pool.restarts,
            retried_batches=pool.retried,
            timed_out_batches=pool.timed_out,
        )

    @property
    def workers_alive(self) -> int:
        """Workers ready to run a batch now: ``workers`` for threads; for processes, those
        not dead or restarting (0 means no request can be served until one is back)."""
        return self.workers if self._replicas is None else self._replicas.alive

    # ----------------------------------------------------------------- on the loop

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
        self,
        value: Any,
        timeout_ms: float | None,
        priority: int,
        future: Any,
        span: int | None = None,
    ) -> Request:
        """Queue a request (``span`` rows, or one row without a batch axis), or raise why
        not: closed, a bad option, full, or overloaded. From ``infer`` and ``infer_many``,
        and for what other threads ``submit``, as the portal hands it over."""
        if self._state is not _State.RUNNING:
            self._stats.rejected += 1
            raise self._closed_error()
        if priority.__class__ is not int:
            check_int("priority", priority, _ANY_PRIORITY)
        if timeout_ms is not None:
            timeout_ms = check_ms("timeout_ms", timeout_ms, positive=True)
        return self._scheduler.admit(value, span, timeout_ms, priority, future)
