"""The buckets ``/metrics`` histograms expose: cumulative, ending in ``+Inf``."""

from __future__ import annotations

import pytest

from carpool.engine.stats import HistogramSnapshot
from carpool.server.telemetry.buckets import batch_size_buckets, histogram_buckets


@pytest.mark.parametrize(
    ("largest", "bounds"),
    [
        (0, ["1"]),
        (1, ["1"]),
        (2, ["1", "2"]),
        (6, ["1", "2", "4", "6"]),
        (8, ["1", "2", "4", "8"]),
        (100, ["1", "2", "4", "8", "16", "32", "64", "100"]),
    ],
)
def test_batch_size_bounds_are_powers_of_two_up_to_the_largest(
    largest: int, bounds: list[str]
) -> None:
    assert [bound for bound, _ in batch_size_buckets({}, largest)] == [*bounds, "+Inf"]


def test_batch_size_buckets_count_batches_cumulatively() -> None:
    assert batch_size_buckets({1: 2, 3: 1, 8: 4}, 6) == [
        ("1", 2.0),
        ("2", 2.0),
        ("4", 3.0),
        ("6", 3.0),
        ("+Inf", 7.0),
    ]


def test_histogram_buckets_keep_the_snapshots_bounds_and_total() -> None:
    hist = HistogramSnapshot(bounds=(0.001, 0.5), counts=(1, 3), count=4, sum=1.2)
    assert histogram_buckets(hist) == [("0.001", 1.0), ("0.5", 3.0), ("+Inf", 4.0)]
