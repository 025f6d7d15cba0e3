"""The registry: models by name and version, and the dicts behind metadata, config and stats."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import numpy as np
import pytest

from carpool import Batching, CarpoolError, Model, Tensor
from carpool.loading import LoadFailure
from carpool.server.lifecycle.registry import (
    VERSION,
    ModelNotFound,
    ModelUnavailable,
    Registry,
    ServedModel,
    server_metadata,
)


def _fn(batch: Any) -> Any:
    return batch


def declared(**batching: Any) -> Model:
    return Model(
        _fn,
        name="m",
        inputs=[Tensor("IDS", "INT64", (-1,)), Tensor("TEXT", "BYTES", (1,))],
        outputs=[Tensor("SCORES", "FP16", (3, 4))],
        batching=Batching(**batching),
        version="7",
        platform="onnx_onnxv1",
    )


def test_metadata_shows_the_batch_dimension() -> None:
    assert ServedModel(declared()).metadata() == {
        "name": "m",
        "versions": ["7"],
        "platform": "onnx_onnxv1",
        "inputs": [
            {"name": "IDS", "datatype": "INT64", "shape": [-1, -1]},
            {"name": "TEXT", "datatype": "BYTES", "shape": [-1, 1]},
        ],
        "outputs": [{"name": "SCORES", "datatype": "FP16", "shape": [-1, 3, 4]}],
    }


def test_metadata_of_an_undeclared_model() -> None:
    assert ServedModel(Model(_fn, name="f")).metadata() == {
        "name": "f",
        "versions": ["1"],
        "platform": "python",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, -1]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, -1]}],
    }


def test_config_follows_triton_model_configuration() -> None:
    served = ServedModel(
        declared(
            max_batch_size=16,
            max_wait_ms=2.5,
            workers=3,
            max_queue_size=100,
            priority_levels=4,
            default_priority_level=2,
        )
    )
    assert served.config() == {
        "name": "m",
        "platform": "onnx_onnxv1",
        "backend": "carpool",
        "version_policy": {"specific": {"versions": ["7"]}},
        "max_batch_size": 16,
        "input": [
            {"name": "IDS", "data_type": "TYPE_INT64", "dims": [-1]},
            {"name": "TEXT", "data_type": "TYPE_STRING", "dims": [1]},
        ],
        "output": [{"name": "SCORES", "data_type": "TYPE_FP16", "dims": [3, 4]}],
        "dynamic_batching": {
            "max_queue_delay_microseconds": 2500,
            "preferred_batch_size": [16],
            "priority_levels": 4,
            "default_priority_level": 2,
            "default_queue_policy": {},
            "policy": "eager",
            "max_queue_size": 100,
        },
        "instance_group": [{"count": 3, "kind": "KIND_CPU"}],
        "model_transaction_policy": {"decoupled": False},
    }


def test_config_shows_the_response_cache_only_where_it_is_on() -> None:
    """Triton's ``response_cache.enable``: perf_analyzer reports hits and misses by it."""
    cached = dataclasses.replace(declared(), response_cache=True)
    assert ServedModel(cached).config()["response_cache"] == {"enable": True}
    assert "response_cache" not in ServedModel(declared()).config()


def test_config_queue_policy_with_a_default_timeout() -> None:
    config = ServedModel(declared(default_timeout_ms=12.5)).config()
    assert config["dynamic_batching"]["default_queue_policy"] == {
        "timeout_action": "REJECT",
        "default_timeout_microseconds": 12500,
        "allow_timeout_override": True,
    }
    assert config["dynamic_batching"]["max_queue_size"] == 0  # Triton's "unbounded"


def test_served_model_batcher_uses_the_batching_settings() -> None:
    served = ServedModel(declared(max_batch_size=5, max_wait_ms=1.0, workers=2, max_queue_size=9))
    batcher = served.batcher
    assert (batcher.max_batch_size, batcher.max_wait_ms, batcher.workers) == (5, 1.0, 2)
    assert (batcher.max_queue_size, batcher.name) == (9, "m")
    assert "max_batch_size=5" in served.describe()


def test_a_served_model_needs_a_name() -> None:
    with pytest.raises(ValueError, match="a served model needs a name"):
        ServedModel(Model(_fn))


def duration_keys(stats: dict[str, Any]) -> None:
    for key in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output"):
        assert set(stats["inference_stats"][key]) == {"count", "ns"}


def test_statistics_before_any_request() -> None:
    stats = ServedModel(declared()).statistics()
    duration_keys(stats)
    assert stats == {
        "name": "m",
        "version": "7",
        "inference_count": 0,
        "execution_count": 0,
        "inference_stats": {
            "success": {"count": 0, "ns": 0},
            "fail": {"count": 0, "ns": 0},
            "queue": {"count": 0, "ns": 0},
            "compute_input": {"count": 0, "ns": 0},
            "compute_infer": {"count": 0, "ns": 0},
            "compute_output": {"count": 0, "ns": 0},
            "cache_hit": {"count": 0, "ns": 0},
            "cache_miss": {"count": 0, "ns": 0},
        },
        "batch_stats": [],
        "dispatch_reasons": {},
        "pending": 0,
        "queued_rows": 0,
        "workers": {
            "runner": "thread",
            "alive": 1,
            "restarts": 0,
            "retried_batches": 0,
            "timed_out_batches": 0,
        },
    }


async def test_statistics_count_rows_batches_and_failures() -> None:
    def model(batch: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        if (batch < 0).any():
            raise ValueError("negative")
        return batch

    served = ServedModel(Model(model, name="s", batching=Batching(max_batch_size=4)))
    async with served.batcher:
        # the server's batcher takes and gives dicts of arrays by tensor name
        result = await served.batcher.infer_many({"INPUT0": np.ones((3, 2))})
        assert np.array_equal(result["OUTPUT0"], np.ones((3, 2)))
        await served.batcher.infer_many({"INPUT0": np.ones((6, 2))})  # split: 4 + 2
        with pytest.raises(ValueError, match="negative"):
            await served.batcher.infer_many({"INPUT0": -np.ones((1, 2))})
    stats = served.statistics()
    duration_keys(stats)
    assert (stats["inference_count"], stats["execution_count"]) == (10, 4)
    assert stats["inference_stats"]["success"]["count"] == 2
    assert stats["inference_stats"]["fail"]["count"] == 1
    assert stats["inference_stats"]["queue"]["count"] == 3
    assert stats["inference_stats"]["compute_infer"]["count"] == 3  # calls that returned
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}
    assert sizes == {1: 1, 2: 1, 3: 1, 4: 1}
    timed = {b["batch_size"]: b["compute_infer"]["ns"] > 0 for b in stats["batch_stats"]}
    assert timed == {1: False, 2: True, 3: True, 4: True}  # the one call that raised: untimed
    assert sum(stats["dispatch_reasons"].values()) == 4
    assert (stats["pending"], stats["queued_rows"]) == (0, 0)


async def test_batch_stats_time_each_size_s_compute_phases() -> None:
    """Triton's batch_stats: per size, its batches and the seconds of stacking their rows
    (compute_input), the model (compute_infer) and the split (compute_output), which add up
    to the model-wide phases."""
    served = ServedModel(Model(lambda batch: batch, name="t", batching=Batching(max_batch_size=4)))
    async with served.batcher:
        await served.batcher.infer_many({"INPUT0": np.ones((10, 2))})  # 4 + 4 + 2
    stats = served.statistics()
    phases = ("compute_input", "compute_infer", "compute_output")
    assert [b["batch_size"] for b in stats["batch_stats"]] == [2, 4]
    for b in stats["batch_stats"]:
        assert set(b) == {"batch_size", *phases}
        for phase in phases:
            assert b[phase]["count"] == {2: 1, 4: 2}[b["batch_size"]]
            assert b[phase]["ns"] > 0
    for phase in phases:
        per_size = sum(b[phase]["ns"] for b in stats["batch_stats"])
        assert abs(stats["inference_stats"][phase]["ns"] - per_size) <= 1  # ns rounding, 2 sizes
        assert stats["inference_stats"][phase]["count"] == 1  # one request


# ---------------------------------------------------------------- registry


def test_registry_finds_models_by_name_and_version() -> None:
    one, two = Model(_fn, name="one"), Model(_fn, name="two", version="3")
    registry = Registry([one, two])
    assert len(registry) == 2
    assert [served.name for served in registry] == ["one", "two"]
    assert registry.get("two").model is two
    assert registry.get("two", "3").model is two
    assert registry.get("two", "").model is two


@pytest.mark.parametrize(
    ("name", "version", "message"),
    [
        ("three", None, "Request for unknown model: 'three' is not found"),
        ("three", "1", "Request for unknown model: 'three' is not found"),
        ("two", "1", "Request for unknown model: 'two' version '1' is not found"),
    ],
)
def test_registry_misses_are_model_not_found(name: str, version: str | None, message: str) -> None:
    registry = Registry([Model(_fn, name="two", version="3")])
    with pytest.raises(ModelNotFound) as info:
        registry.get(name, version)
    assert str(info.value) == message
    assert isinstance(info.value, LookupError)
    assert isinstance(info.value, CarpoolError)
    again = pickle.loads(pickle.dumps(info.value))
    assert (type(again), str(again)) == (ModelNotFound, message)


def test_a_model_that_failed_to_load_is_indexed_and_unavailable_by_name() -> None:
    failure = LoadFailure(name="broken", version="1", reason="no model file in broken/1")
    registry = Registry([Model(_fn, name="ok")], load_failures=[failure])
    assert [served.name for served in registry] == ["ok"]
    assert registry.index() == [
        {"name": "broken", "version": "1", "state": "UNAVAILABLE", "reason": failure.reason},
        {"name": "ok", "version": "1", "state": "READY", "reason": ""},
    ]
    with pytest.raises(ModelUnavailable) as info:
        registry.get("broken")
    message = "Model 'broken' is not ready: failed to load: no model file in broken/1"
    assert str(info.value) == message
    again = pickle.loads(pickle.dumps(info.value))
    assert (type(again), str(again), again.reason) == (ModelUnavailable, message, failure.reason)


def test_registry_refuses_two_models_of_one_name() -> None:
    with pytest.raises(ValueError, match=r"two models are named 'x'; .*\(--name\)"):
        Registry([Model(_fn, name="x"), Model(lambda b: b, name="x")])


async def test_compute_phases_agree_as_perf_analyzer_requires() -> None:
    """perf_analyzer aborts unless compute_input/infer/output counts are equal."""
    served = ServedModel(Model(lambda batch: batch, name="p", batching=Batching(max_batch_size=4)))
    async with served.batcher:
        for rows in (1, 3, 6):
            await served.batcher.infer_many({"INPUT0": np.ones((rows, 2))})
    phases = served.statistics()["inference_stats"]
    counts = {phases[k]["count"] for k in ("compute_input", "compute_infer", "compute_output")}
    assert counts == {3}  # one per request, as Triton counts them
    assert phases["success"]["count"] == 3


async def test_readiness_is_the_registry_s_for_every_protocol() -> None:
    registry = Registry([Model(_fn, name="a")], [LoadFailure("broken", "1", "no such file")])
    (served,) = registry
    assert (registry.is_ready(), registry.model_ready(served)) == (False, False)  # not started
    async with served.batcher:
        assert (registry.is_ready(), registry.model_ready(served)) == (False, False)
        registry.ready = True  # the app's startup
        assert (registry.is_ready(), registry.model_ready(served)) == (True, True)
        registry.ready = False  # the drain
        assert (registry.is_ready(), registry.model_ready(served)) == (False, False)


def test_the_ready_index_leaves_out_the_models_that_failed() -> None:
    registry = Registry([Model(_fn, name="b")], [LoadFailure("a", "1", "no such file")])
    assert [entry["name"] for entry in registry.index()] == ["a", "b"]
    assert registry.index(ready_only=True) == [
        {"name": "b", "version": "1", "state": "READY", "reason": ""}
    ]


def test_server_metadata_names_carpool_its_version_and_extensions() -> None:
    metadata = server_metadata()
    assert (metadata["name"], metadata["version"]) == ("carpool", VERSION)
    assert "binary_tensor_data" in metadata["extensions"]
