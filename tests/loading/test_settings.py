"""A model's settings (``carpool.loading.settings``): ``NAME:DATATYPE:DIMS`` tensors, batching
settings checked as the batcher would, tensors declared in the config file, and models that
cannot batch left unbatched."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from carpool import Batching, Model, Tensor
from carpool.engine.options import DEFAULTS, BatcherOptions
from carpool.errors import ConfigError
from carpool.loading import (
    apply_settings,
    load_target,
    parse_tensor,
    resolve_models,
    with_batching,
)
from loading.conftest import declared_model


def test_parse_tensor() -> None:
    assert parse_tensor("INPUT0:fp32:256") == Tensor("INPUT0", "FP32", (256,))
    assert parse_tensor("tokens:INT64:-1,3") == Tensor("tokens", "INT64", (-1, 3))
    assert parse_tensor("scalar:BOOL:") == Tensor("scalar", "BOOL", ())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("INPUT0:FP32", "must be NAME:DATATYPE:DIMS"),
        ("INPUT0:FP33:4", "datatype must be one of"),
        ("INPUT0:FP32:four", "tensor 'INPUT0:FP32:four'"),
        ("INPUT0:FP32:-2", "shape dims must be ints >= -1"),
    ],
)
def test_parse_tensor_refuses_with_a_remedy(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_tensor(text)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"workers": 0}, "workers must be >= 1, got 0"),
        ({"policy": "bogus"}, "policy must be one of"),
        ({"max_queue_size": 0}, "max_queue_size must be >= 1, got 0"),
        ({"runner": "gpu"}, "runner must be one of thread, process, ray; got 'gpu'"),
        ({"batch_timeout_ms": 500}, "batch_timeout_ms needs runner='process'"),
        ({"runner": "process", "batch_timeout_ms": -1}, "batch_timeout_ms must be finite"),
        ({"runner": "process", "retry": "yes"}, "retry must be a bool, got str"),
    ],
)
def test_batching_refuses_what_the_batcher_would(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Batching(**settings)
    with pytest.raises(ConfigError, match=message):
        with_batching(load_target("demo"), settings)


def test_with_batching_merges_settings_and_refuses_what_the_batcher_would() -> None:
    demo = load_target("demo")
    model = with_batching(demo, {"max_batch_size": 4, "policy": "fixed"})
    assert (model.name, model.batching.max_batch_size, model.batching.policy) == (
        "demo",
        4,
        "fixed",
    )
    assert with_batching(demo, {}) == demo
    with pytest.raises(ConfigError, match="max_batch_size"):
        with_batching(demo, {"max_batch_size": -1})
    with pytest.raises(ConfigError, match="unknown batching settings"):
        with_batching(demo, {"max_batch": 4})


# One table per batcher option a model has, each setting it off its default (with what it needs).
OPTION_TABLES = [
    {"max_batch_size": 8},
    {"max_wait_ms": 1.0},
    {"policy": "fixed"},
    {"max_queue_size": 10},
    {"workers": 2},
    {"isolate_errors": False},
    {"policy": "adaptive", "latency_slo_ms": 50.0},
    {"runner": "process", "batch_timeout_ms": 100.0},
    {"retry": False},
    {"max_batch_tokens": 64},
]


def test_the_tables_cover_every_batcher_option_a_model_has() -> None:
    shared = {f.name for f in dataclasses.fields(BatcherOptions)} & {
        f.name for f in dataclasses.fields(Batching)
    }
    assert {key for table in OPTION_TABLES for key in table} == shared


@pytest.mark.parametrize("table", OPTION_TABLES, ids=lambda table: "+".join(table))
def test_each_batcher_option_is_a_config_key_with_the_records_default(
    table: dict[str, Any],
) -> None:
    model = Model(lambda batch: batch, count_tokens=lambda inputs: 1)
    assert {key: getattr(model.batching, key) for key in table} == {
        key: getattr(DEFAULTS, key) for key in table
    }
    applied = apply_settings(model, [table]).batching
    assert {key: getattr(applied, key) for key in table} == table
    options = applied.batcher_options()
    assert {key: options[key] for key in table} == table


def test_unknown_batching_setting(module: Callable[[str], str]) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_models(
            [declared_model(module)], name=None, flags={}, file_models={"net": {"bogus": 1}}
        )
    assert str(info.value).startswith("model 'net': unknown batching settings ['bogus']; known:")
    assert "max_batch_size" in str(info.value)


@pytest.mark.usefixtures("test_models")
def test_config_file_declares_tensors_per_model() -> None:
    file_models = {
        "add_one": {
            "inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [2]}],
            "outputs": ["OUTPUT0:INT32:2"],
            "max_batch_size": 8,
        }
    }
    (model,), _ = resolve_models(["models:add_one"], name=None, flags={}, file_models=file_models)
    assert model.input_specs == (Tensor("INPUT0", "INT32", (2,)),)
    assert model.output_specs == (Tensor("OUTPUT0", "INT32", (2,)),)
    assert model.batching.max_batch_size == 8
    with pytest.raises(ConfigError, match="not a tensor"):
        resolve_models(
            ["models:add_one"], name=None, flags={}, file_models={"add_one": {"inputs": [3]}}
        )


def test_batching_flags_leave_a_model_that_cannot_batch_unbatched(tmp_path: Path) -> None:
    from backends import onnx_graphs

    path = onnx_graphs.static(tmp_path / "fixed.onnx")
    (model,), _ = resolve_models(
        [str(path)], name=None, flags={"max_batch_size": 8, "workers": 2}, file_models={}
    )
    assert (model.name, model.batching.max_batch_size, model.batching.workers) == ("fixed", 0, 2)
    assert model.input_specs[0].shape == (2, 3)


def test_openai_from_a_table_or_the_flag_which_wins() -> None:
    from carpool import Model
    from carpool.loading import apply_settings

    model = Model(
        lambda batch: batch,
        name="texts",
        inputs=[Tensor("TEXT", "BYTES", (1,))],
        outputs=[Tensor("VECTOR", "FP32", (8,))],
    )
    assert apply_settings(model, [{"openai": True}]).openai is True
    assert apply_settings(model, [{"openai": True}], flags={"openai": False}).openai is False
    on = apply_settings(model, [], flags={"openai": True, "max_batch_size": 4})
    assert (on.openai, on.batching) == (True, Batching(max_batch_size=4))  # not batching's
    with pytest.raises(ConfigError, match=r"^Model openai must be True or False, got 'yes'$"):
        apply_settings(model, [{"openai": "yes"}])
    with pytest.raises(ConfigError, match=r"^openai = true \(serving OpenAI's /v1/embeddings\)"):
        apply_settings(model, [{"openai": True, "outputs": ["V:BYTES:1"]}])
