"""What a person reads: rich tables of a report's steps, of reports side by side, of a sweep.
Pure: reports in, tables out; printing is the CLI's job."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from carpool.bench.report.data import Load, Report, Step

__all__ = [
    "SweepResult",
    "batch_histogram",
    "best",
    "compare_table",
    "errors_text",
    "render",
    "step_row",
    "steps_table",
    "stream_row",
    "sweep_table",
]

MISSING = "-"
TIMES = "\N{MULTIPLICATION SIGN}"  # between an error and its count; after a ratio
_WIDTH = 120  # wide enough for a step row with server columns, narrow enough for a terminal


@dataclass(frozen=True, slots=True)
class SweepResult:
    """One point of a batching sweep: the server's settings and the step measured with them."""

    max_batch_size: int
    max_wait_ms: float
    step: Step


def step_row(step: Step, *, server: bool | None = None, goodput: bool | None = None) -> list[str]:
    """The cells of one step: load, req/s, p50, p90, p99, max (ms), ok, errors; then mean
    batch and queue-wait share when ``server`` (default: when the step has server data),
    then goodput when ``goodput`` (default: when the step has it). Absent values are "-".
    """
    lat = step.latency
    cells = [
        str(step.load),
        _rate(step.throughput_rps),
        *(
            [_ms(lat.p50), _ms(lat.p90), _ms(lat.p99), _ms(lat.max)]
            if lat is not None
            else [MISSING] * 4
        ),
        str(step.ok),
        errors_text(step.errors),
    ]
    if server if server is not None else step.server is not None:
        side = step.server
        cells.append(
            f"{side.batch_size_mean:.1f}" if side is not None and side.batches else MISSING
        )
        share = side.queue_wait_share if side is not None else None
        cells.append(f"{share * 100:.0f}%" if share is not None else MISSING)
    if goodput if goodput is not None else step.goodput_rps is not None:
        cells.append(_rate(step.goodput_rps) if step.goodput_rps is not None else MISSING)
    return cells


def stream_row(step: Step, *, server: bool | None = None, goodput: bool | None = None) -> list[str]:
    """The cells of one step of streams: load, streams/s, outputs/s, TTFO p50 and p99, TPO
    p50 and p99, a whole stream's p99 (ms), ok, errors; then the server and goodput cells
    as :func:`step_row` has them."""
    streams = step.streams
    ttfo, tpo = (streams.ttfo, streams.tpo) if streams is not None else (None, None)
    cells = [
        str(step.load),
        _rate(step.throughput_rps),
        _rate(streams.outputs_per_s if streams is not None else None),
        _ms(ttfo.p50 if ttfo is not None else None),
        _ms(ttfo.p99 if ttfo is not None else None),
        _ms(tpo.p50 if tpo is not None else None),
        _ms(tpo.p99 if tpo is not None else None),
        _ms(_p99(step)),
    ]
    return cells + step_row(step, server=server, goodput=goodput)[6:]


_STEP_HEADERS = ("req/s", "p50 ms", "p90 ms", "p99 ms", "max ms", "ok")
_STREAM_HEADERS = (
    "streams/s",
    "outputs/s",
    "TTFO p50 ms",
    "TTFO p99 ms",
    "TPO p50 ms",
    "TPO p99 ms",
    "stream p99 ms",
    "ok",
)


def steps_table(report: Report) -> Table:
    """Every step of a report, one row each; server and goodput columns when any step has
    them. A report of streams has the stream columns of :func:`stream_row`."""
    server = any(step.server is not None for step in report.steps)
    goodput = any(step.goodput_rps is not None for step in report.steps)
    streams = _streaming(report)
    row = stream_row if streams else step_row
    table = Table(title=_title(report), title_justify="left")
    table.add_column("load")
    for header in _STREAM_HEADERS if streams else _STEP_HEADERS:
        table.add_column(header, justify="right")
    table.add_column("errors", overflow="fold")  # wrapped, never cut
    if server:
        table.add_column("mean batch", justify="right")
        table.add_column("queue wait", justify="right")
    if goodput:
        table.add_column("goodput req/s", justify="right")
    for step in report.steps:
        table.add_row(*row(step, server=server, goodput=goodput))
    return table


def errors_text(errors: dict[str, int]) -> str:
    """Each error kind, :data:`TIMES` and its count, most frequent first, e.g. "503 x12,
    ClientOSError x1" (with the sign, no space); ``"-"`` when there are none."""
    items = sorted(((n, kind) for kind, n in errors.items() if n), key=lambda e: (-e[0], e[1]))
    return ", ".join(f"{kind}{TIMES}{n}" for n, kind in items) or MISSING


def batch_histogram(step: Step) -> str:
    """Model calls per batch size, e.g. ``"1:12 3:3 5:40 7:200"`` where the server counts
    each size, ``"1:12 2:3 3-4:40 5-8:200"`` where its histogram has a bucket per power of
    two (:meth:`ServerSide.size_label`); ``"-"`` without server data."""
    server = step.server
    if server is None or not server.batch_sizes:
        return MISSING
    sizes = sorted(server.batch_sizes.items(), key=lambda item: _bound(item[0]))
    return " ".join(f"{server.size_label(le)}:{n}" for le, n in sizes)


def compare_table(reports: Sequence[Report]) -> Table:
    """Reports side by side: a row per load level found in any of them, each report's req/s
    and p99, then every other report's ratios to the first (req/s ratio, p99 ratio)."""
    if not reports:
        raise ValueError("compare_table needs at least one report")
    labels = [report.label or f"report {i + 1}" for i, report in enumerate(reports)]
    if any(_streaming(report) for report in reports):
        return _compare_streams(reports, labels)
    by_load = [_steps_by_load(report) for report in reports]
    loads = sorted({load for steps in by_load for load in steps}, key=lambda x: (x.mode, x.value))
    table = Table(title=f"{reports[0].model}: " + " vs ".join(labels), title_justify="left")
    table.add_column("load")
    for label in labels:
        table.add_column(f"{label} req/s", justify="right")
        table.add_column(f"{label} p99 ms", justify="right")
    for label in labels[1:]:
        table.add_column(f"req/s {label}/{labels[0]}", justify="right")
        table.add_column(f"p99 {label}/{labels[0]}", justify="right")
    for load in loads:
        steps = [steps.get(load) for steps in by_load]
        cells = [str(load)]
        for step in steps:
            cells.append(_rate(step.throughput_rps) if step is not None else MISSING)
            cells.append(_ms(_p99(step)))
        first = steps[0]
        for step in steps[1:]:
            cells.append(_ratio(_rps(step), _rps(first)))
            cells.append(_ratio(_p99(step), _p99(first)))
        table.add_row(*cells)
    return table


def _compare_streams(reports: Sequence[Report], labels: list[str]) -> Table:
    """:func:`compare_table` of reports of streams: each report's outputs/s, TTFO p99 and TPO
    p99, then every other report's ratios of those to the first's."""
    by_load = [_steps_by_load(report) for report in reports]
    loads = sorted({load for steps in by_load for load in steps}, key=lambda x: (x.mode, x.value))
    table = Table(title=f"{reports[0].model}: " + " vs ".join(labels), title_justify="left")
    table.add_column("load")
    figures = (("outputs/s", _outputs_rate), ("TTFO p99", _ttfo_p99), ("TPO p99", _tpo_p99))
    for label in labels:
        for name, _ in figures:
            table.add_column(f"{label} {name}", justify="right")
    for label in labels[1:]:
        for name, _ in figures:
            table.add_column(f"{name} {label}/{labels[0]}", justify="right")
    for load in loads:
        steps = [steps.get(load) for steps in by_load]
        cells = [str(load)]
        for step in steps:
            outputs, ttfo, tpo = (read(step) for _, read in figures)
            cells += [_rate(outputs), _ms(ttfo), _ms(tpo)]
        for step in steps[1:]:
            cells += [_ratio(read(step), read(steps[0])) for _, read in figures]
        table.add_row(*cells)
    return table


def sweep_table(results: Sequence[SweepResult], *, p99_budget_ms: float | None = None) -> Table:
    """One row per batching setting tried, in the order given; with ``p99_budget_ms`` the
    :func:`best` one is marked."""
    chosen = best(results, p99_budget_ms) if p99_budget_ms is not None else None
    title = "batching sweep"
    if p99_budget_ms is not None:
        title += f" (p99 budget {p99_budget_ms:g} ms)"
    table = Table(title=title, title_justify="left")
    table.add_column("max batch", justify="right")
    table.add_column("max wait ms", justify="right")
    table.add_column("load")
    for header in ("req/s", "p50 ms", "p99 ms", "mean batch"):
        table.add_column(header, justify="right")
    table.add_column("errors", overflow="fold")  # wrapped, never cut
    table.add_column("")
    for result in results:
        step = result.step
        lat, side = step.latency, step.server
        table.add_row(
            str(result.max_batch_size),
            f"{result.max_wait_ms:g}",
            str(step.load),
            _rate(step.throughput_rps),
            _ms(lat.p50 if lat is not None else None),
            _ms(lat.p99 if lat is not None else None),
            f"{side.batch_size_mean:.1f}" if side is not None and side.batches else MISSING,
            errors_text(step.errors),
            "best" if result is chosen else "",
        )
    return table


def best(results: Sequence[SweepResult], p99_budget_ms: float) -> SweepResult | None:
    """The highest throughput among results whose p99 is within the budget; the lower p99
    wins a tie, then the earlier result. ``None`` when none is within it."""
    within = [
        r for r in results if r.step.latency is not None and r.step.latency.p99 <= p99_budget_ms
    ]
    if not within:
        return None
    return min(within, key=lambda r: (-r.step.throughput_rps, _p99(r.step)))


def render(table: Table, *, width: int = _WIDTH) -> str:
    """The table as plain text (no colour codes), as a terminal ``width`` wide shows it."""
    console = Console(record=True, width=width, file=io.StringIO(), color_system=None)
    console.print(table)
    return console.export_text()


def _title(report: Report) -> str:
    title = f"{report.model} on {report.target} ({report.kind})"
    return f"{title}: {report.label}" if report.label else title


def _steps_by_load(report: Report) -> dict[Load, Step]:
    steps: dict[Load, Step] = {}
    for step in report.steps:
        steps.setdefault(step.load, step)  # a repeated level: its first measurement
    return steps


def _streaming(report: Report) -> bool:
    return any(step.streams is not None for step in report.steps)


def _outputs_rate(step: Step | None) -> float | None:
    return step.streams.outputs_per_s if step is not None and step.streams is not None else None


def _ttfo_p99(step: Step | None) -> float | None:
    streams = step.streams if step is not None else None
    return streams.ttfo.p99 if streams is not None and streams.ttfo is not None else None


def _tpo_p99(step: Step | None) -> float | None:
    streams = step.streams if step is not None else None
    return streams.tpo.p99 if streams is not None and streams.tpo is not None else None


def _rps(step: Step | None) -> float | None:
    return step.throughput_rps if step is not None else None


def _p99(step: Step | None) -> float | None:
    return step.latency.p99 if step is not None and step.latency is not None else None


def _rate(value: float | None) -> str:
    return MISSING if value is None else f"{value:,.1f}"


def _ms(value: float | None) -> str:
    # Three significant figures for the usual range: 0.123, 1.23, 12.3, 123, 1234.
    if value is None:
        return MISSING
    if value < 1:
        return f"{value:.3f}"
    if value < 10:
        return f"{value:.2f}"
    if value < 100:
        return f"{value:.1f}"
    return f"{value:,.0f}"


def _ratio(value: float | None, reference: float | None) -> str:
    if value is None or reference is None or reference <= 0:
        return MISSING
    return f"{value / reference:.2f}{TIMES}"


def _bound(le: str) -> float:
    try:
        return float(le)
    except ValueError:
        return math.inf
