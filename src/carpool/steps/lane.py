"""One replica's loop, on a thread of its own: every step, the cancelled and expired leave,
the next sequences in line join, one tick runs on the replica, and each output goes to
its caller at once. A replica that dies ends the sequences it held, with its error."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from carpool.errors import BatcherClosed, DeadlineExceeded
from carpool.steps.replica import StepReport, Tick
from carpool.steps.slots import Slots
from carpool.steps.stats import StepStats
from carpool.steps.stream import StepSequence, Wakeups

__all__ = ["Lane"]


class Lane:
    """Drives one replica through ``call(tick) -> StepReport`` until stopped."""

    def __init__(
        self,
        index: int,
        slots: Slots,
        call: Callable[[Tick], StepReport],
        *,
        step_tokens: int | None,
        stats: StepStats,
        name: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.index = index
        self.active: dict[int, StepSequence] = {}
        self._slots = slots
        self._call = call
        self._budget = step_tokens
        self._stats = stats
        self._clock = clock
        self._wake = threading.Event()
        self._stopping = False
        self._cut_at: float | None = None  # draining: sequences still aboard then end
        slots.attach(index, self._wake.set)
        self._thread = threading.Thread(target=self._run, name=f"{name}_steps_{index}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, cut_at: float) -> None:
        """Finish what is aboard until ``cut_at`` (``time.monotonic``), then end the rest."""
        self._cut_at = cut_at
        self._stopping = True
        self._wake.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            if not self.active and not self._slots.pending(self.index):
                if self._stopping:
                    return
                self._wake.wait()
                self._wake.clear()
                continue
            self.tick()

    def tick(self) -> None:
        now = self._clock()
        wakeups = Wakeups()
        for seq in self._slots.expired(now):
            self._stats.expired += 1
            seq.end(DeadlineExceeded(timeout_ms=seq.timeout_ms or 0, stage="queued"), wakeups)
        leaves = self._leaving(now, wakeups)
        self._slots.release(self.index, len(leaves))
        joins, gone = self._slots.take(self.index)
        for seq in gone:
            seq.end(None, wakeups)
        self._stats.cancelled += len(gone)
        for seq in joins:
            self.active[seq.sid] = seq
        tick = Tick([(seq.sid, seq.value) for seq in joins], leaves, self._budget)
        started = self._clock()
        try:
            report = self._call(tick)
        except Exception as exc:  # the replica is lost (died, hung, closed): so are its states
            self._slots.release(self.index, len(self.active))
            for seq in self.active.values():
                seq.end(exc, wakeups)
            self._stats.failed += len(self.active)
            self.active.clear()
            wakeups.send()
            return
        ended = self._deliver(report, self._clock(), wakeups)
        wakeups.send()
        self._stats.observe_step(report, self._clock() - started, ended, self.index)
        self._slots.release(self.index, ended)

    def _leaving(self, now: float, wakeups: Wakeups) -> list[int]:
        """Ids to free this step: cancelled, past their deadline, or cut by a drain."""
        cut = self._cut_at is not None and now >= self._cut_at
        leaves = []
        for sid, seq in list(self.active.items()):
            if seq.cancelled:
                seq.end(None, wakeups)
                self._stats.cancelled += 1
            elif cut:
                seq.end(BatcherClosed(self._slots.name, "stopped before it ended"), wakeups)
                self._stats.failed += 1
            elif seq.deadline is not None and now >= seq.deadline:
                seq.end(DeadlineExceeded(timeout_ms=seq.timeout_ms or 0, stage="running"), wakeups)
                self._stats.expired += 1
            else:
                continue
            del self.active[sid]
            leaves.append(sid)
        return leaves

    def _deliver(self, report: StepReport, now: float, wakeups: Wakeups) -> int:
        """Each output to its caller, each ending to its stream; how many sequences left."""
        active, stats = self.active, self._stats
        heard = stats.observer is not None  # the gaps between outputs go to it alone
        for sid, output in report.outputs:
            seq = active[sid]
            if seq.first_output is None:
                seq.first_output = now
                stats.first_output(now - seq.arrival)
            elif heard:
                stats.next_output(now - (seq.last_output or now))
            seq.last_output = now
            seq.outputs += 1
            seq.put(output, wakeups)
        for sid in report.ended:
            active.pop(sid).end(None, wakeups)
        stats.completed += len(report.ended)
        for sid, error in report.failed:
            active.pop(sid).end(_noted(error, sid), wakeups)
        stats.failed += len(report.failed)
        return len(report.ended) + len(report.failed)


def _noted(error: BaseException, sid: int) -> BaseException:
    error.add_note(f"carpool: sequence {sid} failed at a step; the others went on")
    return error
