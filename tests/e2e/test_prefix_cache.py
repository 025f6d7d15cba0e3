"""``carpool serve --prefix-cache-size`` on a real server: the budget reaches each replica's
model (threads and child processes; from the flag, the config file or the variable), the
reuse counts show in ``/metrics`` exactly (one process, and ``--frontends 2``), a model that
cannot reuse says so once at start, and 0 turns it off."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.test_frontends import FRONTENDS
from server.conftest import Launcher, Server

pytestmark = pytest.mark.slow

NO_REUSE = "cannot reuse prompt state"
# one replica: a miss (3 computed), a hit (3 reused, 1 computed), a miss (1 computed)
PROMPTS = ["a b c", "a b c d", "z"]


def generate(server: Server, text: str) -> str:
    response = server.http.post("/v2/models/prompts/generate", json={"text_input": text})
    assert response.status_code == 200, response.text
    return str(response.json()["text_output"])


def prefix_samples(server: Server, model: str) -> list[str]:
    return [
        line
        for line in server.metrics().splitlines()
        if line.startswith("carpool_prefix_cache_") and f'model="{model}"' in line
    ]


def check_exact_counts(server: Server, budget: int) -> None:
    assert [generate(server, text) for text in PROMPTS] == [
        f"budget={budget} reused=0 computed=3",
        f"budget={budget} reused=3 computed=1",
        f"budget={budget} reused=0 computed=1",
    ]
    assert server.metric("carpool_prefix_cache_hits_total", model="prompts") == 1
    tokens = "carpool_prefix_cache_tokens_total"
    assert server.metric(tokens, kind="reused", model="prompts") == 3
    assert server.metric(tokens, kind="computed", model="prompts") == 5
    assert prefix_samples(server, "words") == []  # it cannot reuse


def test_one_process_counts_exactly_and_names_the_model_that_cannot(serve: Launcher) -> None:
    server = serve("step_models:prompts", "step_models:words", "--prefix-cache-size", "1000")
    check_exact_counts(server, 1000)
    log = server.stderr()
    assert log.count(NO_REUSE) == 1
    assert "model words cannot reuse prompt state" in log


def test_front_ends_show_the_main_processs_counts(serve: Launcher) -> None:
    server = serve("step_models:prompts", "step_models:words", *FRONTENDS)
    check_exact_counts(server, 256 * 1024 * 1024)  # the default


def test_each_process_replica_gets_its_share_from_the_config_file(
    serve: Launcher, tmp_path: Path
) -> None:
    config = tmp_path / "carpool.toml"
    config.write_text("[server]\nprefix_cache_size = 1001\n")
    server = serve(
        "step_models:prompts", "--config", str(config), "--workers", "2", "--runner", "process"
    )
    answers = [generate(server, text) for text in PROMPTS * 2]
    assert {answer.split()[0] for answer in answers} == {"budget=500"}
    # each answer's own reuse, on whichever replica it ran, adds up to the sums
    reused = sum(int(a.split()[1].partition("=")[2]) for a in answers)
    hits = sum(1 for a in answers if "reused=0" not in a)
    assert server.metric("carpool_prefix_cache_hits_total", model="prompts") == hits
    tokens = "carpool_prefix_cache_tokens_total"
    assert server.metric(tokens, kind="reused", model="prompts") == reused
    assert server.metric(tokens, kind="computed", model="prompts") == 16 - reused


def test_zero_from_the_variable_turns_it_off(serve: Launcher) -> None:
    server = serve(
        "step_models:prompts", "step_models:words", env={"CARPOOL_PREFIX_CACHE_SIZE": "0"}
    )
    assert generate(server, "a b") == "budget=0 reused=0 computed=2"  # never offered a budget
    assert prefix_samples(server, "prompts") == []
    assert NO_REUSE not in server.stderr()
