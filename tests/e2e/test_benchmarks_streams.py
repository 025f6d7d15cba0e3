"""The streams benchmarks still run: each scenario's --quick run, as a user starts it; its
figures' names and types and its checks are asserted, never its numbers."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from benchmarks.streams._http_systems import LITSERVE_PYTHON, SETUP_LITSERVE

from e2e.conftest import scenario, shape

# A quick run's bound: about 60 s alone (eight 0.9 s closed loops in process, eight over
# HTTP, LitServe's batches drained after each of its cells, Ray's import, 1000
# cancellations), several times that on a busy 2-core box beside the run started with it.
RUN_WITHIN_S = 420

pytestmark = [
    pytest.mark.slow,  # runs a scenario: seconds
    pytest.mark.timeout(RUN_WITHIN_S + 30),  # its wait is for its own run alone
]


def run_of(test: pytest.Function, folder: Path) -> tuple[list[str], float]:
    """``python -m benchmarks.streams.synthetic --quick ...``, LitServe's venv made first (a
    peer, never a carpool dependency: pip installs it there, ~15 s), the servers unpinned."""
    if not LITSERVE_PYTHON.is_file():
        subprocess.run(SETUP_LITSERVE.split(), check=True, timeout=RUN_WITHIN_S)
    return scenario("benchmarks.streams.synthetic", folder, "--server-cpus", ""), RUN_WITHIN_S


def floats(*names: str) -> dict[str, str]:
    return dict.fromkeys(names, "float")


def test_synthetic_quick_run(figures: dict[str, object]) -> None:
    systems = ("carpool", "static", "ray", "carpool_http", "litserve")
    per_clients = [f"{s}_outputs_per_s_{n}" for n in (1, 8, 32, 128) for s in systems]
    checks = ("outputs_exact", "http_outputs_exact", "cancel_slots_freed",
              "cancel_outputs_exact", "cancel_counts_add_up")  # fmt: skip
    assert shape(figures) == {
        **floats("serial_outputs_per_s", *per_clients, "offline_limit_outputs_per_s"),
        **floats(
            "carpool_over_offline_limit",
            "carpool_over_static",
            "carpool_over_ray",
            "mean_active_over_max",
        ),
        "outputs_exact": "bool",
        "carpool_http_over_litserve": "float",
        "http_outputs_exact": "bool",
        **floats(
            "lone_first_output_ms",
            "serial_first_output_ms",
            "lone_first_output_minus_serial_ms",
            "own_us_per_sequence_step",
            "own_cpu_us_per_sequence_step",
            "burst_p99_gap_during_over_before",
            "burst_p99_gap_during_over_before_unchunked",
        ),
        **dict.fromkeys(checks[2:], "bool"),
    }
    assert all(figures[name] is True for name in checks)
