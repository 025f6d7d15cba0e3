"""The thread bridge: run an async context manager on a private event loop in a thread.

``with Batcher(...)`` is this facade over the one async engine (no second implementation):
the loop thread enters ``async with batcher`` and parks until :meth:`LoopThread.stop`; other
threads talk to the batcher through ``submit()``, which crosses into that loop.
"""

from __future__ import annotations

import asyncio
import threading
from contextlib import AbstractAsyncContextManager
from typing import Any

__all__ = ["LoopThread"]


class LoopThread:
    """Owns one daemon thread running one event loop for the life of ``target``."""

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

    def stop(self) -> None:
        """Leave ``target`` (it drains), end the loop and join the thread; idempotent."""
        loop, stop, thread = self._loop, self._stop, self._thread
        if thread is None:
            return
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
