"""The server benchmarks still run: each scenario's --quick run, as a user starts it; its
figures' names and types and its checks are asserted, never its numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.conftest import scenario, shape

# A quick run's bound: servers importing carpool on a busy 2-core box, beside the run
# started with it.
RUN_WITHIN_S = 240

pytestmark = [
    pytest.mark.slow,  # each runs a scenario, most of them servers: seconds each
    pytest.mark.timeout(RUN_WITHIN_S + 30),  # its wait is for its own run alone
]

# Each test's scenario module and its arguments.
RUNS: dict[str, tuple[str, ...]] = {
    "test_frontends_quick_run": ("benchmarks.server.frontends",),
    "test_request_checks_quick_run": ("benchmarks.server.request_checks",),
    "test_api_key_check_quick_run": ("benchmarks.server.api_key_check",),
    "test_response_cache_quick_run": ("benchmarks.server.response_cache",),
    "test_model_control_quick_run": ("benchmarks.server.model_control",),
}


def run_of(test: pytest.Function, folder: Path) -> tuple[list[str], float]:
    """``python -m MODULE --quick --cpus none --json ... ARGS`` of the run ``test`` checks."""
    module, *args = RUNS[test.originalname]
    return scenario(module, folder, *args), RUN_WITHIN_S


def test_frontends_quick_run(figures: dict[str, object]) -> None:
    expected: dict[str, str] = {}
    for protocol in ("rest_binary", "grpc", "rest_2ms_open_loop"):
        for n in (1, 2):
            at = f"frontends_{n}"
            expected |= {
                f"{protocol}_req_per_s_{at}": "float",
                f"{protocol}_p50_ms_{at}": "float",
                f"{protocol}_mean_batch_{at}": "float",
                f"{protocol}_main_us_{at}": "float",
                f"{protocol}_frontends_us_{at}": "float",
            }
            if n == 2:  # the most front ends: the goals on the main process and their share
                expected[f"{protocol}_frontends_share_{at}"] = "float"
            expected[f"{protocol}_errors_{at}"] = "int"
        expected[f"{protocol}_mean_batch_2_over_1"] = "float"
    assert shape(figures) == expected


def test_request_checks_quick_run(figures: dict[str, object]) -> None:
    assert shape(figures) == {
        "headers_twice_us": "float",
        "json_array_cut_us": "float",
        "grpc_walk_us": "float",
        "preprocess_size_test_us": "float",
        "server_count_us": "float",
        "checks_together_us": "float",
    }


def test_api_key_check_quick_run(figures: dict[str, object]) -> None:
    expected = {
        f"{case}_us_{keys}": "float"
        for keys in ("1_key", "3_keys")
        for case in ("bearer_right", "x_api_key_right", "x_api_key_wrong", "no_key")
    }
    assert shape(figures) == {**expected, "worst_us": "float"}


def test_response_cache_quick_run(figures: dict[str, object]) -> None:
    measured = {
        f"{load}_{what}_{server}": "float"
        for load, servers in (
            ("hits", ("cached", "uncached", "floor")),
            ("half", ("cached", "uncached")),
            ("misses", ("cached", "uncached")),
        )
        for server in servers
        for what in ("req_per_s", "p50_ms", "server_us")
    }
    assert shape(figures) == {
        "answers_equal_cached": "bool",
        "answers_equal_uncached": "bool",
        **measured,
        "hit_over_computed_cpu": "float",
        "path_hit_us": "float",
        "path_computed_us": "float",
        "path_hit_over_computed": "float",
        "half_repeated_speedup": "float",
        "miss_cpu_cached_over_uncached": "float",
        "half_repeated_cpu_uncached_over_cached": "float",
        "floor_over_computed_cpu": "float",
        "half_repeated_speedup_bound": "float",
    }
    assert figures["answers_equal_cached"] is True
    assert figures["answers_equal_uncached"] is True


def test_model_control_quick_run(figures: dict[str, object]) -> None:
    memory = {}
    for model in ("big", "bigproc"):
        memory |= {
            f"rss_before_mb_{model}": "float",
            f"rss_loaded_mb_{model}": "float",
            f"rss_after_unload_mb_{model}": "float",
            f"rss_after_over_before_{model}": "float",
            f"workers_loaded_{model}": "int",
            f"workers_after_unload_{model}": "int",
        }
    assert shape(figures) == {
        "req_per_s_steady": "float",
        "p99_ms_steady": "float",
        "req_per_s_reloading": "float",
        "p99_ms_reloading": "float",
        "reloads": "int",
        "failed_during_reloads": "int",
        "p99_reloading_over_steady": "float",
        **memory,
    }
