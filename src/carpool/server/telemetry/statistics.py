"""Triton's statistics extension, as carpool's counts and seconds read in it: each duration a
``{count, ns}`` pair, the three compute phases (model-wide and per batch size), and a
model's response-cache lookups. Pure: from :class:`~carpool.engine.stats.BatcherStats`; no I/O,
nothing of HTTP or gRPC (the registry assembles a model's document from these).
"""

from __future__ import annotations

from carpool.engine.stats import BatcherStats, BatchTimes

__all__ = ["CacheCounts", "batch_stats", "compute_phases", "duration"]


def duration(count: int, seconds: float) -> dict[str, int]:
    """Triton's duration: ``count`` events that took ``seconds`` in all, in nanoseconds."""
    return {"count": count, "ns": int(seconds * 1e9)}


def compute_phases(count: int, times: BatchTimes) -> dict[str, dict[str, int]]:
    """Triton's compute phases, of ``count`` requests (or batches) that took ``times``:
    ``compute_input`` the rows' stacking, ``compute_infer`` the model, ``compute_output``
    the split of its output. One ``count`` for all three: perf_analyzer requires them equal."""
    return {
        "compute_input": duration(count, times.stack),
        "compute_infer": duration(count, times.model),
        "compute_output": duration(count, times.split),
    }


def batch_stats(stats: BatcherStats) -> list[dict[str, object]]:
    """Triton's ``batch_stats``: per batch size, its batches and the seconds of each compute
    phase summed over them (0 ns for a size whose every model call failed)."""
    untimed = BatchTimes()
    return [
        {"batch_size": size, **compute_phases(count, stats.batch_times.get(size, untimed))}
        for size, count in stats.batch_sizes.items()
    ]


class CacheCounts:
    """A model's response-cache lookups, as Triton's statistics count them: ``hits`` (answered
    from the cache) and ``misses`` (computed, then stored), each with the seconds the lookup
    (and, for a miss, the insert) took."""

    __slots__ = ("hit_seconds", "hits", "miss_seconds", "misses")

    def __init__(self) -> None:
        self.hits = 0
        self.hit_seconds = 0.0
        self.misses = 0
        self.miss_seconds = 0.0

    def hit(self, seconds: float) -> None:
        self.hits += 1
        self.hit_seconds += seconds

    def miss(self, seconds: float) -> None:
        self.misses += 1
        self.miss_seconds += seconds
