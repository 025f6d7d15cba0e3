"""The embeddings benchmarks still run: each scenario's --quick run, as a user starts it; its
figures' names and types and its checks are asserted, never its numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.conftest import scenario, shape

# A quick run's bound: 20-40 s of torch imports in three processes on a busy 2-core box,
# beside the run started with it.
RUN_WITHIN_S = 240
CELLS = ("short_x1_1", "short_x1_64", "long_x1_1", "long_x1_64")
GRAPHS = ("fp32", "int8", "int7")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(RUN_WITHIN_S + 30)]


def run_of(test: pytest.Function, folder: Path) -> tuple[list[str], float]:
    """The quick run ``test`` checks: its argv and its timeout."""
    runs = {
        # infinity-emb, where benchmarks/.venv-embeddings has it, is left out: its two servers
        # and the ONNX export import torch beside carpool's three processes (half the run),
        # and what this checks is carpool's side of the report.
        "test_peers_quick_run": scenario(
            "benchmarks.embeddings.peers", folder, "--infinity-engines", "none"
        ),
        "test_int8_cpus_quick_run": scenario("benchmarks.embeddings.int8_cpus", folder),
    }
    return runs[test.originalname], RUN_WITHIN_S


def test_peers_quick_run(figures: dict[str, object]) -> None:
    carpool = {
        f"carpool_{what}_{cell}": "float"
        for cell in CELLS
        for what in ("req_per_s", "p99_ms", "mean_batch", "padding")
    }
    fastapi = {
        f"fastapi_{what}_{cell}": "float" for cell in CELLS for what in ("req_per_s", "p99_ms")
    }
    assert shape(figures) == {
        "carpool_answers_match": "bool",
        "fastapi_answers_match": "bool",
        "infinity_servers_run": "int",
        "offline_texts_per_s_short": "float",
        "offline_texts_per_s_long": "float",
        **carpool,
        "carpool_errors": "int",
        **fastapi,
        "fastapi_errors": "int",
        "carpool_over_fastest_infinity_short_64": "float",
        "carpool_over_fastapi_short_64": "float",
        "carpool_over_offline_short_64": "float",
        "carpool_over_infinity_torch_long_64": "float",
    }
    assert figures["carpool_answers_match"] is True
    assert figures["fastapi_answers_match"] is True
    assert figures["infinity_servers_run"] == 0
    assert figures["carpool_errors"] == figures["fastapi_errors"] == 0


def test_int8_cpus_quick_run(figures: dict[str, object]) -> None:
    cosines = {
        f"{graph}_{where}_{what}_cosine": "float"
        for graph in GRAPHS
        for where in ("alone", "mixed")
        for what in ("worst", "median")
    }
    speed = {f"{graph}_ms_per_batch_32": "float" for graph in GRAPHS}
    speedups = {f"{graph}_speedup_over_fp32": "float" for graph in GRAPHS[1:]}
    assert shape(figures) == {**cosines, **speed, **speedups}
