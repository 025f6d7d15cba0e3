"""WHO gets the next free slot: sequences wait by priority (lower first), then arrival, in a
bounded queue; a new one goes to the replica with the most free slots, or waits for one.

Thread-safe (one lock); lanes take their joiners at the start of each step.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable

from carpool.errors import BatcherClosed, QueueFull
from carpool.steps.stream import StepSequence

__all__ = ["Slots"]


class Slots:
    """The waiting sequences and each lane's load (sequences aboard or on their way)."""

    def __init__(
        self, name: str, lanes: int, max_sequences: int, max_queue_size: int | None
    ) -> None:
        self.name = name
        self.max_sequences = max_sequences
        self.max_queue_size = max_queue_size
        self.waiting = 0
        self.closed: str | None = None  # why it takes no more
        self._lock = threading.Lock()
        self._heap: list[tuple[int, int, StepSequence]] = []
        self._deadlines: list[tuple[float, int, StepSequence]] = []
        self._load = [0] * lanes
        self._inbox: list[list[StepSequence]] = [[] for _ in range(lanes)]
        self._wake: list[Callable[[], None]] = [lambda: None] * lanes

    def attach(self, lane: int, wake: Callable[[], None]) -> None:
        self._wake[lane] = wake

    def free_slots(self) -> int:
        return sum(self.max_sequences - load for load in self._load)

    def active(self) -> int:
        return sum(self._load)

    def admit(self, seq: StepSequence) -> None:
        """Give ``seq`` a lane or a place in the queue; raise when closed or full."""
        with self._lock:
            if self.closed is not None:
                raise BatcherClosed(self.name, self.closed)
            lane = max(range(len(self._load)), key=lambda i: -self._load[i])
            if not self._heap and self._load[lane] < self.max_sequences:
                self._load[lane] += 1
                seq.lane = lane
                self._inbox[lane].append(seq)
                wake = self._wake[lane]
            else:
                if self.max_queue_size is not None and self.waiting >= self.max_queue_size:
                    raise QueueFull(max_queue_size=self.max_queue_size, queued=self.waiting, rows=1)
                self.waiting += 1
                heapq.heappush(self._heap, (seq.priority, seq.sid, seq))
                if seq.deadline is not None:
                    heapq.heappush(self._deadlines, (seq.deadline, seq.sid, seq))
                wake = self._wake_any
        wake()

    def release(self, lane: int, left: int) -> None:
        """``left`` sequences of ``lane`` left: their slots are free."""
        if left:
            with self._lock:
                self._load[lane] -= left

    def take(self, lane: int) -> tuple[list[StepSequence], list[StepSequence]]:
        """At a step's start: the sequences that join ``lane`` (those routed to it, then the
        best waiting ones, up to its free slots), and those routed to it but cancelled."""
        with self._lock:
            joins, self._inbox[lane] = self._inbox[lane], []
            gone = [seq for seq in joins if seq.cancelled]
            self._load[lane] -= len(gone)
            joins = [seq for seq in joins if not seq.cancelled]
            while self._heap and self._load[lane] < self.max_sequences:
                _, _, seq = heapq.heappop(self._heap)
                if seq.cancelled or seq.done:
                    continue  # counted out of waiting when it was cancelled or expired
                self.waiting -= 1
                self._load[lane] += 1
                seq.lane = lane
                joins.append(seq)
            return joins, gone

    def expired(self, now: float) -> list[StepSequence]:
        """Waiting sequences whose deadline passed: out of the queue, for the caller to fail."""
        gone = []
        with self._lock:
            while self._deadlines and self._deadlines[0][0] <= now:
                _, _, seq = heapq.heappop(self._deadlines)
                if seq.lane is None and not seq.cancelled and not seq.done:
                    seq.done = True
                    self.waiting -= 1
                    gone.append(seq)
        return gone

    def withdraw(self, seq: StepSequence) -> bool:
        """A cancelled sequence: out of the queue when it still waits (True), else its lane
        is woken to free its slot."""
        with self._lock:
            lane = seq.lane
            if lane is None and not seq.done:
                self.waiting -= 1
                return True
        if lane is not None:
            self._wake[lane]()
        return False

    def close(self, reason: str) -> list[StepSequence]:
        """Take no more; the waiting sequences, out of the queue, for the caller to fail."""
        with self._lock:
            self.closed = reason
            gone = [seq for _, _, seq in self._heap if not seq.cancelled and not seq.done]
            self._heap.clear()
            self._deadlines.clear()
            self.waiting = 0
        for wake in self._wake:
            wake()
        return gone

    def pending(self, lane: int) -> bool:
        """Whether ``lane`` has sequences to take (routed to it, or waiting for any lane)."""
        return bool(self._inbox[lane]) or bool(self._heap)

    def _wake_any(self) -> None:
        for lane, wake in enumerate(self._wake):
            if self._load[lane] < self.max_sequences:
                wake()
