"""The streams benchmarks still run: each scenario's --quick run, as a user starts it; its
figures' names and types and its checks are asserted, never its numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.conftest import scenario, shape

# A quick run's bound: about 15 s alone (eight 0.9 s closed loops, Ray's import, 1000
# cancellations), several times that on a busy 2-core box beside the run started with it.
RUN_WITHIN_S = 240

pytestmark = [
    pytest.mark.slow,  # runs a scenario: seconds
    pytest.mark.timeout(RUN_WITHIN_S + 30),  # its wait is for its own run alone
]


def run_of(test: pytest.Function, folder: Path) -> tuple[list[str], float]:
    """``python -m benchmarks.streams.synthetic --quick ...``."""
    return scenario("benchmarks.streams.synthetic", folder), RUN_WITHIN_S


def floats(*names: str) -> dict[str, str]:
    return dict.fromkeys(names, "float")


def test_synthetic_quick_run(figures: dict[str, object]) -> None:
    per_clients = [f"{system}_outputs_per_s_{n}" for n in (1, 8, 32, 128)
                   for system in ("carpool", "static", "ray")]  # fmt: skip
    checks = ("outputs_exact", "cancel_slots_freed", "cancel_outputs_exact",
              "cancel_counts_add_up")  # fmt: skip
    assert shape(figures) == {
        **floats("serial_outputs_per_s", *per_clients, "offline_limit_outputs_per_s"),
        **floats(
            "carpool_over_offline_limit",
            "carpool_over_static",
            "carpool_over_ray",
            "mean_active_over_max",
        ),
        "outputs_exact": "bool",
        **floats(
            "lone_first_output_ms",
            "serial_first_output_ms",
            "lone_first_output_minus_serial_ms",
            "own_us_per_sequence_step",
            "own_cpu_us_per_sequence_step",
            "burst_p99_gap_during_over_before",
            "burst_p99_gap_during_over_before_unchunked",
        ),
        **dict.fromkeys(checks[1:], "bool"),
    }
    assert all(figures[name] is True for name in checks)
