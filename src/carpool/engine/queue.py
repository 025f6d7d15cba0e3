"""WHO waits, in WHAT order: a queue bounded in rows, by priority (lower first), then arrival,
with a lane per collation key. Removal is O(1): marked, skipped later, counts updated at once.
A multi-row request that does not fit gives the rows that fit and keeps its place at the head,
so order is never lost. Pure: no event loop, no clock, no futures."""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Hashable
from typing import Any, Generic, Protocol, TypeAlias, TypeVar

from carpool.collation.tokens import Meter
from carpool.errors import QueueFull

__all__ = ["Q", "Queued", "RequestQueue", "Segment"]


class Queued(Protocol):
    """What the queue reads and writes of a request it holds."""

    value: Any
    span: int | None  # None: one row without a batch axis; k: k rows along axis 0
    rows: int
    key: Hashable  # its collation key: a batch holds one
    priority: int
    arrival: float
    seq: int  # set as it is pushed: its place in arrival order
    taken: int  # rows already left in batches
    queued: bool  # rows of it are still queued
    length: int  # a padded row's length (carpool.collation.tokens); 0: not padded
    tokens: int  # its rows' tokens, when counted


Q = TypeVar("Q", bound=Queued)

# (request, first row, end row) of a request's share in one batch.
Segment: TypeAlias = tuple[Q, int, int]


class RequestQueue(Generic[Q]):
    """Bounded by rows (``max_rows=None``: unbounded)."""

    def __init__(self, max_rows: int | None = None) -> None:
        self.max_rows = max_rows
        self.rows = 0  # live rows queued, all keys
        self._seq = 0
        self._levels: dict[int, dict[Hashable, deque[Q]]] = {}
        self._priorities: list[int] = []  # sorted keys of _levels
        self._key_rows: dict[Hashable, int] = {}
        self._level_rows: dict[int, int] = {}  # live rows by priority level

    def __len__(self) -> int:
        return self.rows

    @property
    def pushed(self) -> int:
        """Entries ever admitted."""
        return self._seq

    def push(self, entry: Q) -> None:
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

    def _new_lane(self, priority: int, key: Hashable) -> deque[Q]:
        level = self._levels.get(priority)
        if level is None:
            level = self._levels[priority] = {}
            bisect.insort(self._priorities, priority)
        lane = level[key] = deque()
        return lane

    def remove(self, entry: Q) -> bool:
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

    def head(self) -> Q | None:
        """The entry served next: most urgent priority, then earliest arrival."""
        for priority in list(self._priorities):
            level = self._levels[priority]
            best: Q | None = None
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

    def head_of_full(self, max_rows: int) -> Q | None:
        """The first entry of the most urgent key with ``max_rows`` rows queued, if any."""
        full = [key for key, rows in self._key_rows.items() if rows >= max_rows]
        if not full:
            return None
        best: Q | None = None
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

    def rows_like(self, entry: Q) -> int:
        """Rows queued that can share a batch with ``entry`` (its own included)."""
        return self._key_rows.get(entry.key, 0)

    def pop_batch(
        self, head: Q, max_rows: int, meter: Meter | None = None, sort_window: int = 0
    ) -> list[Segment[Q]]:
        """Up to ``max_rows`` rows of ``head``'s key, in priority then arrival order, as many
        as ``meter`` (a token budget) lets in.

        With ``sort_window`` and more of ``head``'s level queued than fit, the batch is
        formed from the first ``sort_window`` rows there by length: ``head`` first, then
        those closest to its length (a padded model computes the longest row's length for
        every row). ``head``, the oldest, always goes, so no row waits for ever. ``head``
        must be what :meth:`head` just returned.
        """
        key = head.key
        segments: list[Segment[Q]] = []
        room = max_rows
        emptied = []
        for priority in self._priorities:
            if priority < head.priority:
                continue
            lane = self._levels[priority].get(key)
            before = room
            if lane and sort_window and priority == head.priority and meter is not None:
                room = self._take_by_length(lane, room, meter, sort_window, segments)
            elif lane:
                room = self._take_in_order(lane, room, meter, segments)
            if room != before and self._level_less(priority, before - room):
                emptied.append(priority)
            if not room or (meter is not None and meter.full):
                break
        for priority in emptied:
            self._drop_level(priority)
        taken = max_rows - room
        self.rows -= taken
        self._release(key, taken)
        return segments

    @staticmethod
    def _take_in_order(
        lane: deque[Q], room: int, meter: Meter | None, segments: list[Segment[Q]]
    ) -> int:
        # Rows from the front of ``lane`` while ``room`` (and the meter) allow; a request
        # that does not fit whole gives the rows that fit and keeps its place.
        append = segments.append
        while lane and room:
            entry = lane.popleft()
            if not entry.queued:
                continue
            if entry.rows == 1 and meter is None:  # the common single-row request
                append((entry, 0, 1))
                room -= 1
                entry.queued = False
                continue
            start = entry.taken
            count = min(entry.rows - start, room)
            if meter is not None:
                count = meter.room(entry, count)
                if not count:  # the budget is spent: the batch is full
                    lane.appendleft(entry)
                    meter.full = True
                    break
                meter.add(entry, count)
            append((entry, start, start + count))
            room -= count
            entry.taken = start + count
            if entry.taken == entry.rows:
                entry.queued = False
            else:  # the rest keeps its place at the head, never re-queued at the tail
                lane.appendleft(entry)
        return room

    @staticmethod
    def _take_by_length(
        lane: deque[Q], room: int, meter: Meter, window: int, segments: list[Segment[Q]]
    ) -> int:
        # The first ``window`` rows of ``lane`` by closeness of length to the first one's;
        # in order if they all fit anyway.
        candidates: list[Q] = []
        queued = 0
        for entry in lane:
            if entry.queued:
                candidates.append(entry)
                queued += entry.rows - entry.taken
                if queued >= window:
                    break
        if queued <= room:
            return RequestQueue._take_in_order(lane, room, meter, segments)
        first = candidates[0].length
        order = sorted(candidates[1:], key=lambda e: (abs(e.length - first), e.seq))
        for entry in (candidates[0], *order):
            start = entry.taken
            count = meter.room(entry, min(entry.rows - start, room))
            if not count:
                continue  # a longer one would not fit; a shorter one still may
            meter.add(entry, count)
            segments.append((entry, start, start + count))
            room -= count
            entry.taken = start + count
            if entry.taken == entry.rows:
                entry.queued = False
            if not room:
                break
        meter.full = True  # formed from a deeper queue: as full as it gets
        live = [entry for entry in lane if entry.queued]  # the rest, in arrival order
        lane.clear()
        lane.extend(live)
        return room

    def rows_fitting(self, head: Q, max_rows: int, meter: Meter) -> int:
        """How many rows of ``head``'s key, in order, ``meter``'s budget and ``max_rows``
        let into one batch (a dry run: nothing is taken; ``meter`` is filled)."""
        room = max_rows
        for priority in self._priorities:
            if priority < head.priority:
                continue
            lane = self._levels[priority].get(head.key)
            for entry in lane or ():
                if not entry.queued:
                    continue
                count = meter.room(entry, min(entry.rows - entry.taken, room))
                if not count:
                    meter.full = True
                    return max_rows - room
                meter.add(entry, count)
                room -= count
                if not room:
                    return max_rows
        return max_rows - room

    def restore(self, segments: list[Segment[Q]]) -> None:
        """Put back the rows of a batch just popped, where they were, as if never popped.

        ``segments`` must be what :meth:`pop_batch` returned, less those of entries removed
        since; batches are restored newest first. Nothing else of their keys was popped after
        them, so each entry goes back to the head of its lane (a split request's rest, still
        there, only gets its rows back).
        """
        level_rows = self._level_rows
        key_rows = self._key_rows
        for entry, start, stop in sorted(segments, key=lambda s: s[0].seq, reverse=True):
            if not entry.queued:
                entry.queued = True
                try:
                    lane = self._levels[entry.priority][entry.key]
                except KeyError:
                    lane = self._new_lane(entry.priority, entry.key)
                _put_back(lane, entry)
            entry.taken = start
            rows = stop - start
            self.rows += rows
            key_rows[entry.key] = key_rows.get(entry.key, 0) + rows
            level_rows[entry.priority] = level_rows.get(entry.priority, 0) + rows

    def drain(self) -> list[Q]:
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


def _put_back(lane: deque[Q], entry: Q) -> None:
    """``entry`` back into ``lane`` in arrival order: at the front, unless a batch formed
    by length left older entries there."""
    if not lane or lane[0].seq > entry.seq:
        lane.appendleft(entry)
        return
    at = next((i for i, other in enumerate(lane) if other.seq > entry.seq), len(lane))
    lane.insert(at, entry)
