"""The benchmarks' harness: figures by name, their goals, and a run's exit status."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest
from benchmarks.harness import Figures, run


def test_figures_keep_order_goals_and_checks() -> None:
    figures = Figures()
    figures.add("req_per_s", 1234.5678, "req/s")
    figures.at_least("speedup", 2.5, 3)
    figures.at_most("p99_ratio", 1.5, 2)
    figures.check("answers_equal", True)
    assert [f.name for f in figures] == ["req_per_s", "speedup", "p99_ratio", "answers_equal"]
    assert figures["req_per_s"] == 1234.57  # six significant digits
    assert [f.met for f in figures] == [None, False, True, None]
    assert [f.goal for f in figures][1:3] == [">= 3", "<= 2"]
    assert figures.failed_checks() == []
    assert "MISSED" in figures.table()


def test_a_goal_not_measured_is_neither_met_nor_missed() -> None:
    figures = Figures()
    figures.at_least("over_peer", math.nan, 3)
    figures.at_most("ratio", math.nan, 0.5)
    assert [f.met for f in figures] == [None, None]
    assert "MISSED" not in figures.table()
    assert figures.table().splitlines()[-1].split()[-1] == "n/a"


def test_a_name_is_reported_once() -> None:
    figures = Figures()
    figures.add("x", 1)
    with pytest.raises(ValueError, match="'x' reported twice"):
        figures.add("x", 2)


def test_update_prefixes_names() -> None:
    inner = Figures()
    inner.add("rps", 10.0, "req/s")
    outer = Figures()
    outer.update(inner, prefix="grpc_")
    assert "grpc_rps" in outer
    assert outer["grpc_rps"] == 10.0


def test_nan_survives() -> None:
    figures = Figures()
    figures.add("missing", float("nan"))
    assert math.isnan(float(figures["missing"]))


def parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog="scenario")


def test_run_writes_json_and_exits_0_when_goals_miss(tmp_path: Path) -> None:
    def measure(args: argparse.Namespace) -> Figures:
        figures = Figures()
        figures.at_least("speedup", 1.0, 2)  # missed: reported, not a failure
        figures.check("ok", True)
        return figures

    path = tmp_path / "f.json"
    assert run(measure, parser(), ["--json", str(path)]) == 0
    document = json.loads(path.read_text())
    assert document["scenario"] == "scenario"
    assert [(f["name"], f["value"], f["met"]) for f in document["figures"]] == [
        ("speedup", 1.0, False),
        ("ok", True, None),
    ]


def test_run_exits_1_on_a_failed_check_or_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    def failing_check(args: argparse.Namespace) -> Figures:
        figures = Figures()
        figures.check("answers_equal", False)
        return figures

    def raising(args: argparse.Namespace) -> Figures:
        raise RuntimeError("server did not start")

    assert run(failing_check, parser(), []) == 1
    assert "scenario: checks failed: answers_equal" in capsys.readouterr().out
    assert run(raising, parser(), []) == 1
    assert "scenario: RuntimeError: server did not start" in capsys.readouterr().out
