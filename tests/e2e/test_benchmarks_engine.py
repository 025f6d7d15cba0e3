"""The engine benchmarks still run: each scenario's --quick run, as a user starts it; its
figures' names and types and its checks are asserted, never its numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.conftest import scenario, shape

# A quick run's bound: 20-40 s of torch imports in three processes on a busy 2-core box,
# beside the run started with it.
RUN_WITHIN_S = 240

pytestmark = [
    pytest.mark.slow,  # each runs a scenario, some of them servers: seconds each
    pytest.mark.timeout(RUN_WITHIN_S + 30),  # its wait is for its own run alone
]

# Each test's run: the scenario's module and its arguments ("{out}": the test's folder).
RUNS: dict[str, tuple[str, ...]] = {
    "test_overhead_quick_run": ("overhead",),
    "test_efficiency_quick_run": ("efficiency",),
    "test_reform_quick_run": ("reform",),
    "test_low_load_quick_run": ("low_load",),
    "test_few_clients_quick_run": ("few_clients",),
    "test_preprocess_cost_quick_run": ("preprocess_cost",),
    "test_adaptive_quick_run": ("adaptive", "--plot", "{out}/adaptive.png"),
    "test_cpu_backends_mlp_quick_run": ("cpu_backends", "--models", "mlp"),
    "test_cpu_backends_minilm_quick_run": ("cpu_backends", "--models", "minilm"),
}


def run_of(test: pytest.Function, folder: Path) -> tuple[list[str], float]:
    """``python -m benchmarks.engine.SCENARIO --quick ...`` of the run ``test`` checks."""
    module, *args = (arg.format(out=folder) for arg in RUNS[test.originalname])
    return scenario(f"benchmarks.engine.{module}", folder, *args), RUN_WITHIN_S


def floats(*names: str) -> dict[str, str]:
    return dict.fromkeys(names, "float")


def test_overhead_quick_run(figures: dict[str, object]) -> None:
    per_front_end = ("floor_req_per_s", "carpool_req_per_s", "ray_req_per_s",
                     "carpool_mean_batch", "carpool_over_floor", "carpool_over_ray")  # fmt: skip
    assert shape(figures) == {
        **floats(*(f"{mode}_{name}" for mode in ("async", "threads") for name in per_front_end)),
        "answers_equal": "bool",
    }
    assert figures["answers_equal"] is True


def test_efficiency_quick_run(figures: dict[str, object]) -> None:
    served = ("served_rows_per_s", "served_over_offline", "served_over_offline_paired",
              "mean_batch")  # fmt: skip
    assert shape(figures) == {
        **floats("sleep_32_offline_rows_per_s"),
        **floats(*(f"sleep_32_w1_{name}" for name in served)),
        **floats(*(f"sleep_32_w2_{name}" for name in served)),
        **floats("mlp_32_offline_rows_per_s"),
        **floats(*(f"mlp_32_w1_{name}" for name in served)),
        **floats("served_over_offline_min", "served_over_offline_median"),
        "answers_equal": "bool",
    }
    assert figures["answers_equal"] is True


def test_reform_quick_run(figures: dict[str, object]) -> None:
    priority = ("urgent_wait_p50_ms", "urgent_wait_p99_ms", "low_rows_ahead_mean",
                "low_rows_ahead_max", "urgent_overtaken_pct")  # fmt: skip
    served = ("offline_rows_per_s", "staged_over_offline", "free_only_over_offline",
              "staged_over_free_only_paired")  # fmt: skip
    clients = [f"{name}_{v}" for v in ("staged", "free_only")
               for name in ("rows_per_s", "p50_ms", "p99_ms")]  # fmt: skip
    clients += ["staged_over_free_only", "p99_staged_over_free_only"]
    models = ("sleep", "mlp", "gil")
    assert shape(figures) == {
        **floats(*(f"{n}_{v}" for v in ("staged", "free_only", "no_reform") for n in priority)),
        **floats("urgent_wait_p99_staged_over_free_only"),
        **floats(*(f"{m}_{name}" for m in models for name in served)),
        **floats(*(f"{m}_64_clients_{name}" for m in models for name in clients)),
        "answers_equal": "bool",
    }
    assert figures["answers_equal"] is True


def test_low_load_quick_run(figures: dict[str, object]) -> None:
    per_model = [f"{v}_{n}" for v in ("model", "eager", "submit", "fixed")
                 for n in ("median_ms", "p90_ms")] + ["eager_over_model_ms"]  # fmt: skip
    assert shape(figures) == floats(*(f"{m}_{n}" for m in ("sleep", "mlp") for n in per_model))


def test_few_clients_quick_run(figures: dict[str, object]) -> None:
    expected = {}
    for kind in ("threads", "tasks"):
        for clients in (4, 8, 16):
            for policy in ("eager", "adaptive"):
                where = f"{kind}_{clients}_clients_{policy}"
                expected |= floats(*(f"{where}_{n}" for n in ("req_per_s", "p50_ms", "p99_ms")))
                expected |= {f"{where}_mean_batch": "float", f"{where}_refused": "int"}
    assert shape(figures) == {**expected, "default_policy": "str"}
    assert figures["default_policy"] == "eager"


def test_preprocess_cost_quick_run(figures: dict[str, object]) -> None:
    per_length = ("preprocess_us", "model_us_per_row", "preprocess_share")
    assert shape(figures) == floats(
        *(f"{name}_{tokens}_tokens" for tokens in (12, 64, 200) for name in per_length)
    )


def test_adaptive_quick_run(figures: dict[str, object], folder: Path) -> None:
    per_load = ("p99_ms_{}_adaptive", "p99_ms_{}_best_fixed_eager", "p99_adaptive_over_best_{}")
    per_load_throughput = ("throughput_adaptive_over_best_{}", "goodput_over_capacity_{}_adaptive")
    loads = ("50pct", "overload_2x")
    targets = ("worst_p99_adaptive_over_best", "overload_goodput_over_capacity",
               "overload_reject_p99_ms",
               "overload_goodput_over_capacity_best_fixed_eager")  # fmt: skip
    expected = {}
    for model in ("sleep", "mlp"):
        expected |= floats(f"{model}_capacity_rows_per_s")
        expected |= floats(*(f"{model}_{n.format(load)}" for load in loads for n in per_load))
        expected |= floats(
            *(f"{model}_{n.format(load)}" for load in loads for n in per_load_throughput)
        )
        expected |= floats(*(f"{model}_{name}" for name in targets))
    assert shape(figures) == expected
    assert (folder / "adaptive.png").stat().st_size > 0


def cpu_backends_shape(model: str) -> dict[str, str]:
    """The figures of one model of ``cpu_backends``, but for minilm's padding."""
    served = ("req_per_s", "p50_ms", "p99_ms", "mean_batch")
    return {
        f"{model}_batching_answers_equal": "bool",
        f"{model}_unbatched_answers_equal": "bool",
        **floats(*(f"{model}_offline_rows_per_s_b{b}" for b in (1, 8, 32, 64))),
        **{
            f"{model}_{config}_{name}": "float" if name != "errors" else "int"
            for config in ("batching", "unbatched")
            for name in (*served, "errors")
        },
        **floats(*(f"{model}_batching_over_unbatched_{n}" for n in ("req_per_s", "p50", "p99"))),
        **floats(f"{model}_batching_served_over_offline", f"{model}_unbatched_served_over_offline"),
    }


def test_cpu_backends_mlp_quick_run(figures: dict[str, object]) -> None:
    assert shape(figures) == cpu_backends_shape("mlp")
    assert figures["mlp_batching_answers_equal"] is True
    assert figures["mlp_unbatched_answers_equal"] is True


def test_cpu_backends_minilm_quick_run(figures: dict[str, object]) -> None:
    assert shape(figures) == {
        **cpu_backends_shape("minilm"),
        **floats(
            "minilm_padded_over_real_no_buckets",
            "minilm_padded_over_real_buckets",
            "minilm_no_buckets_over_buckets_tokens",
            "minilm_no_buckets_over_buckets_time",
            "minilm_padding_embeddings_max_diff",
        ),
        "minilm_padding_embeddings_equal": "bool",
    }
    assert figures["minilm_batching_answers_equal"] is True
    assert figures["minilm_unbatched_answers_equal"] is True
    assert figures["minilm_padding_embeddings_equal"] is True
