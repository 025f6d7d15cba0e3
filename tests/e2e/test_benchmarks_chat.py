"""The chat benchmark still runs: its --quick run, as a user starts it, with carpool alone (its
peers left out: a CI machine has neither llama-cpp-python's server extras nor a built
llama-server) measured by the scenario's own client; its figures' names and types and its checks are
asserted, never its numbers. aiperf (its venv made by benchmarks/streams/setup_aiperf.sh
when missing, never a carpool dependency) completes a short run against smollm2, no error."""

from __future__ import annotations

import math
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from benchmarks.streams import _chat_aiperf, _chat_prompts

from e2e.conftest import REPO, scenario, shape
from server.conftest import Launcher, Server

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
    """The quick run ``test`` checks: its argv and its timeout."""
    runs = {
        "test_chat_quick_run": scenario(
            "benchmarks.streams.chat", folder, "--peers", "none", "--tools", "client"
        ),
    }
    return runs[test.originalname], RUN_WITHIN_S


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


# ----------------------------------------------------------------------------- aiperf


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    launcher = Launcher(tmp_path_factory.mktemp("servers"))
    yield launcher("smollm2")
    launcher.close()


@pytest.fixture(scope="module")
def aiperf() -> None:
    """aiperf's venv and SmolLM2's tokenizer for it, made once a checkout (git-ignored)."""
    if _chat_aiperf.missing():
        setup = REPO / "benchmarks" / "streams" / "setup_aiperf.sh"
        done = subprocess.run(["bash", str(setup)], capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert _chat_aiperf.missing() == ""


@pytest.mark.timeout(1200)  # the venv's first setup: pip installs aiperf
def test_aiperf_completes_a_short_run_without_errors(
    aiperf: None, smollm2: Server, tmp_path: Path
) -> None:
    inputs, system = _chat_prompts.write_aiperf(tmp_path, "unrelated", 0)
    # Two conversations for 1 s (each stream read to its end): a 300-token prompt prefills in
    # seconds on a busy box.
    argv = _chat_aiperf.argv(smollm2.url, "smollm2", 2, 0.0, 1.0, inputs, system, tmp_path / "out")
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    cell = _chat_aiperf.cell_of(_chat_aiperf.read_export(tmp_path / "out"))
    assert cell.errors == 0
    assert cell.tokens_per_s > 0
    assert 0 < cell.ttft_p50_ms <= cell.ttft_p99_ms
