"""The workers benchmarks still run: each scenario's --quick run, as a user starts it; its
figures' names and types and its checks are asserted, never its numbers. The runs of the
tests selected start when the module does, two at a time (``started``, conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.conftest import scenario, shape

RUN_WITHIN_S = 240  # a quick run, beside the one started with it on a busy 2-core box
# a 2-node Ray cluster and Serve start and stop: ~40 s on 2 cores that are otherwise idle,
# over 190 s beside two busy loops
RAY_WITHIN_S = 390
SCENARIOS = {  # test -> module, timeout
    "test_transport_quick_run": ("benchmarks.workers.transport", RUN_WITHIN_S),
    "test_gil_bound_quick_run": ("benchmarks.workers.gil_bound", RUN_WITHIN_S),
    "test_faults_quick_run": ("benchmarks.workers.faults", RUN_WITHIN_S),
    "test_over_http_quick_run": ("benchmarks.workers.over_http", RUN_WITHIN_S),
    "test_ray_scale_quick_run": ("benchmarks.workers.ray_scale", RAY_WITHIN_S),
}


def run_of(test: pytest.Function, folder: Path) -> tuple[list[str], float]:
    """The quick run of the scenario ``test`` checks, and how long it may take."""
    module, timeout = SCENARIOS[test.originalname]
    return scenario(module, folder), timeout


@pytest.mark.slow
@pytest.mark.timeout(RUN_WITHIN_S + 30)  # its wait is for its own run alone
def test_transport_quick_run(figures: dict[str, object]) -> None:
    assert shape(figures) == {
        "pipe_floor_us": "float",
        "pipe_floor_p90_us": "float",
        "copies_dense_us": "float",
        "copies_dense_p90_us": "float",
        "dense_round_trip_us": "float",
        "dense_round_trip_p90_us": "float",
        "copies_minilm_us": "float",
        "copies_minilm_p90_us": "float",
        "minilm_round_trip_us": "float",
        "minilm_round_trip_p90_us": "float",
        "dense_round_trip_above_floor_us": "float",
    }


@pytest.mark.slow
@pytest.mark.timeout(RUN_WITHIN_S + 30)
def test_gil_bound_quick_run(figures: dict[str, object]) -> None:
    assert shape(figures) == {
        "threads_rows_per_s": "float",
        "processes_rows_per_s": "float",
        "threads_cores_busy": "float",
        "processes_cores_busy": "float",
        "processes_over_threads": "float",
        "processes_over_threads_per_core": "float",
        "processes_mean_batch": "float",
        "worker_restarts": "int",
        "retried_batches": "int",
    }
    assert figures["worker_restarts"] == 0  # nothing killed them: none died
    assert figures["retried_batches"] == 0


@pytest.mark.slow
@pytest.mark.timeout(RUN_WITHIN_S + 30)
def test_faults_quick_run(figures: dict[str, object]) -> None:
    assert shape(figures) == {
        "fault_free_rows_per_s": "float",
        "faulty_rows_per_s": "float",
        "faulty_over_fault_free": "float",
        "faulty_sent": "int",
        "faulty_errors": "int",
        "killed": "int",
        "restarts": "int",
        "retried_batches": "int",
        "fault_free_restarts": "int",
        "none_lost": "bool",
        "books_agree": "bool",
    }
    killed = figures["killed"]
    assert isinstance(killed, int)
    assert killed >= 1  # the faulty run really killed workers, each restarted
    assert figures["restarts"] == killed
    assert figures["fault_free_restarts"] == 0
    assert figures["none_lost"] is True
    assert figures["books_agree"] is True


@pytest.mark.slow
@pytest.mark.timeout(RUN_WITHIN_S + 30)
def test_over_http_quick_run(figures: dict[str, object]) -> None:
    assert shape(figures) == {
        "thread_req_per_s_64": "float",
        "thread_p50_ms_64": "float",
        "thread_p99_ms_64": "float",
        "thread_mean_batch_64": "float",
        "thread_errors": "int",
        "process_req_per_s_64": "float",
        "process_p50_ms_64": "float",
        "process_p99_ms_64": "float",
        "process_mean_batch_64": "float",
        "process_errors": "int",
        "process_over_thread_64": "float",
    }


@pytest.mark.slow
@pytest.mark.timeout(RAY_WITHIN_S + 10)
def test_ray_scale_quick_run(figures: dict[str, object]) -> None:
    assert shape(figures) == {
        "cluster_nodes": "int",
        "carpool_rows_per_s_1": "float",
        "carpool_mean_batch_1": "float",
        "carpool_cores_1": "float",
        "serve_rows_per_s_1": "float",
        "serve_mean_batch_1": "float",
        "serve_cores_1": "float",
        "carpool_over_serve_1": "float",
        "carpool_rows_per_s_2": "float",
        "carpool_efficiency_2": "float",
        "carpool_mean_batch_2": "float",
        "carpool_cores_2": "float",
        "serve_rows_per_s_2": "float",
        "serve_efficiency_2": "float",
        "serve_mean_batch_2": "float",
        "serve_cores_2": "float",
        "carpool_over_serve_2": "float",
        "carpool_mean_batch_2_over_1": "float",
        "serve_late_probes": "int",
        "fault_free_rows_per_s": "float",
        "after_kill_rows_per_s": "float",
        "after_kill_over_fault_free": "float",
        "back_after_s": "float",
        "restarts": "int",
        "retried_batches": "int",
        "sent": "int",
        "answered": "int",
        "errors": "int",
        "lost": "int",
        "every_request_ended": "bool",
        "processes_left": "int",
    }
    assert figures["cluster_nodes"] == 2  # --quick: 2 nodes, both on 127.0.0.1
    assert figures["lost"] == 0
    assert figures["every_request_ended"] is True
    assert figures["processes_left"] == 0
