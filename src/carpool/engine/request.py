"""A request as the engine holds it, and how it gets exactly one outcome. :class:`Resolver`
answers requests (their rows, an error, a deadline, a withdrawal) and *claims* a batch as a
worker starts it: after that moment, ordered by a lock against deadlines, cancels and
re-forming, its requests count as running and cannot go back to the queue."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from carpool.collation.collate import Collator
from carpool.engine.blocking import FUTURE_DONE, settle
from carpool.engine.failure import Failure
from carpool.engine.inflight import Batch
from carpool.engine.queue import RequestQueue, Segment
from carpool.engine.stats import StatsRecorder
from carpool.errors import BatcherClosed, DeadlineExceeded

__all__ = ["Request", "Resolver"]

_monotonic = time.monotonic  # the batcher's clock


class Request:
    """What the queue holds of a request (:class:`~carpool.engine.queue.Queued`) plus what it
    takes to answer its caller exactly once."""

    __slots__ = (
        "arrival",
        "deadline",
        "future",
        "key",
        "length",
        "pending",
        "pieces",
        "priority",
        "queued",
        "rows",
        "running",
        "seq",
        "span",
        "taken",
        "timer",
        "tokens",
        "value",
    )

    def __init__(
        self, value: Any, span: int | None, key: Any, priority: int, arrival: float, future: Any
    ) -> None:
        # What the queue reads and writes (carpool.engine.queue.Queued).
        self.value = value
        self.span = span  # None: one row without a batch axis; k: k rows along axis 0
        self.rows = 1 if span is None else span
        self.key = key
        self.priority = priority
        self.arrival = arrival
        self.seq = 0
        self.taken = 0
        self.queued = False
        self.length = 0  # a padded row's length (carpool.collation.tokens); 0: not padded
        self.tokens = 0  # its rows' tokens, when counted
        # asyncio.Future (infer) or concurrent.futures.Future (submit); None once answered,
        # which also breaks the cycle between a submit future and its request.
        self.future = future
        self.running = False  # some of its rows reached the model
        self.timer: asyncio.TimerHandle | None = None
        self.pending = self.rows  # rows whose output has not come back yet
        self.pieces: list[tuple[int, Any]] | None = None  # outputs of a split request
        self.deadline = math.inf  # what a deadline-aware policy plans for


class Resolver:
    """Gives every accepted request of one batcher its one outcome."""

    def __init__(
        self,
        queue: RequestQueue[Request],
        stats: StatsRecorder,
        collator: Collator,
        *,
        name: str,
        wake: Callable[[], None],
    ) -> None:
        self._queue = queue
        # Tells the scheduler the queue's head may have changed (a withdrawn request).
        self._wake = wake
        self._stats = stats
        self._collator = collator
        self._name = name
        # Orders a batch starting in a worker thread against a deadline, a cancel or a
        # re-forming on the loop: a request is either withdrawn before its rows run or
        # reported as running, and a batch either goes back to the queue or starts.
        self._lock = threading.Lock()

    # ------------------------------------------------------------ batches

    def claim(self, batch: Batch[Request]) -> list[int] | None:
        """As ``batch`` starts, from the thread starting it: mark its requests running; the
        indices of the segments still unanswered, or None when all are (the common case).
        A batch re-formed meanwhile claims none: ``[]``."""
        with self._lock:
            if batch.void:
                return []
            batch.started = _monotonic()
            segments = batch.segments
            for request, _, _ in segments:
                if request.future is None:
                    break
                request.running = True
            else:
                return None
            live = []
            for i, (request, _, _) in enumerate(segments):
                if request.future is not None:
                    request.running = True
                    live.append(i)
            return live

    def void(self, batch: Batch[Request]) -> bool:
        """Cancel ``batch`` if it has not started, so that its rows can go back to the
        queue; False if a worker claimed it first."""
        with self._lock:
            if batch.started is not None:
                return False
            batch.void = True
            return True

    def deliver(self, segments: list[Segment[Request]], parts: list[Any]) -> None:
        """Hand each segment's part (its rows' outputs, a :class:`Failure`, or None for a
        segment declined at the claim) to its request."""
        completed = 0
        for (request, start, stop), part in zip(segments, parts, strict=True):
            fut = request.future
            if fut is None:  # cancelled or expired meanwhile
                continue
            if part.__class__ is Failure:
                self.answer(request, None, part.error)
            elif request.span is None or (start == 0 and stop == request.rows):
                # answer() inlined: this loop runs once per row of every batch
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

    def fail(self, requests: Iterable[Request], error: BaseException) -> None:
        """Each of ``requests`` (of a batch that could not run, or still queued as the
        engine stops) gets ``error``; a cancelled batch's get :class:`BatcherClosed`."""
        if isinstance(error, asyncio.CancelledError):
            error = BatcherClosed(self._name, "was cancelled")
        for request in requests:
            self.answer(request, None, error)

    def _gather(self, request: Request, start: int, stop: int, part: Any) -> None:
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
            self.answer(request, None, exc)
            return
        request.pieces = None
        self.answer(request, value, None)

    # ------------------------------------------------------------ one request

    def answer(self, request: Request, value: Any, error: BaseException | None) -> None:
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

    def expire(self, request: Request, timeout_ms: float) -> None:
        """Its timeout passed: :class:`DeadlineExceeded`, saying whether it was running."""
        with self._lock:
            fut = request.future
            if fut is None:
                return
            request.future = None
            stage = "running" if request.running else "queued"
        if self._queue.remove(request):
            self._wake()
        self._stats.expired += 1
        settle(fut, None, DeadlineExceeded(timeout_ms=timeout_ms, stage=stage))

    def cancel(self, request: Request) -> None:
        """Its caller cancelled: withdraw what is left of it, with no outcome to give."""
        with self._lock:
            if request.future is None:
                return
            request.future = None
        if request.timer is not None:
            request.timer.cancel()
        if self._queue.remove(request):
            self._wake()
        self._stats.cancelled += 1
