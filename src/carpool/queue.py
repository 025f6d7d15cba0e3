"""WHO waits, in WHAT order: a bounded queue of rows by priority, then arrival, per shape.

Pure: no event loop, no clock (arrival times are given), no futures. Lower ``priority``
values are served first (Triton's priority levels, Unix nice); within a level requests keep
their arrival order. Requests whose collation keys differ (different shapes or dtypes) are
kept apart, and a batch only ever holds one key.

Removal (cancellation, deadline) is O(1): the entry is marked and skipped later, while the
row counts that admission and policies read are updated at once. A multi-row request that
does not fit the batch being formed gives the rows that fit and keeps its place at the head
for the rest, so order is never lost (unlike re-queueing at the tail).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Hashable
from typing import Any

from carpool.errors import QueueFull

__all__ = ["Entry", "RequestQueue", "Segment"]


class Entry:
    """One request in the queue: ``rows`` rows, of which ``taken`` already left in batches."""

    __slots__ = ("arrival", "key", "priority", "queued", "rows", "seq", "span", "taken", "value")

    def __init__(
        self,
        value: Any,
        span: int | None,
        key: Hashable,
        priority: int,
        arrival: float,
    ) -> None:
        self.value = value
        self.span = span  # None: one row without a batch axis; k: k rows along axis 0
        self.rows = 1 if span is None else span
        self.key = key
        self.priority = priority
        self.arrival = arrival
        self.seq = 0
        self.taken = 0
        self.queued = False


# (entry, first row, end row) of an entry's share in one batch.
Segment = tuple[Entry, int, int]


class RequestQueue:
    """Bounded by rows (``max_rows=None``: unbounded)."""

    def __init__(self, max_rows: int | None = None) -> None:
        self.max_rows = max_rows
        self.rows = 0  # live rows queued, all keys
        self._seq = 0
        self._levels: dict[int, dict[Hashable, deque[Entry]]] = {}
        self._priorities: list[int] = []  # sorted keys of _levels
        self._key_rows: dict[Hashable, int] = {}
        self._level_rows: dict[int, int] = {}  # live rows by priority level

    def __len__(self) -> int:
        return self.rows

    @property
    def pushed(self) -> int:
        """Entries ever admitted."""
        return self._seq

    def push(self, entry: Entry) -> None:
        """Queue all of ``entry``'s rows, or raise :class:`QueueFull` and queue none."""
        rows = entry.rows
        if self.max_rows is not None and self.rows + rows > self.max_rows:
            raise QueueFull(max_queue_size=self.max_rows, queued=self.rows, rows=rows)
        self._seq = seq = self._seq + 1
        entry.seq = seq
        entry.queued = True
        key = entry.key
        try:
            lane = self._levels[entry.priority][key]
        except KeyError:
            lane = self._new_lane(entry.priority, key)
        lane.append(entry)
        self.rows += rows
        key_rows = self._key_rows
        key_rows[key] = key_rows.get(key, 0) + rows
        level_rows = self._level_rows
        level_rows[entry.priority] = level_rows.get(entry.priority, 0) + rows

    def _new_lane(self, priority: int, key: Hashable) -> deque[Entry]:
        level = self._levels.get(priority)
        if level is None:
            level = self._levels[priority] = {}
            bisect.insort(self._priorities, priority)
        lane = level[key] = deque()
        return lane

    def remove(self, entry: Entry) -> bool:
        """Withdraw the rows of ``entry`` not yet dispatched; False if none were queued."""
        if not entry.queued:
            return False
        entry.queued = False
        left = entry.rows - entry.taken
        self.rows -= left
        self._release(entry.key, left)
        if self._level_less(entry.priority, left):
            self._drop_level(entry.priority)
        return True

    def _level_less(self, priority: int, rows: int) -> bool:
        """``rows`` fewer live rows at ``priority``; True when none is left there."""
        left = self._level_rows[priority] - rows
        if left:
            self._level_rows[priority] = left
            return False
        del self._level_rows[priority]
        return True

    def _drop_level(self, priority: int) -> None:
        """Forget a level with no live rows (what its lanes still hold was withdrawn or
        taken): a priority value is not kept for ever once its requests are gone."""
        if self._levels.pop(priority, None) is not None:
            self._priorities.remove(priority)

    def rows_ahead(self, priority: int) -> int:
        """Rows queued that are served before a new request of ``priority`` (its level and
        the more urgent ones: FIFO within a level)."""
        return sum(rows for level, rows in self._level_rows.items() if level <= priority)

    def _release(self, key: Hashable, rows: int) -> None:
        left = self._key_rows[key] - rows
        if left:
            self._key_rows[key] = left
        else:
            del self._key_rows[key]

    def head(self) -> Entry | None:
        """The entry served next: most urgent priority, then earliest arrival."""
        for priority in list(self._priorities):
            level = self._levels[priority]
            best: Entry | None = None
            for key in list(level):
                lane = level[key]
                while lane and not lane[0].queued:
                    lane.popleft()
                if not lane:
                    del level[key]
                elif best is None or lane[0].seq < best.seq:
                    best = lane[0]
            if best is not None:
                return best
            del self._levels[priority]
            self._priorities.remove(priority)
        return None

    def head_of_full(self, max_rows: int) -> Entry | None:
        """The first entry of the most urgent key with ``max_rows`` rows queued, if any."""
        full = [key for key, rows in self._key_rows.items() if rows >= max_rows]
        if not full:
            return None
        best: Entry | None = None
        for priority in self._priorities:
            for key in full:
                lane = self._levels[priority].get(key)
                entry = next((e for e in lane if e.queued), None) if lane else None
                if entry is not None and (best is None or entry.seq < best.seq):
                    best = entry
            if best is not None:
                return best
        return None

    def has_full(self, max_rows: int) -> bool:
        """Whether some key has ``max_rows`` rows queued."""
        return any(rows >= max_rows for rows in self._key_rows.values())

    def rows_like(self, entry: Entry) -> int:
        """Rows queued that can share a batch with ``entry`` (its own included)."""
        return self._key_rows.get(entry.key, 0)

    def pop_batch(self, head: Entry, max_rows: int) -> list[Segment]:
        """Up to ``max_rows`` rows of ``head``'s key, in priority then arrival order.

        ``head`` must be what :meth:`head` just returned.
        """
        key = head.key
        segments: list[Segment] = []
        append = segments.append
        room = max_rows
        emptied = []
        for priority in self._priorities:
            if priority < head.priority:
                continue
            lane = self._levels[priority].get(key)
            before = room
            while lane and room:
                entry = lane.popleft()
                if not entry.queued:
                    continue
                if entry.rows == 1:  # the common single-row request
                    append((entry, 0, 1))
                    room -= 1
                    entry.queued = False
                    continue
                start = entry.taken
                stop = min(entry.rows, start + room)
                append((entry, start, stop))
                room -= stop - start
                entry.taken = stop
                if stop == entry.rows:
                    entry.queued = False
                else:  # the rest keeps its place at the head, never re-queued at the tail
                    lane.appendleft(entry)
            if room != before and self._level_less(priority, before - room):
                emptied.append(priority)
            if not room:
                break
        for priority in emptied:
            self._drop_level(priority)
        taken = max_rows - room
        self.rows -= taken
        self._release(key, taken)
        return segments

    def restore(self, segments: list[Segment]) -> None:
        """Put back the rows of a batch just popped, where they were, as if never popped.

        ``segments`` must be what :meth:`pop_batch` returned, less those of entries removed
        since; batches are restored newest first. Nothing else of their keys was popped after
        them, so each entry goes back to the head of its lane (a split request's rest, still
        there, only gets its rows back).
        """
        level_rows = self._level_rows
        key_rows = self._key_rows
        for entry, start, stop in reversed(segments):
            if not entry.queued:
                entry.queued = True
                try:
                    lane = self._levels[entry.priority][entry.key]
                except KeyError:
                    lane = self._new_lane(entry.priority, entry.key)
                lane.appendleft(entry)
            entry.taken = start
            rows = stop - start
            self.rows += rows
            key_rows[entry.key] = key_rows.get(entry.key, 0) + rows
            level_rows[entry.priority] = level_rows.get(entry.priority, 0) + rows

    def drain(self) -> list[Entry]:
        """Remove and return every entry that still has rows queued."""
        entries = [
            entry
            for level in self._levels.values()
            for lane in level.values()
            for entry in lane
            if entry.queued
        ]
        for entry in entries:
            self.remove(entry)
        self._levels.clear()
        self._priorities.clear()
        self._level_rows.clear()
        return entries
