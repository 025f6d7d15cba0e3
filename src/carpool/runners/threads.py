"""The worker threads of a plain (synchronous) model, and how their results reach the event loop.
Each thread runs one job at a time; a *courier* thread wakes the loop while the next model call
runs, so the loop's work overlaps the model instead of delaying it (see :class:`ModelThreads`).
Imports nothing from carpool."""

from __future__ import annotations

import asyncio
import inspect
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["Handoff", "ModelThreads", "is_async_callable"]

# A job runs as job(handoff); it calls handoff() right before each model call.
Handoff = Callable[[], None]
_Outcome = tuple["asyncio.Future[Any]", Any, BaseException | None]
T = TypeVar("T")


def is_async_callable(fn: Callable[..., Any]) -> bool:
    """Whether calling ``fn`` gives a coroutine: an ``async def``, or an object whose
    ``__call__`` is one (the way model classes are often written)."""
    call = getattr(fn, "__call__", None)  # noqa: B004 - we want the method, not callable()
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


class ModelThreads:
    """``count`` threads named after ``name``, serving the event loop ``loop``.

    Waking the loop with a result makes it hold the GIL while it answers that batch's callers
    and admits their next requests; a thread with Python still to run before its next model
    call would wait for all of that while the model idles. So a thread whose next job is
    already waiting keeps its result until that job calls ``handoff()``, just before its
    model call, and a *courier* thread wakes the loop once the model call releases the GIL:
    the loop's work overlaps the model call instead of delaying it. With nothing waiting,
    the thread hands its result to the loop at once."""

    def __init__(self, count: int, *, name: str, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._jobs: queue.SimpleQueue[tuple[asyncio.Future[Any], Callable[[Handoff], Any]] | None]
        self._jobs = queue.SimpleQueue()
        self._outbox: queue.SimpleQueue[list[_Outcome] | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}_{i}", daemon=True)
            for i in range(count)
        ]
        self._courier = threading.Thread(target=self._carry, name=f"{name}_courier", daemon=True)
        for thread in [*self._threads, self._courier]:
            thread.start()

    def submit(self, job: Callable[[Handoff], T]) -> asyncio.Future[T]:
        """On the loop: run ``job(handoff)`` in a worker thread; a future of what it returns."""
        future = self._loop.create_future()
        self._jobs.put((future, job))
        return future

    def shutdown(self) -> None:
        """Let each thread finish its job and exit; does not wait for them."""
        for _ in self._threads:
            self._jobs.put(None)
        self._outbox.put(None)

    def join(self, timeout: float) -> bool:
        """After :meth:`shutdown`, from a thread other than the loop's: wait (at most
        ``timeout`` seconds in all) for every thread to exit; whether they all did."""
        deadline = time.monotonic() + timeout
        threads = [*self._threads, self._courier]
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in threads)

    def _work(self) -> None:
        jobs = self._jobs
        done: list[_Outcome] = []  # results this thread holds back for the loop

        def handoff() -> None:
            if done:
                self._outbox.put(done[:])  # releases no GIL: the courier runs once it is free
                done.clear()

        while True:
            if done:
                try:
                    item = jobs.get_nowait()
                except queue.Empty:  # nothing follows: the loop gets the results now
                    self._deliver(done[:])
                    done.clear()
                    item = jobs.get()
            else:
                item = jobs.get()
            if item is None:
                self._deliver(done)
                return
            future, job = item
            try:
                done.append((future, job(handoff), None))
            except BaseException as exc:  # delivered to the awaiting task, like an executor
                done.append((future, None, exc))

    def _carry(self) -> None:
        outbox = self._outbox
        while (outcomes := outbox.get()) is not None:
            self._deliver(outcomes)

    def _deliver(self, outcomes: list[_Outcome]) -> None:
        if not outcomes:
            return
        try:
            self._loop.call_soon_threadsafe(_settle_all, outcomes)
        except RuntimeError:  # the loop has ended; nobody awaits these any more
            pass


def _settle_all(outcomes: list[_Outcome]) -> None:
    for future, result, error in outcomes:
        if future.done():  # its task was cancelled meanwhile
            continue
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
