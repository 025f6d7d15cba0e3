"""Plots: real PNG files, and the figures hold exactly the series they should."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import cast

import numpy as np
import pytest
from matplotlib.image import imread
from matplotlib.lines import Line2D
from matplotlib.text import Annotation

from bench.conftest import batch_sizes, latency, report, step
from carpool.bench.report.data import Load, Report, Step
from carpool.bench.report.plot import NO_SERVER_NOTE, plot_compare, plot_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _xs(line: Line2D) -> list[float]:
    return [float(v) for v in np.asarray(line.get_xdata(), dtype=float)]


def _ys(line: Line2D) -> list[float]:
    return [float(v) for v in np.asarray(line.get_ydata(), dtype=float)]


def _step(clients: int, rps: float, p50: float, p99: float, sizes: dict[str, int] | None) -> Step:
    server = batch_sizes(sizes) if sizes is not None else None
    return step(clients, rps, latency(p50, p99), ok=100, server=server)


def _report(label: str, steps: list[Step]) -> Report:
    return report(steps, label=label, target="http://h:8000")


SERVER_REPORT = _report(
    "eager",
    [
        _step(1, 500.0, 1.0, 2.0, {"1": 100}),
        _step(8, 2000.0, 2.0, 4.0, {"1": 10, "4": 30, "8": 60}),
        _step(64, 4000.0, 8.0, 15.0, {"8": 5, "32": 95}),
    ],
)


def _check_png(path: Path, size: tuple[float, float], dpi: int) -> None:
    assert path.read_bytes()[:8] == PNG_MAGIC
    height, width, channels = imread(path).shape
    assert (width, height) == (round(size[0] * dpi), round(size[1] * dpi))
    assert channels == 4


def test_plot_report_latency_panel(tmp_path: Path) -> None:
    path = tmp_path / "report.png"
    fig = plot_report(SERVER_REPORT, path)
    _check_png(path, (12.0, 5.0), 110)
    latency = fig.axes[0]
    lines = {line.get_label(): line for line in latency.get_lines()}
    assert list(lines) == ["p50", "p90", "p99"]
    for line in lines.values():
        assert _xs(line) == [500.0, 2000.0, 4000.0]
    assert _ys(lines["p50"]) == [1.0, 2.0, 8.0]
    assert _ys(lines["p90"]) == [1.5, 3.0, 11.5]
    assert _ys(lines["p99"]) == [2.0, 4.0, 15.0]
    assert [t.get_text() for t in latency.texts] == ["1 clients", "8 clients", "64 clients"]
    assert [cast(Annotation, t).xy for t in latency.texts] == [
        (500.0, 2.0),
        (2000.0, 4.0),
        (4000.0, 15.0),
    ]
    assert latency.get_xlabel() == "throughput (req/s)"
    assert latency.get_ylabel() == "latency (ms)"
    assert latency.get_yscale() == "linear"  # 1 to 15 ms: within 20x
    legend = latency.get_legend()
    assert legend is not None
    assert [t.get_text() for t in legend.get_texts()] == ["p50", "p90", "p99"]
    assert fig.get_suptitle() == "demo on http://h:8000: eager"


def test_plot_report_batch_panel_stacks_shares(tmp_path: Path) -> None:
    fig = plot_report(SERVER_REPORT, tmp_path / "report.png")
    batches = fig.axes[1]
    labels = [t.get_text() for t in batches.get_xticklabels()]
    assert labels == ["1 clients", "8 clients", "64 clients"]
    containers = batches.containers
    assert [c.get_label() for c in containers] == ["1", "≤4", "≤8", "≤32"]  # bounds alone
    heights = [[bar.get_height() for bar in c] for c in containers]
    assert heights == [[100.0, 10.0, 0.0], [0.0, 30.0, 0.0], [0.0, 60.0, 5.0], [0.0, 0.0, 95.0]]
    bottoms = [[bar.get_y() for bar in c] for c in containers]
    assert bottoms[3] == [100.0, 100.0, 5.0]  # stacked on what is below
    assert batches.get_ylim() == (0.0, 100.0)


def test_plot_report_batch_panel_names_each_bucket_s_sizes(tmp_path: Path) -> None:
    floors = {"4": 3, "8": 5, "32": 17}  # /metrics: a bucket per power of two
    steps = [
        dataclasses.replace(s, server=dataclasses.replace(s.server, batch_size_floors=floors))
        for s in SERVER_REPORT.steps
        if s.server is not None
    ]
    fig = plot_report(dataclasses.replace(SERVER_REPORT, steps=steps), tmp_path / "r.png")
    labels = [c.get_label() for c in fig.axes[1].containers]
    assert labels == ["1", "3-4", "5-8", "17-32"]


def test_plot_report_log_axis_for_a_wide_range(tmp_path: Path) -> None:
    report = _report("", [_step(1, 100.0, 0.5, 1.0, None), _step(64, 900.0, 30.0, 250.0, None)])
    fig = plot_report(report, tmp_path / "wide.png")
    assert fig.axes[0].get_yscale() == "log"
    assert fig.get_suptitle() == "demo on http://h:8000"


def test_plot_report_without_server_data_has_one_panel_and_a_note(tmp_path: Path) -> None:
    report = _report("x", [_step(1, 100.0, 1.0, 2.0, None), _step(2, 180.0, 1.2, 2.5, None)])
    path = tmp_path / "plain.png"
    fig = plot_report(report, path)
    _check_png(path, (8.0, 5.0), 110)
    [latency] = fig.axes
    assert [t.get_text() for t in latency.texts] == ["1 clients", "2 clients", NO_SERVER_NOTE]
    assert NO_SERVER_NOTE.startswith("no batch sizes")


def test_plot_report_skips_steps_without_latency(tmp_path: Path) -> None:
    failed = Step(
        load=Load("concurrency", 128),
        duration_s=10.0,
        requests=10,
        ok=0,
        errors={"503": 10},
        throughput_rps=0.0,
        latency=None,
    )
    report = _report("x", [_step(1, 100.0, 1.0, 2.0, None), failed])
    fig = plot_report(report, tmp_path / "r.png")
    assert [_xs(line) for line in fig.axes[0].get_lines()] == [[100.0]] * 3


def test_plot_compare(tmp_path: Path) -> None:
    other = _report("fixed", [_step(1, 400.0, 3.0, 6.0, None), _step(8, 1500.0, 5.0, 9.0, None)])
    unnamed = _report("", [_step(1, 300.0, 2.0, 3.0, None)])
    path = tmp_path / "compare.png"
    fig = plot_compare([SERVER_REPORT, other, unnamed], path)
    _check_png(path, (8.0, 5.0), 110)
    [ax] = fig.axes
    lines = ax.get_lines()
    assert [line.get_label() for line in lines] == [
        "eager p99",
        "eager p50",
        "fixed p99",
        "fixed p50",
        "report 3 p99",
        "report 3 p50",
    ]
    assert [_xs(line) for line in lines[::2]] == [
        [500.0, 2000.0, 4000.0],
        [400.0, 1500.0],
        [300.0],
    ]
    assert [_ys(line) for line in lines[::2]] == [[2.0, 4.0, 15.0], [6.0, 9.0], [3.0]]
    assert [_ys(line) for line in lines[1::2]] == [[1.0, 2.0, 8.0], [3.0, 5.0], [2.0]]
    assert [line.get_linestyle() for line in lines] == ["-", "--"] * 3
    colours = [line.get_color() for line in lines]
    assert colours[0] == colours[1] != colours[2] == colours[3] != colours[4]
    assert ax.get_yscale() == "linear"  # 1 to 15 ms


def test_plot_compare_needs_a_report(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one report"):
        plot_compare([], tmp_path / "none.png")


def test_importing_plot_does_not_import_matplotlib() -> None:
    code = "import sys, carpool.bench.report.plot; print('matplotlib' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"
