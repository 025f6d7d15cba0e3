"""The process-worker benchmarks still run: each script's --quick smoke run, as a user would
start it. Numbers are not asserted (these machines are noisy); the shape of the report is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


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
    if script == "worker_faults.py":  # the faulty run really killed workers, each restarted
        faulty = next(
            line.split() for line in done.stdout.splitlines() if line.startswith("faulty")
        )
        killed, restarts = int(faulty[5]), int(faulty[6])
        assert killed >= 1, done.stdout[-2000:]
        assert restarts == killed, done.stdout[-2000:]
    assert "process_http: " not in done.stdout  # how process_http.py reports a failure


@pytest.mark.slow
@pytest.mark.timeout(400)  # a 4-node Ray cluster and Serve start and stop: ~60 s on 2 cores
# that are otherwise idle, over 190 s beside two busy loops
def test_ray_scale_quick_run() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "ray_scale.py"), "--quick", "--cpus", "none"],
        capture_output=True,
        text=True,
        timeout=390,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for text in [
        "cluster: 2 nodes on 127.0.0.1",
        "carpool/Serve",
        "carpool scale-out efficiency at 2 actors = ",
        "goodput after kill / fault-free = ",
        "lost 0 (goal 0: met)",
        "processes left: 0",
    ]:
        assert text in done.stdout, done.stdout[-3000:]
