"""The loadgen benchmarks still run: each scenario's --quick run, as a user starts it; its
figures' names and types and its checks are asserted, never its numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.conftest import scenario, shape

RUN_WITHIN_S = 240  # a quick run's bound, beside the run started with it on a busy 2-core box

pytestmark = [pytest.mark.slow, pytest.mark.timeout(RUN_WITHIN_S + 30)]


def run_of(test: pytest.Function, folder: Path) -> tuple[list[str], float]:
    """The quick run ``test`` checks: its argv and its timeout."""
    runs = {
        "test_ceiling_quick_run": scenario("benchmarks.loadgen.ceiling", folder),
        "test_demo_curve_quick_run": scenario(
            "benchmarks.loadgen.demo_curve",
            folder,
            "--out",
            str(folder),
            "--plot",
            str(folder / "curve.png"),
        ),
    }
    return runs[test.originalname], RUN_WITHIN_S


def test_ceiling_quick_run(figures: dict[str, object]) -> None:
    assert shape(figures) == {
        "req_per_s_1_proc_64": "float",
        "p50_ms_1_proc_64": "float",
        "server_cpu_1_proc_64": "float",
        "req_per_s_2_proc_64": "float",
        "p50_ms_2_proc_64": "float",
        "server_cpu_2_proc_64": "float",
        "two_over_one_proc_64": "float",
        "errors_64": "int",
        "ceiling_req_per_s": "float",
        "ceiling_clients": "int",
        "ceiling_processes": "int",
    }
    assert figures["ceiling_clients"] == 64
    assert figures["ceiling_processes"] in (1, 2)


def test_demo_curve_quick_run(figures: dict[str, object], out: str, folder: Path) -> None:
    assert shape(figures) == {
        f"{what}_wait_{w}ms_16": "float"
        for w in (0, 5)
        for what in ("req_per_s", "p99_ms", "mean_batch")
    }
    assert "wait 0 ms vs wait 5 ms" in out, out[-3000:]  # carpool bench --compare's table
    assert sorted(p.name for p in folder.glob("demo-*.json")) == [
        "demo-wait-0ms.json",
        "demo-wait-5ms.json",
    ]
    assert (folder / "curve.png").stat().st_size > 0
