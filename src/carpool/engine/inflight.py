"""Batches dispatched and not finished: running, or staged until a worker frees up and still
re-formable. :class:`InFlight` keeps them in dispatch order and picks the staged batches a
more urgent request displaces. Pure bookkeeping: no event loop, no clock, no threads."""

from __future__ import annotations

import math
from typing import Generic

from carpool.engine.queue import Q, Segment

__all__ = ["Batch", "InFlight"]


class Batch(Generic[Q]):
    """One dispatched batch: ``rows`` rows in ``segments``, in priority then arrival order."""

    __slots__ = ("least_urgent", "reason", "rows", "segments", "started", "tokens", "void")

    def __init__(self, segments: list[Segment[Q]], rows: int, reason: str) -> None:
        self.segments = segments
        self.rows = rows
        self.reason = reason
        self.started: float | None = None  # set when a worker claims it
        self.void = False  # re-formed before it started: its rows went back to the queue
        self.tokens = (0, 0)  # computed and real (carpool.collation.tokens), when they are counted
        # The least urgent priority in it (the largest number): segments leave the queue
        # most urgent first.
        self.least_urgent = segments[-1][0].priority


class InFlight(Generic[Q]):
    """Every batch dispatched and not finished, oldest first."""

    def __init__(self) -> None:
        self._batches: dict[int, Batch[Q]] = {}
        # At least the least urgent priority among batches not started: a request more
        # urgent than this may displace one. -inf: none can be displaced.
        self.least_urgent = -math.inf

    def __len__(self) -> int:
        return len(self._batches)

    def add(self, batch: Batch[Q]) -> None:
        self._batches[id(batch)] = batch
        if batch.least_urgent > self.least_urgent:
            self.least_urgent = batch.least_urgent

    def remove(self, batch: Batch[Q]) -> None:
        del self._batches[id(batch)]
        if not self._batches:
            self.least_urgent = -math.inf

    def view(self) -> tuple[tuple[float | None, int], ...]:
        """(start time, or None while staged; rows) of each batch, oldest first."""
        return tuple((batch.started, batch.rows) for batch in self._batches.values())

    def displaced_by(self, priority: int) -> list[Batch[Q]]:
        """The batches not started that a request of ``priority`` should run before, newest
        first: those holding a less urgent row, up to the first newer batch that stays (a
        batch goes back to the queue only with every batch dispatched after it, so a request
        split across batches is never put back with its later rows still out)."""
        displaced = []
        for batch in reversed(self._batches.values()):
            if batch.started is not None or batch.least_urgent <= priority:
                break
            displaced.append(batch)
        self.least_urgent = max(
            (
                batch.least_urgent
                for batch in self._batches.values()
                if batch.started is None and batch not in displaced
            ),
            default=-math.inf,
        )
        return displaced
