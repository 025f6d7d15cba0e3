"""The benchmarks still run: each script's --quick smoke run, as a user would start it.

Numbers are not asserted (these machines are noisy); the shape of the report is.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("overhead.py", ["[async] 1000 asyncio tasks, await infer(x)", "carpool/floor = "]),
        ("efficiency.py", ["served/offline", "workers=1 served/offline"]),
        ("low_load.py", ["eager overhead", "fixed"]),
        ("http_bench.py", ["client ceiling", "64 clients: carpool/plain throughput"]),
    ],
)
def test_benchmark_quick_run(script: str, expected: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--quick", "--cpus", "none"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for text in expected:
        assert text in done.stdout


def test_backends_bench_quick_run() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "backends_bench.py"), "--quick", "--cpus", "none"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for text in [
        "[mlp] check: batching ok, unbatched ok",
        "[minilm] check: batching ok, unbatched ok",
        "batching / unbatched",
        "padded/real",
        "no buckets / buckets",
    ]:
        assert text in done.stdout, done.stdout[-3000:]
    assert "failed:" not in done.stdout, done.stdout[-3000:]


def test_adaptive_bench_quick_run(tmp_path: Path) -> None:
    plot = tmp_path / "adaptive.png"
    done = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "adaptive_bench.py"),
            "--quick",
            "--cpus",
            "none",
            "--plot",
            str(plot),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for text in [
        "[sleep] p99 of served requests",
        "[mlp] throughput, and goodput",
        "p99 <= 1.1x best fixed/eager at every load",
        "2x overload: goodput >= 0.9x capacity",
        "2x overload: rejections immediate",
    ]:
        assert text in done.stdout, done.stdout[-3000:]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert plot.stat().st_size > 0
