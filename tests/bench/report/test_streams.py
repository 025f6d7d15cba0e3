"""Reports of streams (``--stream``): a stream's times, how a step sums its streams, the report's
JSON both ways, and its table, comparison and plots."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
from matplotlib.lines import Line2D

from bench.conftest import closed_plan, latency, report, step
from carpool.bench.loops import ShareTally, step_of
from carpool.bench.plan import Timing
from carpool.bench.report.data import Latency, Report, Step, Streams, summarize_streams
from carpool.bench.report.plot import plot_compare, plot_report
from carpool.bench.report.present import compare_table, render, step_row, steps_table, stream_row
from carpool.bench.targets.base import Streamed


def test_a_stream_times_its_first_output_from_the_send_and_each_gap() -> None:
    assert Streamed.of(10.0, [10.5, 10.75, 11.25]) == Streamed(3, 0.5, (0.25, 0.5))
    assert Streamed.of(10.0, [10.5]) == Streamed(1, 0.5, ())
    assert Streamed.of(10.0, []) == Streamed(0, None, ())


def test_summarize_streams_in_milliseconds_and_per_second() -> None:
    streams = summarize_streams(4, 10, [0.1, 0.2, 0.3, 0.4], [0.01] * 6, 2.0)
    assert (streams.streams, streams.outputs) == (4, 10)
    assert (streams.outputs_per_s, streams.outputs_mean) == (5.0, 2.5)
    assert streams.ttfo is not None
    assert (streams.ttfo.count, streams.ttfo.p50, streams.ttfo.max) == (4, 250.0, 400.0)
    assert streams.ttfo.p99 == pytest.approx(397.0)
    assert streams.tpo == Latency(count=6, mean=10.0, p50=10.0, p90=10.0, p99=10.0, max=10.0)
    empty = summarize_streams(0, 0, [], [], 1.0)
    assert (empty.ttfo, empty.tpo, empty.outputs_per_s) == (None, None, 0.0)
    assert math.isnan(empty.outputs_mean)


def test_a_step_sums_the_streams_of_every_tally() -> None:
    plan = closed_plan(2, requests=3)
    timing = Timing(start=100.0, window=100.0, end=None)
    first, second = ShareTally(), ShareTally()
    first.record(Streamed(3, 0.1, (0.02, 0.04)), 0.16, 100.5)
    first.record("StreamError", 0.3, 100.6)
    second.record(Streamed(1, 0.3, ()), 0.3, 101.0)
    result = step_of(plan, timing, [first, second], slo_ms=None)
    assert (result.requests, result.ok, result.errors) == (3, 2, {"StreamError": 1})
    assert result.throughput_rps == 2.0  # two streams ended well in the 1 s window
    assert result.streams is not None
    assert (result.streams.streams, result.streams.outputs) == (2, 4)
    assert (result.streams.outputs_per_s, result.streams.outputs_mean) == (4.0, 2.0)
    assert result.streams.ttfo is not None
    assert result.streams.tpo is not None
    assert (result.streams.ttfo.count, result.streams.ttfo.p50) == (2, pytest.approx(200.0))
    assert (result.streams.tpo.count, result.streams.tpo.max) == (2, pytest.approx(40.0))


def test_a_step_of_one_shot_requests_has_no_streams() -> None:
    tally = ShareTally()
    tally.record(None, 0.01, 100.5)
    timing = Timing(start=100.0, window=100.0, end=None)
    assert step_of(closed_plan(1, requests=1), timing, [tally], slo_ms=None).streams is None


def streamed(clients: int, rps: float, outputs_per_s: float, ttfo: float, tpo: float) -> Step:
    """A step of streams: TTFO and TPO with p99 twice p50."""
    streams = Streams(
        streams=int(rps * 10),
        outputs=int(outputs_per_s * 10),
        outputs_per_s=outputs_per_s,
        outputs_mean=outputs_per_s / rps,
        ttfo=latency(ttfo, 2 * ttfo),
        tpo=latency(tpo, 2 * tpo),
    )
    one = step(clients, rps, latency(100.0, 200.0), ok=int(rps * 10))
    return dataclasses.replace(one, streams=streams)


def test_a_report_of_streams_round_trips_through_json(tmp_path: Path) -> None:
    path = tmp_path / "streams.json"
    written = report([streamed(1, 2.0, 128.0, 40.0, 8.0)], label="a")
    written.save(path)
    assert Report.load(path) == written
    one_shot = report([step(1, 5.0, latency(1.0, 2.0))], label="b")
    assert Report.from_dict(json.loads(one_shot.to_json())) == one_shot


def test_a_stream_row_has_the_stream_figures_then_the_step_cells() -> None:
    row = stream_row(streamed(8, 2.0, 128.0, 40.0, 8.0))
    assert row == ["8 clients", "2.0", "128.0", "40.0", "80.0", "8.00", "16.0", "200", "20", "-"]
    one = step(1, 5.0, latency(1.0, 2.0))
    assert stream_row(one)[:8] == ["1 clients", "5.0", "-", "-", "-", "-", "-", "2.00"]
    assert stream_row(one)[8:] == step_row(one)[6:]


def test_the_steps_table_of_streams_names_its_columns() -> None:
    text = render(steps_table(report([streamed(1, 2.0, 128.0, 40.0, 8.0)])), width=200)
    for header in ("streams/s", "outputs/s", "TTFO p50 ms", "TTFO p99 ms", "TPO p99 ms"):
        assert header in text
    assert "req/s" not in text
    assert "streams/s" not in render(steps_table(report([step(1, 5.0, latency(1.0, 2.0))])))


def test_compare_of_streams_gives_ratios_to_the_first() -> None:
    a = report([streamed(1, 2.0, 100.0, 40.0, 8.0)], label="a")
    b = report([streamed(1, 2.0, 150.0, 20.0, 16.0)], label="b")
    table = compare_table([a, b])
    cells = [list(column.cells) for column in table.columns]
    assert [c.header for c in table.columns] == [
        "load",
        "a outputs/s",
        "a TTFO p99",
        "a TPO p99",
        "b outputs/s",
        "b TTFO p99",
        "b TPO p99",
        "outputs/s b/a",
        "TTFO p99 b/a",
        "TPO p99 b/a",
    ]
    row = [column[0] for column in cells]
    ratios = [f"{r}\N{MULTIPLICATION SIGN}" for r in ("1.50", "0.50", "2.00")]
    assert row == ["1 clients", "100.0", "80.0", "16.0", "150.0", "40.0", "32.0", *ratios]


def _lines(path: Path, figure: object) -> dict[str, list[tuple[list[float], list[float]]]]:
    assert path.read_bytes().startswith(b"\x89PNG")
    out: dict[str, list[tuple[list[float], list[float]]]] = {}
    for ax in figure.axes:  # type: ignore[attr-defined]
        for line in ax.get_lines():
            assert isinstance(line, Line2D)
            xy = (
                np.asarray(line.get_xdata(), dtype=float).tolist(),
                np.asarray(line.get_ydata(), dtype=float).tolist(),
            )
            out.setdefault(str(line.get_label()), []).append(xy)
    return out


def test_the_plot_of_streams_draws_ttfo_and_tpo_against_outputs(tmp_path: Path) -> None:
    steps = [streamed(1, 2.0, 100.0, 40.0, 8.0), streamed(8, 9.0, 400.0, 60.0, 10.0)]
    path = tmp_path / "one.png"
    figure = plot_report(report(steps), path)
    titles = [ax.get_title() for ax in figure.axes]
    assert titles == ["time to first output against outputs/s", "time per output against outputs/s"]
    lines = _lines(path, figure)
    assert lines["p50"] == [([100.0, 400.0], [40.0, 60.0]), ([100.0, 400.0], [8.0, 10.0])]
    assert lines["p99"] == [([100.0, 400.0], [80.0, 120.0]), ([100.0, 400.0], [16.0, 20.0])]


def test_the_compare_plot_of_streams_draws_a_p99_line_per_report(tmp_path: Path) -> None:
    a = report([streamed(1, 2.0, 100.0, 40.0, 8.0)], label="a")
    b = report([streamed(1, 2.0, 150.0, 20.0, 16.0)], label="b")
    path = tmp_path / "compare.png"
    lines = _lines(path, plot_compare([a, b], path))
    assert lines["a p99"] == [([100.0], [80.0]), ([100.0], [16.0])]
    assert lines["b p99"] == [([150.0], [40.0]), ([150.0], [32.0])]
