"""The old name of :mod:`carpool.bench.arrivals`, kept until ``benchmarks/`` imports that.

Delete this module once nothing imports ``carpool.bench.load``.
"""

from carpool.bench.arrivals import bursty_offsets, count_offsets, poisson_offsets, read_trace

__all__ = ["bursty_offsets", "count_offsets", "poisson_offsets", "read_trace"]
