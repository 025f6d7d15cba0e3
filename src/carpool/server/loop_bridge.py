"""Coroutines run on another thread's event loop, handed over and answered in bursts.

:class:`LoopBridge` is how the gRPC thread's calls reach the app's loop: each call's work
is a task there, and its answer comes back to the caller's loop. Calls that pile up while
the other loop is busy go over together, in one wake-up, and their answers come back the
same way, so the app's loop admits them to its batchers in one turn, as it admits REST
requests that arrive together. Only asyncio and threading: no grpc, no app.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Coroutine
from typing import Any, Generic, TypeVar

__all__ = ["LoopBridge"]

T = TypeVar("T")


class _Call(Generic[T]):
    """One coroutine on its way to the target loop, and the future its caller awaits."""

    __slots__ = ("body", "future", "task")

    def __init__(self, body: Coroutine[Any, Any, T], future: asyncio.Future[T]) -> None:
        self.body: Coroutine[Any, Any, T] | None = body
        self.future = future
        self.task: asyncio.Task[T] | None = None  # on the target loop, once started


class LoopBridge:
    """Run coroutines from one loop (the caller's, one thread) as tasks on ``target``."""

    def __init__(self, target: asyncio.AbstractEventLoop) -> None:
        self._target = target
        self._lock = threading.Lock()
        self._outbox: list[_Call[Any]] = []  # waiting for the target loop to start them
        self._inbox: list[_Call[Any]] = []  # done there, to be answered on the caller's
        self._source: asyncio.AbstractEventLoop | None = None

    async def run(self, body: Coroutine[Any, Any, T]) -> T:
        """``body``'s result, run on the target loop; cancelled, it cancels that task
        (or never starts it). Raises what ``body`` raised."""
        source = self._source
        if source is None:
            source = self._source = asyncio.get_running_loop()
        call = _Call(body, source.create_future())
        with self._lock:
            self._outbox.append(call)
            first = len(self._outbox) == 1
        if first:
            self._target.call_soon_threadsafe(self._start_all)
        try:
            result: T = await call.future
        except asyncio.CancelledError:
            if call.task is not None or call.body is not None:
                with contextlib.suppress(RuntimeError):  # the target loop is closed
                    self._target.call_soon_threadsafe(self._cancel, call)
            raise
        return result

    # ------------------------------------------------------------ on the target loop

    def _start_all(self) -> None:
        with self._lock:
            calls, self._outbox = self._outbox, []
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

    # ------------------------------------------------------------ on the caller's loop

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
