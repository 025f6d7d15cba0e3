"""The front ends' counts of their answers, in memory the main process shares with them, so a
front end's death cannot take its counts. The region is mapped before anything forks; each
front end adds to its own slot as it answers (no message, no system call), the main process
sums the slots when asked, and a dead front end's replacement counts on in the same slot."""

from __future__ import annotations

import asyncio
import mmap
from collections.abc import Sequence

__all__ = ["PROTOCOLS", "Tallies", "Tally"]

PROTOCOLS = ("http", "openai", "generate", "grpc")  # the labels of /metrics, the servers' own
_STATUSES = 600  # a count per HTTP status, indexed by the status itself
_WORD = 8  # bytes of a count (a signed 64-bit int) and of a sum of seconds (a double)

# Each model's and the server's own answers ({protocol: {status: answers}}), and seconds.
Statuses = dict[str, dict[int, int]]
Totals = tuple[dict[str, tuple[Statuses, float]], Statuses]


class Tallies:
    """The slots of front ends ``1 .. front_ends`` over ``models``, in shared memory.

    Made in the main process before it forks: the front ends inherit the mapping.
    """

    def __init__(self, models: Sequence[str], front_ends: int) -> None:
        if front_ends < 1:
            raise ValueError(f"front_ends must be >= 1, got {front_ends}")
        self.models = tuple(models)
        self.front_ends = front_ends
        self._rows: dict[tuple[str | None, str], int] = {}  # (model, protocol) -> offset
        for owner in (*self.models, None):
            for protocol in PROTOCOLS:
                self._rows[owner, protocol] = len(self._rows) * _STATUSES
        self.counts_per_slot = len(self._rows) * _STATUSES
        counts = front_ends * self.counts_per_slot
        memory = mmap.mmap(-1, (counts + front_ends * len(self.models)) * _WORD)
        self._memory = memory  # anonymous and shared: the front ends forked later share it
        self.counts = memoryview(memory)[: counts * _WORD].cast("q")
        self.seconds = memoryview(memory)[counts * _WORD :].cast("d")

    def offset(self, model: str | None, protocol: str) -> int:
        """Where, in a slot, the counts of ``model``'s answers by ``protocol`` begin."""
        try:
            return self._rows[model, protocol]
        except KeyError:
            raise ValueError(
                f"no counts for model {model!r} by protocol {protocol!r}: the models are "
                f"{list(self.models)}, the protocols {list(PROTOCOLS)} (tallies.PROTOCOLS)"
            ) from None

    def slot(self, front_end: int) -> Tally:
        """Front end ``front_end``'s (numbered from 1) end: what it counts goes there."""
        if not 1 <= front_end <= self.front_ends:
            raise ValueError(f"front_end must be in 1..{self.front_ends}, got {front_end}")
        return Tally(self, front_end - 1)

    def totals(self) -> Totals:
        """Every slot's counts summed: each model's ({protocol: {status: answers}},
        seconds), and the server's own ({protocol: {status: answers}})."""
        size = self.counts_per_slot
        summed = [0] * size
        for slot in range(self.front_ends):
            for index, count in enumerate(self.counts[slot * size : (slot + 1) * size].tolist()):
                if count:
                    summed[index] += count
        by_row: dict[tuple[str | None, str], dict[int, int]] = {}
        for row, start in self._rows.items():
            counts = {s: n for s, n in enumerate(summed[start : start + _STATUSES]) if n}
            if counts:
                by_row[row] = counts
        models = len(self.models)
        seconds = self.seconds.tolist()
        models_now: dict[str, tuple[Statuses, float]] = {}
        for index, name in enumerate(self.models):
            statuses = {p: c for (owner, p), c in by_row.items() if owner == name}
            models_now[name] = (statuses, sum(seconds[index::models]))
        own = {p: c for (owner, p), c in by_row.items() if owner is None}
        return models_now, own


class Tally:
    """One front end's slot. :meth:`record` stages an answer; :meth:`commit` adds what was
    staged to the slot, called by an HTTP connection as an answer's last bytes are written,
    and otherwise (gRPC's, which grpc writes) the loop's next turn does. So what is counted
    is what was sent: a front end killed between a write and its commit loses the count of
    that one answer, a window of microseconds. The batchers' own counts (Triton's
    statistics) also hold answers whose front end died before sending them."""

    def __init__(self, tallies: Tallies, slot: int) -> None:
        self._tallies = tallies
        self._base = slot * tallies.counts_per_slot
        self._models = {name: i for i, name in enumerate(tallies.models)}
        self._seconds_base = slot * len(tallies.models)
        self._offsets: dict[tuple[str | None, str], int] = {}
        self._staged: dict[int, int] = {}  # index in ``counts`` -> answers
        self._staged_seconds: dict[int, float] = {}  # index in ``seconds`` -> seconds
        self._due = False

    def record(self, model: str | None, protocol: str, status: int, seconds: float = 0.0) -> None:
        """One answer of ``model`` (None: the server's own) by ``protocol``, that ended in
        ``status``, after ``seconds`` (its model's successes' time)."""
        offset = self._offsets.get((model, protocol))
        if offset is None:
            offset = self._offsets[model, protocol] = self._base + self._tallies.offset(
                model, protocol
            )
        if not 0 <= status < _STATUSES:
            raise ValueError(f"status must be an HTTP status (< {_STATUSES}), got {status}")
        index = offset + status
        staged = self._staged
        staged[index] = staged.get(index, 0) + 1
        if seconds and model is not None:
            where = self._seconds_base + self._models[model]
            self._staged_seconds[where] = self._staged_seconds.get(where, 0.0) + seconds
        if not self._due:
            self._due = True
            asyncio.get_running_loop().call_soon(self.commit)

    def commit(self) -> None:
        """Add what was staged to the slot, where the main process sees it."""
        self._due = False
        counts = self._tallies.counts
        for index, answers in self._staged.items():
            counts[index] += answers
        self._staged.clear()
        seconds = self._tallies.seconds
        for index, spent in self._staged_seconds.items():
            seconds[index] += spent
        self._staged_seconds.clear()
