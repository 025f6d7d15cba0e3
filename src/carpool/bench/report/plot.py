"""Pictures of reports: latency against throughput, and how big the batches were. matplotlib is
imported only when a plot is drawn, and figures are built without pyplot (no global registry,
no GUI backend, the caller's backend left alone). Each function saves its file and returns the
figure."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from carpool.bench.report.data import Report, Step

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["NO_SERVER_NOTE", "plot_compare", "plot_report"]

LOG_SPAN = 20.0  # latencies spanning more than 20x get a log axis: both ends stay readable
NO_SERVER_NOTE = "no batch sizes: the target is not a carpool server, or gave no /metrics"
_PERCENTILES = (("p50", ":"), ("p90", "--"), ("p99", "-"))  # name, line style
_SIZE = (12.0, 5.0)  # inches: two panels side by side
_ONE_PANEL = (8.0, 5.0)
_DPI = 110


def plot_report(report: Report, path: str | Path) -> Figure:
    """Save a two-panel PNG (or any format matplotlib infers from ``path``) of one report.

    Left: p50, p90 and p99 latency (ms) against achieved throughput (req/s), one point per
    step, annotated with its load. Right: each step's model calls by batch size (share of
    the step's batches), or a note when the target gave no server-side data. A report of
    streams is drawn by :func:`~carpool.bench.report.plot_streams.plot_stream_report`.
    """
    figure_cls = _figure_class()
    if any(s.streams is not None for s in report.steps):
        from carpool.bench.report.plot_streams import plot_stream_report

        return plot_stream_report(report, path, figure_cls)
    measured = [s for s in report.steps if s.latency is not None]
    with_server = [s for s in report.steps if s.server is not None and s.server.batch_sizes]
    fig = figure_cls(figsize=_SIZE if with_server else _ONE_PANEL, dpi=_DPI, layout="constrained")
    if with_server:
        latency_ax, batch_ax = fig.subplots(1, 2)
    else:
        latency_ax, batch_ax = fig.subplots(1, 1), None
    x = [s.throughput_rps for s in measured]
    for name, style in _PERCENTILES:
        y = [getattr(s.latency, name) for s in measured]
        latency_ax.plot(x, y, linestyle=style, marker="o", label=name)
    p99 = [s.latency.p99 for s in measured if s.latency is not None]
    for step, top in zip(measured, p99, strict=True):
        latency_ax.annotate(
            str(step.load),
            (step.throughput_rps, top),
            textcoords="offset points",
            xytext=(4, 6),
            fontsize="small",
        )
    _latency_axes(latency_ax, [v for s in measured for v in _percentiles(s)])
    latency_ax.set_title("latency against throughput")
    if batch_ax is not None:
        _batch_panel(batch_ax, with_server)
    else:
        latency_ax.text(  # bottom right: where a latency curve, rising with load, is not
            0.99,
            0.02,
            NO_SERVER_NOTE,
            transform=latency_ax.transAxes,
            ha="right",
            va="bottom",
            fontsize="small",
            color="grey",
        )
    fig.suptitle(_title(report))
    fig.savefig(path)
    return fig


def plot_compare(reports: Sequence[Report], path: str | Path) -> Figure:
    """Save one panel comparing reports: p99 (solid) and p50 (dashed) latency against
    throughput, a colour per report, lines labelled ``"LABEL p99"`` and ``"LABEL p50"``.
    Reports of streams: :func:`~carpool.bench.report.plot_streams.plot_stream_compare`."""
    if not reports:
        raise ValueError("plot_compare needs at least one report")
    figure_cls = _figure_class()
    if any(s.streams is not None for r in reports for s in r.steps):
        from carpool.bench.report.plot_streams import plot_stream_compare

        return plot_stream_compare(reports, path, figure_cls)
    fig = figure_cls(figsize=_ONE_PANEL, dpi=_DPI, layout="constrained")
    ax = fig.subplots(1, 1)
    values: list[float] = []
    for index, report in enumerate(reports):
        label = report.label or f"report {index + 1}"
        colour = f"C{index % 10}"
        measured = [s for s in report.steps if s.latency is not None]
        x = [s.throughput_rps for s in measured]
        p99 = [s.latency.p99 for s in measured if s.latency is not None]
        p50 = [s.latency.p50 for s in measured if s.latency is not None]
        ax.plot(x, p99, color=colour, linestyle="-", marker="o", label=f"{label} p99")
        ax.plot(x, p50, color=colour, linestyle="--", marker=".", label=f"{label} p50")
        values += p99 + p50
    _latency_axes(ax, values)
    models = sorted({r.model for r in reports})
    ax.set_title(f"{', '.join(models)}: latency against throughput")
    fig.savefig(path)
    return fig


def _figure_class() -> type[Figure]:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("plots need matplotlib: pip install 'carpool[bench]'") from None
    return Figure


def _percentiles(step: Step) -> list[float]:
    lat = step.latency
    return [] if lat is None else [lat.p50, lat.p90, lat.p99]


def _latency_axes(ax: Axes, values: Sequence[float]) -> None:
    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) > LOG_SPAN:
        ax.set_yscale("log")
    ax.set_xlabel("throughput (req/s)")
    ax.set_ylabel("latency (ms)")
    ax.grid(True, which="major", alpha=0.3)
    if ax.get_lines():
        ax.legend(loc="best", fontsize="small")


def _batch_panel(ax: Axes, steps: Sequence[Step]) -> None:
    # A bar per step, stacked by batch-size bucket, each as a share of the step's batches.
    buckets = sorted(
        {le for s in steps if s.server is not None for le in s.server.batch_sizes}, key=_bound
    )
    positions = list(range(len(steps)))
    bottoms = [0.0] * len(steps)
    for index, le in enumerate(buckets):
        shares = []
        for step in steps:
            sizes = step.server.batch_sizes if step.server is not None else {}
            total = sum(sizes.values())
            shares.append(100.0 * sizes.get(le, 0) / total if total else 0.0)
        ax.bar(
            positions,
            shares,
            bottom=bottoms,
            label=_bucket_label(le, steps),
            color=f"C{index % 10}",
        )
        bottoms = [b + s for b, s in zip(bottoms, shares, strict=True)]
    ax.set_xticks(positions, [str(s.load) for s in steps], rotation=30, ha="right")
    ax.set_ylabel("model calls (% of the step's batches)")
    ax.set_ylim(0, 100)
    ax.set_title("batch sizes")
    ax.legend(title="rows per batch", loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")


def _bucket_label(le: str, steps: Sequence[Step]) -> str:
    # The sizes of the bucket ``le``, as the first step that has it names them.
    sides = (step.server for step in steps if step.server is not None)
    return next(side for side in sides if le in side.batch_sizes).size_label(le)


def _title(report: Report) -> str:
    title = f"{report.model} on {report.target}"
    return f"{title}: {report.label}" if report.label else title


def _bound(le: str) -> float:
    try:
        return float(le)
    except ValueError:
        return math.inf
