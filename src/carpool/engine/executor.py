"""Run one batch: collate -> model -> check rows -> split, and isolate the rows that fail. A plain
model runs in the batcher's worker threads with stacking and splitting, so large copies stay
off the event loop. :func:`isolate` plans which rows re-run after an error without calling the
model, so one plan drives threads and coroutines. Knows nothing of queues or policies."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator
from functools import partial
from typing import Any, Generic

from carpool.collation.collate import Collator, Span
from carpool.engine.failure import Failure
from carpool.engine.inflight import Batch
from carpool.engine.queue import Q, Segment
from carpool.errors import (
    BatcherClosed,
    BatchSizeMismatch,
    BatchTimeout,
    ModelExit,
    WorkerDied,
    call_model,
)
from carpool.runners.threads import Handoff, ModelThreads

__all__ = ["BatchExecutor", "isolate"]

# What an async model may raise through us untouched, on the loop's thread: a real Ctrl-C
# (Python raises it wherever the main thread is, the model's frames included: a model's own
# ``raise KeyboardInterrupt`` cannot be told from it), and the loop's cancellation and
# closing of the coroutine.
_LOOP_CONTROL = (KeyboardInterrupt, asyncio.CancelledError, GeneratorExit)


# What isolate() asks to run: (values, spans, rows); what it is told: (parts, None) or
# (None, exception).
Attempt = tuple[list[Any], list[Span] | None, int]
Outcome = tuple[list[Any] | None, Exception | None]


# Errors that fail the whole batch, unbisected (see isolate).
_WHOLE_BATCH = (BatchSizeMismatch, BatchTimeout, BatcherClosed)
# Errors not raised by the model function: no note says it raised them.
_NOT_THE_MODELS = (*_WHOLE_BATCH, WorkerDied)


def _rows(spans: list[Span]) -> int:
    return sum(1 if span is None else span for span in spans)


def isolate(
    values: list[Any], spans: list[Span] | None, rows: int, *, bisect: bool, note: str
) -> Generator[Attempt, Outcome, list[Any]]:
    """Plan the model calls for one batch: run it whole; if that raises, run each half.

    Recursing down to single segments finds every failing request in about
    ``2 * failures * log2(segments)`` extra calls; the rest get their results. A wrong row
    count is the model's contract broken, not a bad row: every segment gets it, unbisected;
    so do a batch past its time limit (halves would each wait as long) and a closed pool. A
    worker process that died on the batch is bisected like an exception: a poisoned row
    fails alone.
    """
    parts, error = yield values, spans, rows
    if error is None:
        assert parts is not None
        return parts
    if isinstance(error, _WHOLE_BATCH) or not bisect or len(values) == 1:
        if not isinstance(error, _NOT_THE_MODELS):
            error.add_note(note.format(rows=rows))
        return [Failure(error)] * len(values)
    mid = len(values) // 2
    if spans is None:
        left_spans, right_spans, left_rows = None, None, mid
    else:
        left_spans, right_spans, left_rows = spans[:mid], spans[mid:], _rows(spans[:mid])
    left = yield from isolate(values[:mid], left_spans, left_rows, bisect=bisect, note=note)
    right = yield from isolate(
        values[mid:], right_spans, rows - left_rows, bisect=bisect, note=note
    )
    return left + right


class BatchExecutor(Generic[Q]):
    """Executes batches of one model. ``record_model_time`` gets each call that returned:
    its batch's rows, its own rows, its collation key, and the seconds to stack its rows,
    of the model, and to split its output (:class:`carpool.engine.warmup.ModelTimes`); ``claim``
    is :meth:`carpool.engine.request.Resolver.claim`."""

    def __init__(
        self,
        model_fn: Callable[[Any], Any],
        *,
        retry_fn: Callable[[Any], Any] | None = None,
        is_async: bool,
        collator: Collator,
        isolate_errors: bool,
        name: str,
        workers: int,
        record_model_time: Callable[[int, int, Any, float, float, float], None],
        claim: Callable[[Batch[Q]], list[int] | None],
    ) -> None:
        self._model_fn = model_fn
        # Bisection's calls: for replicas that retry a batch whose worker died, without
        # that retry (a poisoned row would take down two workers per half otherwise).
        self._retry_fn = retry_fn if retry_fn is not None else model_fn
        self._is_async = is_async
        self._collator = collator
        self._bisect = isolate_errors
        self._note = f"carpool: raised by model_fn of batcher {name!r} on a batch of {{rows}} rows"
        self._record_model_time = record_model_time
        self._claim = claim
        # A plain model runs in a pool of `workers` threads, which queues staged batches;
        # an async one needs this gate to run at most `workers` batches at once.
        self._slots = asyncio.Semaphore(workers)

    async def run(self, batch: Batch[Q], pool: ModelThreads | None) -> list[Any]:
        """One part per segment, in order (for a plain model, in one of ``pool``'s threads)."""
        if self._is_async:
            async with self._slots:
                return await self._run_async(batch)
        assert pool is not None
        return await pool.submit(partial(self._run_sync, batch))

    async def call(self, batch: Any, pool: ModelThreads | None) -> Any:
        """One model call on a stacked ``batch``, outside any request (warm-up)."""
        if self._is_async:
            return await self._call_async(batch)
        assert pool is not None
        model_fn = self._model_fn

        def job(handoff: Handoff) -> Any:
            handoff()
            return call_model(model_fn, batch)

        return await pool.submit(job)

    def _prepare(self, batch: Batch[Q]) -> tuple[list[int] | None, Attempt]:
        """The segments still worth computing (None: all), and the values and spans to stack."""
        live = self._claim(batch)
        segments = batch.segments
        if live is None:
            spans_now = [entry.span for entry, _, _ in segments]
            if spans_now.count(None) == len(spans_now):  # all single rows: the common case
                values_now = [entry.value for entry, _, _ in segments]
                return None, (values_now, None, len(values_now))
            live = list(range(len(segments)))
        values: list[Any] = []
        spans: list[Span] = []
        single = True
        take = self._collator.take
        for i in live:
            entry, start, stop = segments[i]
            if entry.span is None:
                values.append(entry.value)
                spans.append(None)
            else:
                single = False
                whole = start == 0 and stop == entry.rows
                values.append(entry.value if whole else take(entry.value, start, stop))
                spans.append(stop - start)
        if single:
            return live, (values, None, len(values))
        return live, (values, spans, _rows(spans))

    @staticmethod
    def _place(segments: list[Segment[Q]], live: list[int] | None, parts: list[Any]) -> list[Any]:
        if live is None or len(live) == len(segments):
            return parts
        placed: list[Any] = [None] * len(segments)
        for i, part in zip(live, parts, strict=True):
            placed[i] = part
        return placed

    def _run_sync(self, batch: Batch[Q], handoff: Handoff) -> list[Any]:
        live, attempt = self._prepare(batch)
        segments = batch.segments
        if live is not None and not live:  # every request was answered while staged
            return [None] * len(segments)
        key = segments[0][0].key
        size = batch.rows
        try:  # the whole batch first: isolate()'s first attempt, without its machinery
            parts = self._execute(*attempt, size, key, handoff)
        except Exception as exc:  # isolate the rows that raised: halves, then quarters...
            plan = self._plan(attempt)
            try:
                attempt = plan.send((None, exc))
                while True:
                    try:
                        outcome: Outcome = (
                            self._execute(*attempt, size, key, handoff, self._retry_fn),
                            None,
                        )
                    except Exception as error:
                        outcome = (None, error)
                    attempt = plan.send(outcome)
            except StopIteration as done:
                parts = done.value
        return self._place(segments, live, parts)

    async def _run_async(self, batch: Batch[Q]) -> list[Any]:
        live, attempt = self._prepare(batch)
        segments = batch.segments
        if live is not None and not live:  # every request was answered while staged
            return [None] * len(segments)
        key = segments[0][0].key
        size = batch.rows
        try:
            parts = await self._execute_async(*attempt, size, key)
        except Exception as exc:
            plan = self._plan(attempt)
            try:
                attempt = plan.send((None, exc))
                while True:
                    try:
                        outcome: Outcome = (await self._execute_async(*attempt, size, key), None)
                    except Exception as error:
                        outcome = (None, error)
                    attempt = plan.send(outcome)
            except StopIteration as done:
                parts = done.value
        return self._place(segments, live, parts)

    def _plan(self, attempt: Attempt) -> Generator[Attempt, Outcome, list[Any]]:
        """:func:`isolate`'s plan for a batch whose first attempt (all of it) just ran."""
        plan = isolate(*attempt, bisect=self._bisect, note=self._note)
        next(plan)  # the whole batch: already run
        return plan

    def _execute(
        self,
        values: list[Any],
        spans: list[Span] | None,
        rows: int,
        size: int,
        key: Any,
        handoff: Handoff,
        model_fn: Callable[[Any], Any] | None = None,
    ) -> list[Any]:
        """One model call on ``rows`` of a batch of ``size``; the stacking, the call and
        the split are each timed (a split that raises, its time to fail)."""
        started = time.perf_counter()
        batch = self._collator.stack(values, spans)
        stacked = time.perf_counter()
        handoff()  # the previous batch's results go to the loop as this model call begins
        called = time.perf_counter()
        output = call_model(model_fn or self._model_fn, batch)
        return self._split(output, spans, rows, size, key, stacked - started, called)

    async def _execute_async(
        self, values: list[Any], spans: list[Span] | None, rows: int, size: int, key: Any
    ) -> list[Any]:
        started = time.perf_counter()
        batch = self._collator.stack(values, spans)
        called = time.perf_counter()
        output = await self._call_async(batch)
        return self._split(output, spans, rows, size, key, called - started, called)

    def _split(
        self,
        output: Any,
        spans: list[Span] | None,
        rows: int,
        size: int,
        key: Any,
        stacking: float,
        called: float,
    ) -> list[Any]:
        """``output`` split into its rows; the call's times recorded (since ``called``, the
        model's; a split that raises, its time to fail)."""
        returned = time.perf_counter()
        try:
            return self._collator.split(output, spans, rows)
        finally:
            split = time.perf_counter() - returned
            self._record_model_time(size, rows, key, stacking, returned - called, split)

    async def _call_async(self, batch: Any) -> Any:
        """An async model's call, on the loop's thread: a ``SystemExit`` it raises becomes a
        :class:`ModelExit` (a task raising it would stop the loop); ``KeyboardInterrupt``,
        cancellation and ``GeneratorExit`` go on up (see ``_LOOP_CONTROL``)."""
        try:
            return await self._model_fn(batch)
        except (Exception, *_LOOP_CONTROL):
            raise
        except BaseException as exc:  # the model's: SystemExit and the like
            raise ModelExit(error=exc) from exc
