"""Coroutines run on another thread's event loop, handed over and answered in bursts.

:class:`LoopBridge` is how the gRPC thread's calls reach the app's loop: each call's work
is a task there, and its answer comes back to the caller's loop. Calls that pile up while
the other loop is busy go over together, in one wake-up, and their answers come back the
same way, so the app's loop admits them to its batchers in one turn, as it admits REST
requests that arrive together.

Calls marked ``gather`` (inference) are also held back while more are arriving: grpc.aio
accepts one call per completion-queue round trip (one ``request_call`` outstanding), so
200 calls that reached the server together reach its handlers one every 0.1-0.3 ms; handed
over one by one they found an idle batcher each and ran as batches of one. Held until the
calls stop coming (``quiet_s``), ``max_burst`` of them wait, or the first has waited
``max_hold_s``, they reach the batcher together, as REST's do. A call with no other in
flight goes at once: a lone client never waits. Only asyncio and threading: no grpc, no app.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections.abc import Coroutine
from typing import Any, Generic, TypeVar

__all__ = ["MAX_BURST", "MAX_HOLD_S", "QUIET_S", "LoopBridge"]

T = TypeVar("T")

# A burst ends when no call came for this long: several times the 0.1-0.3 ms grpc.aio takes
# per call on a busy core, and the 1 ms resolution of uvloop's (and epoll's) timers.
QUIET_S = 0.001
# No call is held longer than this, however steadily calls keep coming: the latency a
# burst may add, about what grpc.aio takes to accept 32 calls (carpool's default batch).
MAX_HOLD_S = 0.005
# A burst this large goes at once: carpool serve's default max_batch_size (32) twice over.
MAX_BURST = 64


class _Call(Generic[T]):
    """One coroutine on its way to the target loop, and the future its caller awaits."""

    __slots__ = ("body", "future", "task")

    def __init__(self, body: Coroutine[Any, Any, T], future: asyncio.Future[T]) -> None:
        self.body: Coroutine[Any, Any, T] | None = body
        self.future = future
        self.task: asyncio.Task[T] | None = None  # on the target loop, once started


class LoopBridge:
    """Run coroutines from one loop (the caller's, one thread) as tasks on ``target``.

    ``max_burst`` (calls, >= 1), ``quiet_s`` and ``max_hold_s`` (seconds, >= 0) bound how
    long ``gather`` calls are held back (see the module docstring)."""

    def __init__(
        self,
        target: asyncio.AbstractEventLoop,
        *,
        max_burst: int = MAX_BURST,
        quiet_s: float = QUIET_S,
        max_hold_s: float = MAX_HOLD_S,
    ) -> None:
        if max_burst < 1:
            raise ValueError(f"max_burst must be >= 1, got {max_burst}")
        if quiet_s < 0 or max_hold_s < 0:
            raise ValueError(f"quiet_s and max_hold_s must be >= 0, got {quiet_s}, {max_hold_s}")
        self._target = target
        self._max_burst = max_burst
        self._quiet_s = quiet_s
        self._max_hold_s = max_hold_s
        self._lock = threading.Lock()
        self._outbox: list[_Call[Any]] = []  # waiting for the target loop to start them
        self._woken = False  # the target loop was asked to start what the outbox holds
        self._inbox: list[_Call[Any]] = []  # done there, to be answered on the caller's
        self._source: asyncio.AbstractEventLoop | None = None
        # On the caller's loop only:
        self._in_flight = 0  # calls between run()'s start and its end
        self._timer: asyncio.TimerHandle | None = None  # ends the burst being held
        self._first = self._last = 0.0  # monotonic: the burst's first and last arrivals

    async def run(self, body: Coroutine[Any, Any, T], *, gather: bool = False) -> T:
        """``body``'s result, run on the target loop; cancelled, it cancels that task
        (or never starts it). Raises what ``body`` raised. ``gather``: it may be held
        back a little while other calls keep arriving, to go over with them."""
        source = self._source
        if source is None:
            source = self._source = asyncio.get_running_loop()
        call = _Call(body, source.create_future())
        self._in_flight += 1
        try:
            self._hand_over(call, gather)
            try:
                result: T = await call.future
            except asyncio.CancelledError:
                if call.task is not None or call.body is not None:
                    with contextlib.suppress(RuntimeError):  # the target loop is closed
                        self._target.call_soon_threadsafe(self._cancel, call)
                raise
        finally:
            self._in_flight -= 1
        return result

    # ------------------------------------------------------------ on the caller's loop

    def _hand_over(self, call: _Call[Any], gather: bool) -> None:
        with self._lock:
            self._outbox.append(call)
            held, woken = len(self._outbox), self._woken
        if woken:
            return  # it goes with those the target loop is about to start
        if not gather or self._in_flight == 1 or held >= self._max_burst:
            self._wake()
            return
        now = time.monotonic()
        self._last = now
        if self._timer is None:
            self._first = now
            self._timer = self._loop().call_later(self._quiet_s, self._burst_due)

    def _burst_due(self) -> None:
        self._timer = None
        now = time.monotonic()
        quiet_left = self._last + self._quiet_s - now
        hold_left = self._first + self._max_hold_s - now
        if quiet_left > 0 and hold_left > 0:  # calls still coming: wait for the next
            self._timer = self._loop().call_later(min(quiet_left, hold_left), self._burst_due)
        else:
            self._wake()

    def _wake(self) -> None:
        """Ask the target loop to start every call the outbox holds, in one wake-up."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        with self._lock:
            if self._woken or not self._outbox:
                return
            self._woken = True
        self._target.call_soon_threadsafe(self._start_all)

    def _loop(self) -> asyncio.AbstractEventLoop:
        assert self._source is not None  # set by run(), the only way in
        return self._source

    def _answer_all(self) -> None:
        with self._lock:
            calls, self._inbox = self._inbox, []
        for call in calls:
            future, task = call.future, call.task
            assert task is not None
            if future.done():
                continue
            if task.cancelled():
                future.cancel()
            elif (exc := task.exception()) is not None:
                future.set_exception(exc)
            else:
                future.set_result(task.result())

    # ------------------------------------------------------------ on the target loop

    def _start_all(self) -> None:
        with self._lock:
            calls, self._outbox = self._outbox, []
            self._woken = False
        create = self._target.create_task
        for call in calls:
            body, call.body = call.body, None
            if body is None:
                continue
            if call.future.cancelled():
                body.close()
                continue
            call.task = create(body)
            call.task.add_done_callback(functools.partial(self._finished, call))

    def _cancel(self, call: _Call[Any]) -> None:
        body, call.body = call.body, None
        if body is not None:
            body.close()  # cancelled before it started
        elif call.task is not None:
            call.task.cancel()

    def _finished(self, call: _Call[Any], task: asyncio.Task[Any]) -> None:
        with self._lock:
            self._inbox.append(call)
            first = len(self._inbox) == 1
        if first and self._source is not None:
            with contextlib.suppress(RuntimeError):  # the caller's loop is gone: no one waits
                self._source.call_soon_threadsafe(self._answer_all)
