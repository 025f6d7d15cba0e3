"""The benchmarks' harness: pinning, servers, repeats, medians, and the figures scenarios report."""

from benchmarks.harness.figures import Figure, Figures, run

__all__ = ["Figure", "Figures", "run"]
