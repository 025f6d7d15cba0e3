"""The buckets of the histograms ``/metrics`` exposes, as Prometheus' cumulative pairs.

Pure arithmetic on :mod:`carpool.engine.stats` snapshots; no metrics library, no I/O. Public so
that ``carpool bench`` computes an in-process batcher's figures exactly as a scrape of the
server would read them. It must import nothing of the server but what it owns.
"""

from __future__ import annotations

from collections.abc import Mapping

from carpool.engine.stats import HistogramSnapshot

__all__ = ["batch_size_buckets", "histogram_buckets"]


def batch_size_buckets(sizes: Mapping[int, int], largest: int) -> list[tuple[str, float]]:
    """Cumulative batch counts at powers of two up to ``largest`` (itself the last bound),
    then ``+Inf``: ``sizes`` maps a batch size to how many batches had it.

    >>> batch_size_buckets({1: 2, 3: 1, 8: 4}, 6)
    [('1', 2.0), ('2', 2.0), ('4', 3.0), ('6', 3.0), ('+Inf', 7.0)]
    """
    bounds = [1]
    while bounds[-1] < largest:
        bounds.append(min(bounds[-1] * 2, largest))
    pairs = [
        (str(bound), float(sum(n for size, n in sizes.items() if size <= bound)))
        for bound in bounds
    ]
    return [*pairs, ("+Inf", float(sum(sizes.values())))]


def histogram_buckets(hist: HistogramSnapshot) -> list[tuple[str, float]]:
    """A latency histogram's cumulative counts at its bounds, then ``+Inf``."""
    pairs = [
        (repr(bound), float(count)) for bound, count in zip(hist.bounds, hist.counts, strict=True)
    ]
    return [*pairs, ("+Inf", float(hist.count))]
