"""The process-worker benchmarks still run: each script's --quick smoke run, as a user would
start it. Numbers are not asserted (these machines are noisy); the shape of the report is.
The runs of the tests selected start when the module does, two at a time, in the tests'
order (``started``, tests/e2e/conftest.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
RUN_WITHIN_S = 240  # a quick run, beside the one started with it on a busy 2-core box
# a 2-node Ray cluster and Serve start and stop: ~40 s on 2 cores that are otherwise idle,
# over 190 s beside two busy loops
RAY_WITHIN_S = 390


def run_of(test: pytest.Function, folder: Path) -> tuple[list[str], float]:
    """``python benchmarks/SCRIPT --quick --cpus none`` of the run ``test`` checks."""
    if test.originalname == "test_ray_scale_quick_run":
        script, timeout = "ray_scale.py", RAY_WITHIN_S
    else:
        script, timeout = test.callspec.params["script"], RUN_WITHIN_S
    return [sys.executable, str(BENCHMARKS / script), "--quick", "--cpus", "none"], timeout


@pytest.mark.slow
@pytest.mark.timeout(RUN_WITHIN_S + 30)  # its wait is for its own run alone
@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("transport.py", ["pipe floor", "32x512 FP32 round trip = ", "minilm round trip = "]),
        ("process_workers.py", ["2 threads", "2 processes", "processes/threads = "]),
        ("worker_faults.py", ["fault-free", "goodput faulty/fault-free = ", "lost requests: 0"]),
        ("process_http.py", ["thread ", "process ", "process/thread throughput = "]),
    ],
)
def test_benchmark_quick_run(script: str, expected: list[str], out: str) -> None:
    for text in expected:
        assert text in out, out[-2000:]
    assert "worker restarts 0, retried 0" in out or script != "process_workers.py"
    if script == "worker_faults.py":  # the faulty run really killed workers, each restarted
        faulty = next(line.split() for line in out.splitlines() if line.startswith("faulty"))
        killed, restarts = int(faulty[5]), int(faulty[6])
        assert killed >= 1, out[-2000:]
        assert restarts == killed, out[-2000:]
    assert "process_http: " not in out  # how process_http.py reports a failure


@pytest.mark.slow
@pytest.mark.timeout(RAY_WITHIN_S + 10)
def test_ray_scale_quick_run(out: str) -> None:
    for text in [
        "cluster: 2 nodes on 127.0.0.1",
        "carpool/Serve",
        "carpool scale-out efficiency at 2 actors = ",
        "goodput after kill / fault-free = ",
        "lost 0 (goal 0: met)",
        "processes left: 0",
    ]:
        assert text in out, out[-3000:]
