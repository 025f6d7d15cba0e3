"""The soak, bounded: ``python -m benchmarks.server.soak --duration 12 --interval 3``, and its
books balance exactly.

The 10-minute run's goals (RSS growth, flat fds and tasks, p99 drift) are the benchmark's
verdicts, reported, not asserted here: on a noisy machine a short run says little about them.
What 12 s (thousands of requests of the whole mix) must already show exactly: every
request sent to the model counted once by the server, the batcher's outcomes summing to what
it received, nothing lost or left in flight, no unexpected status.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from e2e.conftest import shape

SECONDS = 12  # of soak: every kind of the mix (cancelled, expired, 4xx) happens many times
ROW_EVERY = 3  # seconds between the table's rows
RUN_WITHIN_S = 140  # 12 s of soak, a capacity step, a server start and drain

CHECKS = (
    "server_counted_every_request",
    "answers_under_their_status",
    "batcher_books_balance",
    "unavailable_are_expired_or_rejected",
    "nothing_left_in_flight",
    "nothing_lost",
    "no_unexpected_answer",
)
OUTCOMES = ("ok", "expired", "queue_full", "refused", "cancelled", "wrong_answer",
            "unexpected_status", "lost")  # fmt: skip


def run_of(test: pytest.Function, folder: Path) -> tuple[list[str], float]:
    """The soak for SECONDS, a row every ROW_EVERY, its figures written to ``folder``."""
    argv = [sys.executable, "-m", "benchmarks.server.soak", "--cpus", "none",
            "--duration", str(SECONDS), "--interval", str(ROW_EVERY),
            "--json", str(folder / "figures.json")]  # fmt: skip
    return argv, RUN_WITHIN_S


@pytest.mark.slow
@pytest.mark.timeout(RUN_WITHIN_S + 10)
def test_a_short_soak_accounts_for_every_request(figures: dict[str, object]) -> None:
    goals = {
        "rss_mb_first": "float",
        "rss_mb_end": "float",
        "rss_growth": "float",
        "fds_mean_first": "float",
        "fds_mean_last": "float",
        "files_max_first": "int",
        "files_max_last": "int",
        "fds_idle_before": "int",
        "fds_idle_after": "int",
        "fds_flat": "bool",
        "tasks_mean_first": "float",
        "tasks_mean_last": "float",
        "tasks_idle_before": "float",
        "tasks_idle_after": "float",
        "tasks_flat": "bool",
        "p99_ms_first": "float",
        "p99_ms_last": "float",
        "p99_last_over_first": "float",
        "client_send_lag_p99_ms": "float",
    }
    assert shape(figures) == {
        "capacity_req_per_s": "float",
        "capacity_server_cpu": "float",
        "soak_req_per_s": "float",
        "table_rows": "int",
        "last_row_s": "float",
        "samples": "int",
        **goals,
        **dict.fromkeys(CHECKS[:5], "bool"),
        **{f"requests_{outcome}": "int" for outcome in OUTCOMES},
        "server_5xx_not_503": "int",
        **dict.fromkeys(CHECKS[5:], "bool"),
        "server_exit_code": "int",
    }
    for check in CHECKS:
        assert figures[check] is True, check
    assert figures["requests_lost"] == 0
    assert figures["requests_wrong_answer"] == figures["requests_unexpected_status"] == 0
    assert figures["server_5xx_not_503"] == 0
    assert figures["server_exit_code"] == 0
    # the table: a row every 3 s, the last at the end; the server sampled every second
    assert figures["table_rows"] == SECONDS // ROW_EVERY
    assert figures["last_row_s"] == SECONDS
    assert figures["samples"] == SECONDS
    for outcome in ("cancelled", "expired", "refused"):  # the mix happened
        assert figures[f"requests_{outcome}"] > 0, outcome
