"""The cancellations benchmark still runs: its --quick run (a real ``carpool serve``, streams
given up over the library, gRPC and SSE), as a user starts it; its figures' names and types
and its checks are asserted, never its numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.conftest import scenario, shape

# A quick run's bound: about 20 s alone (a server's start, 300 streams a protocol), several
# times that on a busy 2-core box.
RUN_WITHIN_S = 240
PROTOCOLS = ("library", "grpc", "sse")

pytestmark = [
    pytest.mark.slow,  # runs a scenario: seconds
    pytest.mark.timeout(RUN_WITHIN_S + 30),  # its wait is for its own run alone
]


def run_of(test: pytest.Function, folder: Path) -> tuple[list[str], float]:
    """``python -m benchmarks.streams.cancellations --quick ...``."""
    return scenario("benchmarks.streams.cancellations", folder), RUN_WITHIN_S


def test_cancellations_quick_run(figures: dict[str, object]) -> None:
    kinds = {
        "streams": "int",
        "cancelled": "int",
        "completed_exact": "int",
        "wall_s": "float",
        "streams_per_s": "float",
        "max_steps_to_free": "int",
        "freed_late": "int",
        "active_zero_ms": "float",
        "delivery_p50_ms": "float",
        "delivery_p99_ms": "float",
        "never_reached_server": "int",
        "outputs_exact": "bool",
        "active_back_to_zero": "bool",
        "nothing_lost": "bool",
    }
    assert shape(figures) == {
        f"{p}_{name}": kind for p in PROTOCOLS for name, kind in kinds.items()
    }
    checks = ("outputs_exact", "active_back_to_zero", "nothing_lost")
    assert {f"{p}_{c}": figures[f"{p}_{c}"] for p in PROTOCOLS for c in checks} == {
        f"{p}_{c}": True for p in PROTOCOLS for c in checks
    }
    for p in PROTOCOLS:
        assert figures[f"{p}_streams"] == 300
        assert 0 < figures[f"{p}_cancelled"] < 300  # type: ignore[operator]
        assert figures[f"{p}_cancelled"] + figures[f"{p}_completed_exact"] == 300  # type: ignore[operator]
