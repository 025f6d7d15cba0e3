"""Counters and latency samples of one batcher, and the frozen snapshot users read.

Pure: the batcher passes durations in; nothing here reads a clock or knows about metrics
libraries (the server renders Prometheus from :class:`BatcherStats`).
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_left
from collections import Counter, defaultdict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType

from carpool.policies.cost import CostCurve

__all__ = [
    "BatchTimes",
    "BatcherStats",
    "Histogram",
    "HistogramSnapshot",
    "Percentiles",
    "StatsRecorder",
]

# Seconds. Prometheus' default latency buckets, extended down to 100 µs (batching overhead
# and small models live there) and up to 60 s (queueing under overload).
LATENCY_BOUNDS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip

# Percentiles are over the most recent samples: enough for a stable p99 (~80 samples beyond
# it), small enough that a snapshot sorts in well under a millisecond.
SAMPLE_WINDOW = 8192


@dataclass(frozen=True, slots=True)
class Percentiles:
    """Milliseconds over the recent window; all 0.0 when nothing was measured yet."""

    p50: float = 0.0
    p90: float = 0.0
    p99: float = 0.0
    count: int = 0

    @classmethod
    def of(cls, seconds: Iterable[float], scale: float = 1000.0) -> Percentiles:
        """Of durations in seconds, as milliseconds (``scale=1`` for plain numbers)."""
        ordered = sorted(seconds)
        n = len(ordered)
        if not n:
            return cls()

        def at(q: float) -> float:
            # nearest rank: the smallest sample with at least q of the samples at or below it
            rank = max(1, math.ceil(round(q * n, 9)))
            return ordered[rank - 1] * scale

        return cls(p50=at(0.50), p90=at(0.90), p99=at(0.99), count=n)


@dataclass(frozen=True, slots=True)
class HistogramSnapshot:
    """Cumulative counts: ``counts[i]`` samples were ``<= bounds[i]``; ``count`` in all."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    count: int
    sum: float


class Histogram:
    """Fixed buckets that only ever count up, as Prometheus histograms must.

    Safe to update from several threads (model times arrive from worker threads).
    """

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BOUNDS) -> None:
        self.bounds = bounds
        self._bucket_of = partial(bisect_left, bounds)  # index of the first bound >= value
        self._counts: Counter[int] = Counter()
        self._sum = 0.0
        self._lock = threading.Lock()

    def add_many(self, values: list[float]) -> None:
        buckets = list(map(self._bucket_of, values))  # C-speed: this runs once per batch
        with self._lock:
            self._counts.update(buckets)
            self._sum += sum(values)

    def snapshot(self) -> HistogramSnapshot:
        with self._lock:
            counts = dict(self._counts)
            total = self._sum
        running = 0
        cumulative = []
        for i in range(len(self.bounds)):
            running += counts.get(i, 0)
            cumulative.append(running)
        count = running + counts.get(len(self.bounds), 0)
        return HistogramSnapshot(self.bounds, tuple(cumulative), count, total)


@dataclass(frozen=True, slots=True)
class BatchTimes:
    """Seconds summed over the model calls that returned in batches of one size: stacking
    their rows (``stack``), the model itself (``model``), splitting its output (``split``).
    Triton's ``compute_input``, ``compute_infer`` and ``compute_output`` per batch size."""

    stack: float = 0.0
    model: float = 0.0
    split: float = 0.0

    def __add__(self, other: BatchTimes) -> BatchTimes:
        """Both sums, phase by phase: ``sum(times, BatchTimes())`` is a model's total."""
        return BatchTimes(
            self.stack + other.stack, self.model + other.model, self.split + other.split
        )


@dataclass(frozen=True, slots=True)
class BatcherStats:
    """A consistent snapshot. Requests are counted once each, by their one outcome:
    ``submitted == completed + failed + expired + cancelled + pending``; ``rejected``
    (refused at admission: queue full, or the batcher closing) were never submitted."""

    submitted: int
    completed: int
    failed: int
    expired: int
    cancelled: int
    rejected: int
    pending: int
    queued_rows: int
    running_rows: int  # in batches dispatched and not finished (staged ones included)
    batches: int
    rows: int
    batch_sizes: Mapping[int, int]  # rows in a batch -> batches of that size
    dispatch_reasons: Mapping[str, int]  # DispatchReason value -> batches
    queue_wait_ms: Percentiles  # arrival -> first row dispatched, per request
    model_ms: Percentiles  # one model_fn call
    queue_wait_seconds: HistogramSnapshot  # the same, since the start, for metrics
    model_seconds: HistogramSnapshot
    overloaded: int = 0  # of the rejected: predicted to miss their deadline (adaptive)
    cost_curve: CostCurve | None = None  # what a learning policy fitted (adaptive)
    # measured / predicted model time of recent batches (adaptive): ~1 when well fitted
    prediction_ratio: Percentiles | None = None
    # where the model runs (carpool.runners): workers ready now; for replicas (processes,
    # Ray actors; carpool.runners.replicas.ReplicaStats), also restarts after a death,
    # batches retried once after their replica died, and batches that ran past
    # batch_timeout_ms
    workers_alive: int = 0
    worker_restarts: int = 0
    retried_batches: int = 0
    timed_out_batches: int = 0
    # tokens of the batches run (carpool.collation.tokens), for models that count them: what the
    # model computed (a padded model: rows x padded length) and the rows' own tokens; the
    # difference is padding
    tokens_computed: int = 0
    tokens_real: int = 0
    # rows in a batch -> the seconds its model calls took, summed (the sizes of batch_sizes;
    # a size whose every call failed is missing)
    batch_times: Mapping[int, BatchTimes] = field(default_factory=dict)

    @property
    def mean_batch_size(self) -> float:
        return self.rows / self.batches if self.batches else 0.0


class StatsRecorder:
    """Mutable counters, updated on the batcher's event loop only."""

    def __init__(self) -> None:
        self.completed = 0
        self.failed = 0
        self.expired = 0
        self.cancelled = 0
        self.rejected = 0
        self.overloaded = 0  # of the rejected: refused as predicted to miss their deadline
        self.batches = 0
        self.running_rows = 0
        self.rows = 0
        self.batch_sizes: Counter[int] = Counter()
        self.dispatch_reasons: Counter[str] = Counter()
        self.queue_waits: deque[float] = deque(maxlen=SAMPLE_WINDOW)
        self.model_times: deque[float] = deque(maxlen=SAMPLE_WINDOW)
        self.queue_wait_hist = Histogram()
        self.model_time_hist = Histogram()
        # Model calls not yet in their histogram and per-size sums, as (batch size, stack,
        # model, split seconds): a worker only appends (between two model calls, where
        # every microsecond idles the model); snapshots bin them.
        self._unbinned: deque[tuple[int, float, float, float]] = deque()
        self._batch_times: defaultdict[int, list[float]] = defaultdict(lambda: [0.0] * 3)
        self._times_lock = threading.Lock()  # a worker bins too when no snapshot comes
        self.prediction_ratios: deque[float] = deque(maxlen=SAMPLE_WINDOW)
        self.tokens_computed = 0
        self.tokens_real = 0

    def waited(self, seconds: list[float]) -> None:
        """Queue waits of the requests whose first rows just left in a batch."""
        self.queue_waits.extend(seconds)
        self.queue_wait_hist.add_many(seconds)

    def model_call(self, size: int, seconds: float, *, stack: float, split: float) -> None:
        """One model call that returned in ``seconds``, in a batch of ``size`` rows (as
        :meth:`batch` counted it), and the seconds its rows took to ``stack`` and its output
        to ``split``; from any thread."""
        self.model_times.append(seconds)
        self._unbinned.append((size, stack, seconds, split))
        if len(self._unbinned) >= SAMPLE_WINDOW:  # nobody takes snapshots: bin them now
            self._bin_model_times()

    def _bin_model_times(self) -> None:
        unbinned, taken = self._unbinned, []
        try:
            while True:  # popleft is atomic: a worker may append meanwhile
                taken.append(unbinned.popleft())
        except IndexError:
            pass
        if not taken:
            return
        with self._times_lock:
            self.model_time_hist.add_many([seconds for _, _, seconds, _ in taken])
            for size, stack, seconds, split in taken:
                sums = self._batch_times[size]
                sums[0] += stack
                sums[1] += seconds
                sums[2] += split

    def _model_times(self) -> tuple[HistogramSnapshot, Mapping[int, BatchTimes]]:
        """The model times' histogram and per-size sums, binned together: they agree."""
        self._bin_model_times()
        with self._times_lock:
            hist = self.model_time_hist.snapshot()
            times = {size: BatchTimes(*sums) for size, sums in sorted(self._batch_times.items())}
        return hist, MappingProxyType(times)

    def batch(self, rows: int, reason: str, tokens: tuple[int, int] = (0, 0)) -> None:
        """One batch dispatched: its rows, why, and its tokens (computed, real)."""
        self.running_rows += rows
        self.batches += 1
        self.rows += rows
        self.batch_sizes[rows] += 1
        self.dispatch_reasons[str(reason)] += 1
        self.tokens_computed += tokens[0]
        self.tokens_real += tokens[1]

    def unbatch(self, rows: int, reason: str, tokens: tuple[int, int] = (0, 0)) -> None:
        """Take back :meth:`batch`: that batch went back to the queue before it started."""
        self.running_rows -= rows
        self.batches -= 1
        self.rows -= rows
        self.tokens_computed -= tokens[0]
        self.tokens_real -= tokens[1]
        self.batch_sizes[rows] -= 1
        if not self.batch_sizes[rows]:
            del self.batch_sizes[rows]
        self.dispatch_reasons[str(reason)] -= 1
        if not self.dispatch_reasons[str(reason)]:
            del self.dispatch_reasons[str(reason)]

    def snapshot(
        self, submitted: int, queued_rows: int, cost_curve: CostCurve | None = None
    ) -> BatcherStats:
        """``submitted``: requests ever admitted, as the queue counts them."""
        done = self.completed + self.failed + self.expired + self.cancelled
        model_seconds, batch_times = self._model_times()
        return BatcherStats(
            submitted=submitted,
            completed=self.completed,
            failed=self.failed,
            expired=self.expired,
            cancelled=self.cancelled,
            rejected=self.rejected,
            pending=submitted - done,
            queued_rows=queued_rows,
            running_rows=self.running_rows,
            batches=self.batches,
            rows=self.rows,
            batch_sizes=MappingProxyType(dict(sorted(self.batch_sizes.items()))),
            dispatch_reasons=MappingProxyType(dict(self.dispatch_reasons)),
            queue_wait_ms=Percentiles.of(self.queue_waits),
            model_ms=Percentiles.of(self.model_times),
            queue_wait_seconds=self.queue_wait_hist.snapshot(),
            model_seconds=model_seconds,
            overloaded=self.overloaded,
            tokens_computed=self.tokens_computed,
            tokens_real=self.tokens_real,
            batch_times=batch_times,
            cost_curve=cost_curve,
            prediction_ratio=(
                Percentiles.of(self.prediction_ratios, scale=1.0)
                if self.prediction_ratios
                else None
            ),
        )
