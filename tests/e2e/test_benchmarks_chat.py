"""The chat benchmark still runs: its --quick run, as a user starts it, with carpool alone (its
peers left out: a CI machine has neither llama-cpp-python's server extras nor a built
llama-server) measured by the scenario's own client; its figures' names and types and its checks are
asserted, never its numbers (aiperf's own short run: test_aiperf_chat.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from e2e.conftest import scenario, shape

# A quick run's bound: two carpool serve smollm2 loading, then 6 cells of 4 s whose streams
# are read to their end, on a busy 2-core box.
RUN_WITHIN_S = 420
SERVERS_SETS = (("carpool", "unrelated"), ("carpool", "shared"), ("carpool_no_reuse", "shared"),
                ("llama_server", "unrelated"), ("llama_server", "shared"),
                ("llama_cpp_python", "unrelated"), ("llama_cpp_python", "shared"))  # fmt: skip
STATS = ("tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "errors")
GOALS = (
    "carpool_over_llama_server_tokens_per_s_16",
    "carpool_over_llama_cpp_python_tokens_per_s_16",
    "carpool_64_over_16_tokens_per_s",
    "shared_ttft_p50_16_reuse_over_no_reuse",
    "ttft_1_carpool_over_llama_server",
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(RUN_WITHIN_S + 30)]


def run_of(test: pytest.Function, folder: Path) -> tuple[list[str], float]:
    """``python -m benchmarks.streams.chat --quick ...``, carpool alone, its own client."""
    argv = scenario("benchmarks.streams.chat", folder, "--peers", "none", "--tools", "client")
    return argv, RUN_WITHIN_S


def test_chat_quick_run(figures: dict[str, object]) -> None:
    cells = {
        f"{tool}_{server}_{prompt_set}_{stat}_{clients}": "float"
        for tool in ("client", "aiperf")
        for server, prompt_set in SERVERS_SETS
        for clients in (1, 16)
        for stat in STATS
    }
    assert shape(figures) == {
        **cells,
        **{f"{tool}_{goal}": "float" for tool in ("client", "aiperf") for goal in GOALS},
        "cells_run": "int",
        "carpool_cells_run": "bool",
        "carpool_zero_errors": "bool",
    }
    assert figures["carpool_cells_run"] is True
    assert figures["carpool_zero_errors"] is True
    assert figures["client_carpool_unrelated_errors_16"] == 0
    for left_out in ("llama_server", "llama_cpp_python"):
        assert math.isnan(figures[f"client_{left_out}_unrelated_tokens_per_s_16"])  # type: ignore[arg-type]
    assert math.isnan(figures["aiperf_carpool_unrelated_tokens_per_s_16"])  # type: ignore[arg-type]
