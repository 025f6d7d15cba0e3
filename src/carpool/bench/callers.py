"""Closed-loop callers for a benchmark that reaches its target itself (a ``Batcher``'s ``infer``,
a Ray Serve handle, its own HTTP session). :func:`closed_window` runs them through a warm-up
and a timed window, :func:`closed_requests` sends a fixed number; ``send(i)`` is the caller's,
and an exception it raises ends the run. Nothing prints."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from carpool.bench.loops import ShareTally, run_share, sleep_until
from carpool.bench.plan import Share, Timing, clock
from carpool.bench.targets.base import Send

__all__ = ["Window", "closed_requests", "closed_window"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Window(Generic[T]):
    """What :func:`closed_window` measured. ``tally.answered``: the successful answers that
    arrived in the window, whenever they were sent; ``tally.latencies``: of the requests
    sent in it and answered before it closed."""

    tally: ShareTally
    seconds: float  # on the clock, from the read as the window opened to the one as it closed
    opened: T  # what ``read()`` returned as the window opened
    closed: T  # ... and as it closed

    @property
    def answered_per_s(self) -> float:
        """Successful answers per second of the window."""
        return self.tally.answered / self.seconds


async def closed_window(
    send: Send, *, callers: int, warmup_s: float, seconds: float, read: Callable[[], T]
) -> Window[T]:
    """``callers`` closed-loop callers for ``warmup_s`` (not measured), then a window of
    ``seconds``; ``read()`` is called as the window opens and as it closes. Returns once
    every caller's last request is answered: a caller sends nothing after the window."""
    if callers < 1:
        raise ValueError(f"callers must be >= 1, got {callers}")
    if warmup_s < 0 or seconds <= 0:
        raise ValueError(f"warmup_s must be >= 0 and seconds > 0, got {warmup_s}, {seconds}")
    start = clock()
    timing = Timing(start, start + warmup_s, start + warmup_s + seconds)
    tally = ShareTally()
    reads: list[tuple[float, T]] = []

    async def edges() -> None:
        for when in (timing.window, timing.end):
            assert when is not None  # a window with an end: set just above
            await sleep_until(when)
            reads.append((clock(), read()))

    async with asyncio.TaskGroup() as group:
        group.create_task(edges())
        await run_share(send, Share(concurrency=callers), timing, tally)
    (opened_at, opened), (closed_at, closed) = reads
    return Window(tally, closed_at - opened_at, opened, closed)


async def closed_requests(send: Send, *, callers: int, requests: int) -> tuple[ShareTally, float]:
    """``requests`` requests in all, ``send(0)`` to ``send(requests - 1)``, by ``callers``
    closed-loop callers; the tally of them all and the seconds until the last answer."""
    if callers < 1 or requests < 0:
        raise ValueError(f"callers must be >= 1 and requests >= 0, got {callers}, {requests}")
    tally = ShareTally()
    start = clock()
    share = Share(concurrency=callers, requests=requests)
    await run_share(send, share, Timing(start, start, None), tally)
    return tally, clock() - start
