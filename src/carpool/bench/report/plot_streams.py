"""Pictures of reports of streams (``--stream``): time to first output and time per output
against outputs/s, for one report or several side by side. Figures are built without pyplot,
from the figure class :mod:`carpool.bench.report.plot` passes in."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from carpool.bench.report.data import Latency, Report, Step

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["plot_stream_compare", "plot_stream_report"]

LOG_SPAN = 20.0  # times spanning more than 20x get a log axis: both ends stay readable
_PANELS = (("ttfo", "time to first output"), ("tpo", "time per output"))
_SIZE = (12.0, 5.0)  # inches: two panels side by side
_DPI = 110


def plot_stream_report(report: Report, path: str | Path, figure_cls: type[Figure]) -> Figure:
    """Save two panels of one report: TTFO (left) and TPO (right), p50 dotted and p99 solid,
    against outputs/s, one point per step annotated with its load."""
    fig = figure_cls(figsize=_SIZE, dpi=_DPI, layout="constrained")
    steps = [s for s in report.steps if s.streams is not None]
    for ax, (field, title) in zip(fig.subplots(1, 2), _PANELS, strict=True):
        x, points = _points(steps, field)
        for name, style in (("p50", ":"), ("p99", "-")):
            ax.plot(x, [getattr(t, name) for t in points], linestyle=style, marker="o", label=name)
        for step, rate, times in zip(steps, x, points, strict=False):
            ax.annotate(
                str(step.load),
                (rate, times.p99),
                textcoords="offset points",
                xytext=(4, 6),
                fontsize="small",
            )
        _axes(ax, [v for t in points for v in (t.p50, t.p99)], title)
    label = f": {report.label}" if report.label else ""
    fig.suptitle(f"{report.model} on {report.target}{label}")
    fig.savefig(path)
    return fig


def plot_stream_compare(
    reports: Sequence[Report], path: str | Path, figure_cls: type[Figure]
) -> Figure:
    """Save two panels comparing reports: TTFO p99 (left) and TPO p99 (right) against
    outputs/s, a colour per report, lines labelled ``"LABEL p99"``."""
    fig = figure_cls(figsize=_SIZE, dpi=_DPI, layout="constrained")
    for ax, (field, title) in zip(fig.subplots(1, 2), _PANELS, strict=True):
        values: list[float] = []
        for index, report in enumerate(reports):
            label = report.label or f"report {index + 1}"
            steps = [s for s in report.steps if s.streams is not None]
            x, points = _points(steps, field)
            p99 = [t.p99 for t in points]
            ax.plot(x, p99, color=f"C{index % 10}", marker="o", label=f"{label} p99")
            values += p99
        _axes(ax, values, title)
    models = sorted({r.model for r in reports})
    fig.suptitle(f"{', '.join(models)}: streams")
    fig.savefig(path)
    return fig


def _points(steps: Sequence[Step], field: str) -> tuple[list[float], list[Latency]]:
    """The outputs/s and the ``field`` times of each step that has them."""
    x: list[float] = []
    points: list[Latency] = []
    for step in steps:
        times = getattr(step.streams, field, None)
        if step.streams is not None and times is not None:
            x.append(step.streams.outputs_per_s)
            points.append(times)
    return x, points


def _axes(ax: Axes, values: Sequence[float], title: str) -> None:
    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) > LOG_SPAN:
        ax.set_yscale("log")
    ax.set_xlabel("outputs/s")
    ax.set_ylabel(f"{title} (ms)")
    ax.set_title(f"{title} against outputs/s")
    ax.grid(True, which="major", alpha=0.3)
    if ax.get_lines():
        ax.legend(loc="best", fontsize="small")
