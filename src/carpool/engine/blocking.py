"""The thread bridge: :class:`Portal`, the engine's whole synchronous face over its one async
implementation (anyio's ``BlockingPortal`` is the model). It runs the engine's loop in a thread
and hands requests into it from any thread. Imports nothing from carpool."""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import threading
from collections import deque
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

__all__ = [
    "FUTURE_DONE",
    "Inbox",
    "LoopThread",
    "Portal",
    "SubmitFuture",
    "call_on_loop",
    "settle",
]

T = TypeVar("T")


class LoopThread:
    """Owns one daemon thread running one event loop for the life of ``target``.

    A daemon thread, so a forgotten one never keeps the interpreter alive; while it runs, an
    exit handler stops it (``target`` drains) before the interpreter finishes, registered by
    :meth:`start` and removed by :meth:`stop`: nothing is left registered once it stopped.
    """

    def __init__(self, target: AbstractAsyncContextManager[Any], *, name: str) -> None:
        self._target = target
        self._name = name
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None

    def start(self) -> None:
        """Enter ``target`` on the new loop; re-raises here whatever entering raised."""
        self._thread = threading.Thread(target=self._main, name=self._name, daemon=True)
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error
        atexit.register(self.stop)

    def stop(self) -> None:
        """Leave ``target`` (it drains), end the loop and join the thread; idempotent."""
        loop, stop, thread = self._loop, self._stop, self._thread
        if thread is None:
            return
        atexit.unregister(self.stop)
        if loop is not None and stop is not None:
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:  # the loop already ended
                pass
        if thread is not threading.current_thread():
            thread.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:
            self._error = exc
        finally:
            self._started.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with self._target:
            self._started.set()
            await self._stop.wait()


class Portal:
    """The synchronous face of one async engine, for threads without its event loop.

    ``engine`` is an async context manager that, once entered on a loop, calls
    :meth:`bind` with it; ``admit(value, timeout_ms, priority, future)`` queues a handed-over
    request on that loop and ``cancel(request)`` withdraws one. When the engine has ended it
    calls :meth:`shut`, and from then on what is handed over fails with that error.
    """

    def __init__(
        self,
        engine: AbstractAsyncContextManager[Any],
        *,
        name: str,
        admit: Callable[[Any, float | None, int, SubmitFuture], Any],
        cancel: Callable[[Any], None],
    ) -> None:
        self._engine = engine
        self._name = name  # its thread's
        self._inbox = Inbox(admit, cancel)
        self._thread: LoopThread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._shut: BaseException | None = None

    def start(self) -> None:
        """Run the engine on a loop of its own in a new thread until :meth:`stop` (or the
        interpreter's exit); returns once it is entered, re-raising what entering raised."""
        thread = LoopThread(self._engine, name=self._name)
        thread.start()
        self._thread = thread

    def stop(self) -> bool:
        """Leave the engine (it drains) and join its thread; False when the engine does not
        run on a thread of this portal's. Idempotent."""
        if self._thread is None:
            return False
        self._thread.stop()
        return True

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the engine's loop, as it starts: hand requests over to ``loop`` from now on."""
        self._loop = loop
        self._inbox.bind(loop)

    def submit(self, value: Any, timeout_ms: float | None, priority: int) -> SubmitFuture:
        """From any thread: hand a request over; its future has the outcome."""
        fut = self._inbox.put(value, timeout_ms, priority)
        if self._shut is not None:  # ended meanwhile: it may have emptied the inbox already
            self._inbox.reject(self._shut)
        return fut

    def take(self) -> None:
        """On the engine's loop: admit what was handed over so far."""
        self._inbox.take()

    def shut(self, error: BaseException) -> None:
        """The engine ended: fail what waits to be admitted, and whatever comes later."""
        self._shut = error
        self._inbox.reject(error)

    def call(self, fn: Callable[[], T]) -> T | None:
        """From another thread: ``fn()`` run on the engine's loop, or None when the engine
        ends first (or never started)."""
        if self._loop is None:
            return None
        return call_on_loop(self._loop, fn, gone=lambda: self._shut is not None)


class SubmitFuture(concurrent.futures.Future[Any]):
    """The future ``Batcher.submit`` returns: cancelling it withdraws the request.

    A subclass rather than a done-callback on every future: only a real cancel pays, and no
    reference cycle is left for the garbage collector on the hot path.
    """

    def __init__(self, inbox: Inbox) -> None:
        super().__init__()
        self.inbox = inbox
        self.request: Any = None  # the admitted request, set on the loop

    def cancel(self) -> bool:
        cancelled = super().cancel()
        if cancelled:
            self.inbox.withdraw(self)
        return cancelled


class Inbox:
    """Requests handed over from other threads, admitted on the loop in bursts.

    ``put`` appends and wakes the loop only if no wake-up is already on its way, so a burst
    of submits from many threads costs one ``call_soon_threadsafe``, not one each. The loop
    admits with ``admit(value, timeout_ms, priority, future) -> request``; a caller's cancel
    reaches the loop as ``cancel(request)``.
    """

    def __init__(
        self,
        admit: Callable[[Any, float | None, int, SubmitFuture], Any],
        cancel: Callable[[Any], None],
    ) -> None:
        self._admit = admit
        self._cancel = cancel
        self._items: deque[tuple[Any, float | None, int, SubmitFuture]] = deque()
        self._armed = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def put(self, value: Any, timeout_ms: float | None, priority: int) -> SubmitFuture:
        """From any thread. Order matters: append, then arm (see :meth:`take`)."""
        fut = SubmitFuture(self)
        self._items.append((value, timeout_ms, priority, fut))
        if not self._armed:
            self._armed = True
            assert self._loop is not None  # bind() came first
            try:
                self._loop.call_soon_threadsafe(self.take)
            except RuntimeError:  # the loop already ended: nobody will admit it
                self.reject(RuntimeError("the batcher's event loop has ended"))
        return fut

    def take(self) -> None:
        """On the loop: admit everything handed over so far.

        Disarming before draining means a ``put`` that sees the inbox armed has appended
        before this drain, so no request is ever left behind without a wake-up.
        """
        self._armed = False
        items = self._items
        while items:
            value, timeout_ms, priority, fut = items.popleft()
            if fut.cancelled():  # before admission: never queued, never counted
                continue
            try:
                fut.request = self._admit(value, timeout_ms, priority, fut)
            except Exception as exc:
                settle(fut, None, exc)

    def reject(self, error: BaseException) -> None:
        """From any thread: fail everything not yet admitted."""
        items = self._items
        while items:
            try:
                fut = items.popleft()[3]
            except IndexError:  # another thread emptied it first
                return
            settle(fut, None, error)

    def withdraw(self, fut: SubmitFuture) -> None:
        # In the cancelling thread. The loop runs this after any take() under way, so
        # fut.request is set by then if the request was admitted at all.
        if self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._withdraw, fut)
            except RuntimeError:  # the loop is gone, and with it every pending request
                pass

    def _withdraw(self, fut: SubmitFuture) -> None:
        if fut.request is not None:
            self._cancel(fut.request)


def call_on_loop(
    loop: asyncio.AbstractEventLoop, fn: Callable[[], T], *, gone: Callable[[], bool]
) -> T | None:
    """From another thread: ``fn()`` run on ``loop``, or None if the loop stopped first
    (``gone()`` says so, polled while waiting, in case the loop ended before running it)."""
    answer: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run() -> None:
        answer.set_result(fn())

    try:
        loop.call_soon_threadsafe(run)
        while not gone():
            try:
                return answer.result(timeout=0.05)
            except concurrent.futures.TimeoutError:
                continue  # the loop may have stopped before running it
    except RuntimeError:  # the loop is gone
        pass
    return None


# Setting a future the caller already cancelled raises one of these; it is not an error.
FUTURE_DONE = (asyncio.InvalidStateError, concurrent.futures.InvalidStateError)


def settle(fut: Any, value: Any, error: BaseException | None) -> None:
    """Give an asyncio or concurrent future its outcome, unless its caller cancelled it."""
    try:
        if error is None:
            fut.set_result(value)
        else:
            fut.set_exception(error)
    except FUTURE_DONE:
        pass
