"""``@carpool.batch``: write a function over a list, call it with one item; concurrent callers
share calls. An ``async def`` gets one batcher per event loop; a plain function one on a loop
thread of its own, and called on a loop's thread it raises
:class:`~carpool.errors.BlockingCallOnLoop` rather than stall that loop. Decorating checks the
options; the batcher is made on the first call."""

from __future__ import annotations

import asyncio
import functools
import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any

from carpool.collation.collate import Collator, Handler
from carpool.engine.batcher import Batcher
from carpool.engine.options import DEFAULTS, BatcherOptions
from carpool.errors import BlockingCallOnLoop
from carpool.policies.base import Policy
from carpool.runners.threads import is_async_callable

__all__ = ["BatchedFunction", "batch"]


class _ListCollator(Collator):
    """Every item is an opaque row, so the function always receives a plain list."""

    def handler(self, value: Any) -> Handler:
        return self._by_type[list]

    def key(self, value: Any, many: bool = False, field: str = "input") -> Hashable:
        return list


class BatchedFunction:
    """What ``@batch`` returns: call it with one item; ``.batcher_stats()`` to observe it."""

    def __init__(
        self, fn: Callable[..., Any], options: dict[str, Any], is_async: bool | None = None
    ) -> None:
        functools.update_wrapper(self, fn)
        self._fn = fn
        self._options = options
        self._is_async = is_async_callable(fn) if is_async is None else is_async
        self._lock = threading.Lock()
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Batcher]
        self._by_loop = weakref.WeakKeyDictionary()
        self._threaded: Batcher | None = None
        self._bound: weakref.WeakKeyDictionary[Any, BatchedFunction] | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as the function and its options, without the batchers it runs: a class
        shipped by value to other processes (Ray Serve replicas) gets fresh ones there."""
        return (BatchedFunction, (self._fn, self._options, self._is_async))

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        with self._lock:
            if self._bound is None:
                self._bound = weakref.WeakKeyDictionary()
            bound = self._bound.get(instance)
            if bound is None:
                bound = BatchedFunction(
                    _weak_method(self._fn, instance, self._is_async), self._options, self._is_async
                )
                self._bound[instance] = bound
        return bound

    def __call__(self, item: Any) -> Any:
        if self._is_async:
            return self._batcher_for_loop().infer(item)
        if asyncio._get_running_loop() is not None:  # the fast check: None, not an exception
            raise BlockingCallOnLoop(function=getattr(self._fn, "__qualname__", repr(self._fn)))
        return self._threaded_batcher().submit(item).result()

    def _new_batcher(self) -> Batcher:
        return Batcher(
            self._fn,
            name=getattr(self._fn, "__qualname__", None),
            collator=_ListCollator(),
            **self._options,
        )

    def _batcher_for_loop(self) -> Batcher:
        loop = asyncio.get_running_loop()
        batcher = self._by_loop.get(loop)
        if batcher is None:
            batcher = self._new_batcher()
            batcher._open(loop)  # runs until the loop ends, or until aclose()
            self._by_loop[loop] = batcher
        return batcher

    def _threaded_batcher(self) -> Batcher:
        batcher = self._threaded
        if batcher is None:
            with self._lock:
                batcher = self._threaded
                if batcher is None:
                    # Its loop thread stops itself at exit if close() was not called.
                    batcher = self._new_batcher().__enter__()
                    self._threaded = batcher
        return batcher

    def batcher_stats(self) -> Any:
        """Stats of the batcher serving the current loop (async) or the threads (sync)."""
        batcher = (
            self._threaded if not self._is_async else self._by_loop.get(asyncio.get_running_loop())
        )
        return batcher.stats() if batcher is not None else None

    async def aclose(self) -> None:
        """Drain and stop the batcher of the current event loop (async functions)."""
        batcher = self._by_loop.pop(asyncio.get_running_loop(), None)
        if batcher is not None:
            await batcher.aclose()

    def close(self) -> None:
        """Drain and stop the background batcher (sync functions)."""
        with self._lock:
            batcher, self._threaded = self._threaded, None
        if batcher is not None:
            batcher.close()


def _weak_method(fn: Callable[..., Any], instance: Any, is_async: bool) -> Callable[..., Any]:
    """``fn`` bound to ``instance`` without keeping it alive (its batcher is cached by it)."""
    ref = weakref.ref(instance)

    if is_async:

        async def method_async(items: list[Any]) -> Any:
            return await fn(ref(), items)

        method: Callable[..., Any] = method_async
    else:

        def method(items: list[Any]) -> Any:
            return fn(ref(), items)

    method.__qualname__ = method.__name__ = getattr(fn, "__qualname__", "method")
    return method


def batch(
    fn: Callable[..., Any] | None = None,
    *,
    max_batch_size: int = DEFAULTS.max_batch_size,
    max_wait_ms: float = DEFAULTS.max_wait_ms,
    policy: str | Policy = DEFAULTS.policy,
    max_queue_size: int | None = DEFAULTS.max_queue_size,
    workers: int = DEFAULTS.workers,
    isolate_errors: bool = DEFAULTS.isolate_errors,
) -> Any:
    """Decorate a list -> list function so callers pass one item and get one result.

    Options are those of :class:`carpool.Batcher`. Usable bare (``@batch``) or with options.
    An ``async def`` function is awaited: ``await f(item)``. A plain one is called from
    threads, ``f(item)``, and blocks its caller; on an event loop's thread it raises
    :class:`~carpool.errors.BlockingCallOnLoop` rather than block the loop (await
    ``asyncio.to_thread(f, item)`` there, or make the function ``async def``).
    """
    # Every keyword above, as given: each is the option of BatcherOptions of its name.
    options = {name: value for name, value in locals().items() if name != "fn"}
    BatcherOptions(**options)  # checked now, at decoration: a mistake shows where it is made

    def wrap(f: Callable[..., Any]) -> BatchedFunction:
        if not callable(f):
            raise TypeError(f"@batch decorates a function, got {type(f).__name__}")
        return BatchedFunction(f, options)

    return wrap if fn is None else wrap(fn)
