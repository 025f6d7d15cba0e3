"""What the step loop counts: sequences by how they ended, steps, sequences per step, the
time to a first output and between outputs, the replicas' prompt-state reuse; and the learnt
step cost the adaptive policy reads. Lanes write under one lock; ``snapshot()`` is a
consistent copy; ``observer`` (the server's metrics) hears each step and output as it happens.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from carpool.steps.cost import StepCost
from carpool.steps.model import PrefixCounts
from carpool.steps.replica import StepReport

__all__ = ["StepObserver", "StepSnapshot", "StepStats"]


class StepObserver(Protocol):
    """Hears the loop as it runs (a server's histograms); called from lane threads."""

    def on_step(self, sequences: int, seconds: float) -> None: ...

    def on_first_output(self, seconds: float) -> None: ...

    def on_next_output(self, seconds: float) -> None: ...


@dataclass(frozen=True)
class StepSnapshot:
    """Counts since the start. ``step_sizes``: steps by how many sequences they advanced;
    ``prefixes``: prompt-state reuse summed over the replicas (None: none reuses)."""

    submitted: int
    completed: int
    failed: int
    cancelled: int
    expired: int
    refused: int
    steps: int
    outputs: int
    prefill_tokens: int
    step_seconds: float
    step_sizes: dict[int, int] = field(default_factory=dict)
    first_output_seconds: float = 0.0  # summed over sequences that had one
    first_outputs: int = 0
    prefixes: PrefixCounts | None = None

    @property
    def mean_sequences_per_step(self) -> float:
        steps = sum(self.step_sizes.values())
        return sum(n * c for n, c in self.step_sizes.items()) / steps if steps else 0.0


class StepStats:
    def __init__(self, observer: StepObserver | None = None) -> None:
        self.observer = observer
        self.cost = StepCost()
        self.submitted = self.completed = self.failed = self.cancelled = 0
        self.expired = self.refused = self.steps = self.outputs = self.prefill_tokens = 0
        self.step_seconds = self.first_output_seconds = 0.0
        self.first_outputs = 0
        self._sizes: Counter[int] = Counter()
        self._prefixes: dict[int, PrefixCounts] = {}  # each replica's latest
        self._prefixes_before = PrefixCounts()  # what replicas counted before they restarted
        self._lock = threading.Lock()

    def observe_step(self, report: StepReport, seconds: float, left: int, replica: int = 0) -> None:
        with self._lock:
            if report.prefixes is not None:
                self._observe_prefixes(replica, report.prefixes)
            if report.stepped:
                self.steps += 1
                self._sizes[report.stepped] += 1
            self.outputs += len(report.outputs)
            self.prefill_tokens += report.prefilled
            self.step_seconds += seconds
            self.cost.observe(report.stepped, seconds, left)
        if self.observer is not None and report.stepped:
            self.observer.on_step(report.stepped, seconds)

    def observe_prefixes(self, replica: int, counts: PrefixCounts) -> None:
        with self._lock:
            self._observe_prefixes(replica, counts)

    def _observe_prefixes(self, replica: int, counts: PrefixCounts) -> None:
        """``replica``'s counts now; lower than before, it restarted (a new model counting
        from 0), so what it had counted is kept: the sums never go down."""
        last = self._prefixes.get(replica)
        if last is not None and any(
            now < before for now, before in zip(_fields(counts), _fields(last), strict=True)
        ):
            self._prefixes_before = _plus(self._prefixes_before, last)
        self._prefixes[replica] = counts

    def prefixes(self) -> PrefixCounts | None:
        """Prompt-state reuse summed over the replicas; None when none reuses."""
        with self._lock:
            return self._prefix_sums()

    def _prefix_sums(self) -> PrefixCounts | None:
        if not self._prefixes:
            return None
        total = self._prefixes_before
        for counts in self._prefixes.values():
            total = _plus(total, counts)
        return total

    def first_output(self, seconds: float) -> None:
        self.first_output_seconds += seconds
        self.first_outputs += 1
        if self.observer is not None:
            self.observer.on_first_output(seconds)

    def next_output(self, seconds: float) -> None:
        if self.observer is not None:
            self.observer.on_next_output(seconds)

    def snapshot(self) -> StepSnapshot:
        with self._lock:
            return StepSnapshot(
                submitted=self.submitted,
                completed=self.completed,
                failed=self.failed,
                cancelled=self.cancelled,
                expired=self.expired,
                refused=self.refused,
                steps=self.steps,
                outputs=self.outputs,
                prefill_tokens=self.prefill_tokens,
                step_seconds=self.step_seconds,
                step_sizes=dict(self._sizes),
                first_output_seconds=self.first_output_seconds,
                first_outputs=self.first_outputs,
                prefixes=self._prefix_sums(),
            )


def _fields(counts: PrefixCounts) -> tuple[int, int, int]:
    return counts.hits, counts.reused, counts.computed


def _plus(a: PrefixCounts, b: PrefixCounts) -> PrefixCounts:
    return PrefixCounts(a.hits + b.hits, a.reused + b.reused, a.computed + b.computed)
