"""The process-worker benchmarks still run: each script's --quick smoke run, as a user would
start it. Numbers are not asserted (these machines are noisy); the shape of the report is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("transport.py", ["pipe floor", "32x512 FP32 round trip = ", "minilm round trip = "]),
        ("process_workers.py", ["2 threads", "2 processes", "processes/threads = "]),
        ("worker_faults.py", ["fault-free", "goodput faulty/fault-free = ", "lost requests: 0"]),
        ("process_http.py", ["thread ", "process ", "process/thread throughput = "]),
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
        assert text in done.stdout, done.stdout[-2000:]
    assert "worker restarts 0, retried 0" in done.stdout or script != "process_workers.py"
    assert "process_http: " not in done.stdout  # how process_http.py reports a failure
