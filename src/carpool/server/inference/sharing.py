"""Identical computations in flight, shared (single flight): the first caller of a key starts the
computation, later callers of that key wait for its outcome. The computation runs in a task
of its own, cancelled only when no caller waits, so each caller withdraws alone. Pure asyncio."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Hashable
from functools import partial
from typing import Any, Generic, TypeVar

__all__ = ["Flights"]

T = TypeVar("T")


class _Flight(Generic[T]):
    """One computation in flight, and a future for each caller still waiting for it."""

    __slots__ = ("task", "waiters")

    def __init__(self, task: asyncio.Task[T]) -> None:
        self.task = task
        self.waiters: list[asyncio.Future[T]] = []


class Flights(Generic[T]):
    """The computations in flight, by key (see the module docstring).

    Each task is owned by its flight: held until done, its outcome always retrieved (handed
    to the callers still waiting, or when nobody is left, retrieved by the flight itself),
    never left to be reported as an exception nobody saw. It ends when its computation does:
    for a model's answer, when the batcher answers, which closing the batcher ensures.
    """

    def __init__(self) -> None:
        self._flights: dict[Hashable, _Flight[T]] = {}

    def __len__(self) -> int:
        return len(self._flights)

    def waiting(self, key: Hashable) -> int:
        """How many callers wait for the computation of ``key`` (0: none is in flight)."""
        flight = self._flights.get(key)
        return 0 if flight is None else len(flight.waiters)

    async def share(
        self, key: Hashable, compute: Callable[[], Coroutine[Any, Any, T]]
    ) -> tuple[T, bool]:
        """The outcome of ``compute()``, or of the computation of ``key`` already in flight,
        and whether this call started it. Raises what the computation raised; cancelling
        this call stops only its own wait (and the computation, if it was the last one)."""
        loop = asyncio.get_running_loop()
        flight = self._flights.get(key)
        started = flight is None
        if flight is None:
            flight = _Flight(loop.create_task(compute()))
            self._flights[key] = flight
            flight.task.add_done_callback(partial(self._landed, key, flight))
        waiter: asyncio.Future[T] = loop.create_future()  # its own: a cancel stops only it
        flight.waiters.append(waiter)
        try:
            return await waiter, started
        except asyncio.CancelledError:
            flight.waiters.remove(waiter)
            if not flight.waiters and not flight.task.done():
                self._forget(key, flight)  # a caller that comes now starts afresh
                flight.task.cancel()
            raise

    def _landed(self, key: Hashable, flight: _Flight[T], task: asyncio.Task[T]) -> None:
        """The computation ended: its outcome to every caller still waiting."""
        self._forget(key, flight)
        cancelled = task.cancelled()
        error = None if cancelled else task.exception()  # retrieved, whoever is left
        for waiter in flight.waiters:
            if waiter.done():  # its caller was cancelled in this very turn
                continue
            if cancelled:
                waiter.cancel()
            elif error is not None:
                waiter.set_exception(error)
            else:
                waiter.set_result(task.result())

    def _forget(self, key: Hashable, flight: _Flight[T]) -> None:
        if self._flights.get(key) is flight:
            del self._flights[key]
