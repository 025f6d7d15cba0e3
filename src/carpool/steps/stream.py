"""A sequence's outputs on their way to its caller: ``async for`` or ``for``, either works.

Lanes put outputs from their threads; an event loop is woken at most once per step (once in
all while a wake is still pending), however many of its streams got an output. Dropping or
cancelling a ``Stream`` frees its slot.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Generic, TypeVar

__all__ = ["StepSequence", "Stream", "Wakeups"]

Out = TypeVar("Out")
_END = object()


class StepSequence:
    """The engine's record of one sequence: its input, its place, its timing and its outbox.

    Held by the slots and its lane; the caller holds the :class:`Stream` around it, and
    dropping that stream cancels the sequence."""

    __slots__ = (
        "__weakref__",
        "_cond",
        "_ended",
        "_items",
        "_lock",
        "_waiter",
        "arrival",
        "cancelled",
        "deadline",
        "done",
        "first_output",
        "lane",
        "last_output",
        "on_cancel",
        "outputs",
        "priority",
        "sid",
        "timeout_ms",
        "value",
    )

    def __init__(
        self, sid: int, value: Any, priority: int, timeout_ms: float | None, arrival: float
    ) -> None:
        self.sid = sid
        self.value = value
        self.priority = priority
        self.timeout_ms = timeout_ms
        self.arrival = arrival
        self.deadline = None if timeout_ms is None else arrival + timeout_ms / 1000
        self.lane: int | None = None  # the replica it runs on, once it joined
        self.cancelled = False
        self.done = False  # ended, or taken out to be ended
        self._ended = False
        self.outputs = 0
        self.first_output: float | None = None
        self.last_output: float | None = None
        self.on_cancel: Callable[[StepSequence], None] | None = None
        self._items: deque[Any] = deque()
        self._lock = threading.Lock()
        self._cond: threading.Condition | None = None  # made when a thread first waits
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: Any, wakeups: Wakeups) -> None:
        """From a lane: one output, or the end (``None``: finished, else the error)."""
        with self._lock:
            if self._ended:
                return
            self._items.append(item)
            if self._cond is not None:
                self._cond.notify()
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            wakeups.add(waiter)

    def end(self, error: BaseException | None, wakeups: Wakeups) -> None:
        self.put(_Ending(error), wakeups)
        self._ended = self.done = True

    def cancel(self) -> None:
        """The caller is gone: the lane frees the slot at its next step."""
        if not self.cancelled and not self.done:
            self.cancelled = True
            if self.on_cancel is not None:
                self.on_cancel(self)

    def next_sync(self, timeout: float | None = None) -> Any:
        with self._lock:
            while not self._items:
                if self._cond is None:
                    self._cond = threading.Condition(self._lock)
                if not self._cond.wait(timeout):
                    raise TimeoutError(f"no output within {timeout} s")
            return self._unwrap(self._items.popleft())

    async def next_async(self) -> Any:
        items = self._items
        while True:
            try:  # deque operations are atomic: an output already there needs no lock
                return self._unwrap(items.popleft())
            except IndexError:
                pass
            with self._lock:
                if self._items:
                    return self._unwrap(self._items.popleft())
                loop = asyncio.get_running_loop()
                waiter = self._waiter = loop.create_future()
            await waiter

    def _unwrap(self, item: Any) -> Any:
        if isinstance(item, _Ending):
            self._items.appendleft(item)  # every later read ends too
            if item.error is not None:
                raise item.error
            return _END
        return item


class _Ending:
    __slots__ = ("error",)

    def __init__(self, error: BaseException | None) -> None:
        self.error = error


class Wakeups:
    """Futures to resolve once a step is delivered: one ``call_soon_threadsafe`` per loop,
    none for a loop whose last wake has not run yet (its futures join that one's)."""

    def __init__(self) -> None:
        self._by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}

    def add(self, waiter: asyncio.Future[None]) -> None:
        self._by_loop.setdefault(waiter.get_loop(), []).append(waiter)

    def send(self) -> None:
        for loop, waiters in self._by_loop.items():
            with _pending_lock:
                pending = _pending.get(loop)
                if pending is not None:
                    pending.extend(waiters)
                    continue
                _pending[loop] = waiters
            try:
                loop.call_soon_threadsafe(_wake, loop)
            except RuntimeError:  # that loop is closed: no one waits there any more
                with _pending_lock:
                    _pending.pop(loop, None)
        self._by_loop.clear()


# Each loop's futures whose wake is scheduled and has not run yet.
_pending: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = (
    weakref.WeakKeyDictionary()
)
_pending_lock = threading.Lock()


def _wake(loop: asyncio.AbstractEventLoop) -> None:
    with _pending_lock:
        waiters = _pending.pop(loop, [])
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)


class Stream(Generic[Out]):
    """One sequence's outputs, in order, as its steps deliver them.

    Iterate with ``async for`` (on any event loop) or ``for`` (in any thread); the sequence's
    error, if it fails, is raised where the iteration is. ``cancel()``, ``break`` inside
    ``with stream:``, or dropping the stream frees its slot at the next step."""

    def __init__(self, sequence: StepSequence) -> None:
        self._sequence = sequence
        self._cancel = weakref.finalize(self, sequence.cancel)

    @property
    def id(self) -> int:
        return self._sequence.sid

    @property
    def outputs(self) -> int:
        """Outputs delivered so far."""
        return self._sequence.outputs

    def cancel(self) -> None:
        self._cancel()

    def __enter__(self) -> Stream[Out]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()

    async def __aenter__(self) -> Stream[Out]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cancel()

    def __iter__(self) -> Iterator[Out]:
        return self

    def __next__(self) -> Out:
        item = self._sequence.next_sync()
        if item is _END:
            raise StopIteration
        return item  # type: ignore[no-any-return]

    def __aiter__(self) -> AsyncIterator[Out]:
        return self

    async def __anext__(self) -> Out:
        try:
            item = await self._sequence.next_async()
        except asyncio.CancelledError:
            self.cancel()
            raise
        if item is _END:
            raise StopAsyncIteration
        return item  # type: ignore[no-any-return]

    async def collect(self) -> list[Out]:
        """Every output, once the sequence ends (its error raised if it fails)."""
        return [item async for item in self]

    def collect_sync(self, timeout: float | None = None) -> list[Out]:
        """Every output, from a thread; ``timeout`` bounds each wait for the next one."""
        items: list[Out] = []
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            item = self._sequence.next_sync(left)
            if item is _END:
                return items
            items.append(item)
