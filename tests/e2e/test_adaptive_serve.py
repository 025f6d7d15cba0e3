"""``--policy adaptive`` in the server: requests that cannot make the objective get a 503 at
once, counted apart; what the policy learned shows in ``/stats``, ``/metrics`` and the log."""

from __future__ import annotations

from typing import Any

import pytest

from server.conftest import Server, json_tensor

BODY = {"inputs": [json_tensor("INPUT0", "FP32", [1, 2], [1.0, 2.0])]}


@pytest.fixture(scope="module")
def server(serve_module: Any) -> Server:
    # The objective from the command line: 5 ms, below one 20 ms batch.
    return serve_module("models:deliberate", "--latency-slo-ms", "5")  # type: ignore[no-any-return]


def test_a_request_that_cannot_make_the_objective_is_refused_at_once(server: Server) -> None:
    refused = server.infer("deliberate", BODY)
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "1"
    message = refused.json()["error"]
    assert message.startswith("Overloaded: 0 rows queued ahead; this request would finish in")
    assert message.endswith(
        "past its 5 ms latency objective. Retry later, relax the objective, or add workers."
    )
    stats = server.stats("deliberate")
    assert stats["inference_count"] == 0  # refused at the door: the model never ran it
    assert stats["execution_count"] == 0
    assert stats["adaptive"]["cost"]["batches"] == 6  # only the start-up profile's
    assert stats["adaptive"]["overloaded"] == 1


def test_a_request_timeout_cannot_loosen_the_objective(server: Server) -> None:
    body = {**BODY, "parameters": {"timeout": 10_000_000}}  # 10 s, in microseconds
    assert server.infer("deliberate", body).status_code == 503


def test_stats_metrics_and_log_show_what_the_policy_learned(server: Server) -> None:
    adaptive = server.stats("deliberate")["adaptive"]
    assert adaptive["latency_slo_ms"] == 5.0
    cost = adaptive["cost"]
    assert 20.0 <= cost["fixed_ms"] + cost["per_row_ms"] < 200.0  # one 20 ms batch
    assert cost["batches"] == 6  # the start-up profile: sizes 1, 2, 4, twice
    assert server.metric("carpool_overloaded_total", model="deliberate") >= 1
    assert server.metric("carpool_cost_seconds", model="deliberate", term="fixed") >= 0
    log = server.stderr()
    assert "batcher 'deliberate': policy adaptive, objective 5 ms: t(b) = " in log
    assert "below the time of one batch" in log
