"""The protocols benchmarks still run: each scenario's --quick run, as a user starts it; its
figures' names and types and its checks are asserted, never its numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.conftest import scenario, shape

# A quick run's bound: 20-40 s of torch imports in three processes on a busy 2-core box,
# beside the run started with it.
RUN_WITHIN_S = 240

pytestmark = [
    pytest.mark.slow,  # each runs a scenario, most of them servers: seconds each
    pytest.mark.timeout(RUN_WITHIN_S + 30),  # its wait is for its own run alone
]

# Each test's run: the scenario's module and its arguments.
RUNS: dict[str, tuple[str, ...]] = {
    "test_throughput_quick_run": ("throughput",),
    "test_http_batching_quick_run": ("http_batching",),
    "test_http_profile_quick_run": ("http_profile",),
    "test_grpc_batching_quick_run": ("grpc_batching",),
    "test_frontend_cpu_quick_run": ("frontend_cpu",),
    "test_body_memory_quick_run": ("body_memory",),
}


def run_of(test: pytest.Function, folder: Path) -> tuple[list[str], float]:
    """``python -m benchmarks.protocols.SCENARIO --quick ...`` of the run ``test`` checks."""
    module, *args = RUNS[test.originalname]
    return scenario(f"benchmarks.protocols.{module}", folder, *args), RUN_WITHIN_S


def floats(*names: str) -> dict[str, str]:
    return dict.fromkeys(names, "float")


def ints(*names: str) -> dict[str, str]:
    return dict.fromkeys(names, "int")


def errors(figures: dict[str, object]) -> set[object]:
    """The values of the figures counting failed requests: {0} in a sound run."""
    return {value for name, value in figures.items() if "errors" in name}


def test_throughput_quick_run(figures: dict[str, object]) -> None:
    protocols = ("grpc", "rest_binary", "rest_json")
    servers = ("carpool", "fastapi")
    assert shape(figures) == {
        **floats(*(f"{p}_{what}_{c}" for p in protocols
                   for what in ("req_per_s", "p50_ms", "p99_ms") for c in (1, 64))),
        **ints(*(f"{p}_errors" for p in protocols)),
        **floats(*(f"grpc_over_rest_{other}_{c}" for other in ("binary", "json") for c in (1, 64))),
        "embeddings_equal": "bool",
        **floats(*(f"{s}_embeddings_{what}" for s in servers
                   for what in ("req_per_s", "p50_ms", "p99_ms"))),
        **ints(*(f"{s}_embeddings_errors" for s in servers)),
        **floats("carpool_embeddings_mean_batch", "carpool_over_fastapi_embeddings"),
    }  # fmt: skip
    assert figures["embeddings_equal"] is True
    assert errors(figures) == {0}


def test_http_batching_quick_run(figures: dict[str, object]) -> None:
    per_server = ("req_per_s", "p50_ms", "p99_ms")
    assert shape(figures) == {
        **floats("model_ms_1_row", "model_ms_32_rows"),
        "carpool_answers_ok": "bool",
        "plain_answers_ok": "bool",
        "instant_answers_ok": "bool",
        **floats(*(f"rest_json_instant_req_per_s_{c}" for c in (1, 64))),
        **floats(*(f"rest_json_{s}_{what}_{c}" for s in ("carpool", "plain")
                   for what in per_server for c in (1, 64))),
        **floats(*(f"rest_json_{what}_{c}" for c in (1, 64) for what in
                   ("mean_batch", "carpool_over_plain", "p50_ms_carpool_minus_plain"))),
        "errors": "int",
    }  # fmt: skip
    assert figures["carpool_answers_ok"] is True
    assert figures["plain_answers_ok"] is True
    assert figures["instant_answers_ok"] is True
    assert errors(figures) == {0}


def test_http_profile_quick_run(figures: dict[str, object]) -> None:
    assert shape(figures) == {
        **floats("req_per_s", "us_per_request_running", "us_per_request_waiting"),
        **ints("errors", "samples", "requests_profiled"),
    }
    assert errors(figures) == {0}
    for name in ("samples", "requests_profiled"):  # the load ran while py-spy recorded
        count = figures[name]
        assert isinstance(count, int)
        assert count > 0


def test_grpc_batching_quick_run(figures: dict[str, object]) -> None:
    assert shape(figures) == {
        "bursts_all_counted": "bool",
        **floats(*(f"burst_{model}_{what}" for model in ("double", "double_2ms") for what in
                   ("grpc_mean_batch", "rest_binary_mean_batch",
                    "grpc_over_rest_binary_batch"))),
        **floats(*(f"{p}_{what}_{c}" for p in ("grpc", "rest_binary")
                   for what in ("req_per_s", "mean_batch") for c in (1, 64))),
        **floats(*(f"grpc_over_rest_binary_{what}_{c}" for what in ("req_per_s", "batch")
                   for c in (1, 64))),
    }  # fmt: skip
    assert figures["bursts_all_counted"] is True


def test_frontend_cpu_quick_run(figures: dict[str, object]) -> None:
    protocols = ("rest_json", "rest_binary", "grpc", "embeddings")
    per_run = ("req_per_s", "ref_req_per_s", "us_per_request", "ref_us_per_request", "over_ref")
    assert shape(figures) == {
        **dict.fromkeys((f"{p}_answers_equal" for p in protocols), "bool"),
        **floats(*(f"{p}_{what}_{c}" for p in protocols for what in per_run for c in (1, 64))),
        **ints(*(f"{p}_errors_{c}" for p in protocols for c in (1, 64))),
    }
    for protocol in protocols:
        assert figures[f"{protocol}_answers_equal"] is True
    assert errors(figures) == {0}


def test_body_memory_quick_run(figures: dict[str, object]) -> None:
    ways = ("rest_json", "rest_binary", "grpc_raw", "grpc_fp32", "grpc_bytes")
    assert shape(figures) == {
        **floats(*(f"{way}_{what}_1mib" for way in ways
                   for what in ("growth_over_body", "ms_to_answer"))),
        "answers_right": "bool",
    }  # fmt: skip
    assert figures["answers_right"] is True
