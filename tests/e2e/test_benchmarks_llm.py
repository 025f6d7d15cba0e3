"""The LLM streams benchmark still runs: its --quick run, as a user starts it, with carpool
alone (its peers left out: a CI machine has neither llama-cpp-python's server extras nor a
built llama-server); its figures' names and types and its checks are asserted, never its
numbers."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from e2e.conftest import scenario, shape

# A quick run's bound: carpool serve smollm2 loading, then 3 cells of 3.5 s whose 16 streams
# prefill together, on a busy 2-core box.
RUN_WITHIN_S = 240
SERVERS = ("carpool_llama", "carpool_torch", "llama_cpp_python", "llama_server")
STATS = ("tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms",
         "tokens_per_stream")  # fmt: skip

pytestmark = [pytest.mark.slow, pytest.mark.timeout(RUN_WITHIN_S + 30)]


def run_of(test: pytest.Function, folder: Path) -> tuple[list[str], float]:
    """``python -m benchmarks.streams.llm --quick ...``, carpool's llama engine alone (the
    torch engine left out too: the llama engine runs the peers' GGUF)."""
    argv = scenario("benchmarks.streams.llm", folder, "--engines", "llama", "--peers", "none")
    return argv, RUN_WITHIN_S


def test_llm_quick_run(figures: dict[str, object]) -> None:
    cells = {
        f"{server}_{stat}_{clients}": "float"
        for server in SERVERS
        for clients in (1, 4, 16)
        for stat in STATS
    }
    assert shape(figures) == {
        **cells,
        "carpool_over_llama_server_tokens_per_s_16": "float",
        "carpool_over_llama_cpp_python_tokens_per_s_16": "float",
        "ttft_1_carpool_over_llama_server": "float",
        "servers_run": "int",
        "streams_failed": "int",
        "every_stream_delivered_tokens": "bool",
        "carpool_llama_greedy_texts_equal": "bool",
    }
    assert figures["servers_run"] == 1
    assert figures["streams_failed"] == 0
    assert figures["every_stream_delivered_tokens"] is True
    assert figures["carpool_llama_greedy_texts_equal"] is True
    for left_out in ("carpool_torch", "llama_cpp_python", "llama_server"):
        assert math.isnan(figures[f"{left_out}_tokens_per_s_16"])  # type: ignore[arg-type]
