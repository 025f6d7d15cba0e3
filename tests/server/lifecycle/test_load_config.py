"""A load request's parameters and config override, as carpool's batching settings."""

from __future__ import annotations

import json
from typing import Any

import pytest

from carpool.server.lifecycle.load_config import (
    check_unload,
    config_overrides,
    load_overrides,
    request_parameters,
)
from carpool.server.messages import ProtocolError


def test_triton_shaped_config_becomes_batching_settings() -> None:
    config = {
        "name": "m",
        "platform": "python",
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
        "max_batch_size": 8,
        "instance_group": [{"count": 2, "kind": "KIND_CPU"}, {"count": 1}],
        "dynamic_batching": {
            "max_queue_delay_microseconds": "2500",  # protobuf's JSON writes int64 as text
            "preferred_batch_size": [8],
            "priority_levels": 3,
            "default_priority_level": 2,
            "max_queue_size": 0,
            "default_queue_policy": {"default_timeout_microseconds": 40_000},
        },
    }
    assert config_overrides(json.dumps(config), "m") == {
        "max_batch_size": 8,
        "workers": 3,
        "max_wait_ms": 2.5,
        "priority_levels": 3,
        "default_priority_level": 2,
        "max_queue_size": None,
        "default_timeout_ms": 40.0,
    }


def test_carpool_keys_are_taken_as_they_are() -> None:
    text = json.dumps({"max_wait_ms": 1.5, "workers": 2, "allowed_batch_sizes": [4, 8]})
    assert config_overrides(text, "m") == {
        "max_wait_ms": 1.5,
        "workers": 2,
        "allowed_batch_sizes": (4, 8),
    }


def test_a_zero_queue_timeout_is_no_timeout() -> None:
    text = json.dumps({"dynamic_batching": {"default_queue_policy": {}}})
    assert config_overrides(text, "m") == {}
    text = json.dumps(
        {"dynamic_batching": {"default_queue_policy": {"default_timeout_microseconds": 0}}}
    )
    assert config_overrides(text, "m") == {"default_timeout_ms": None}


@pytest.mark.parametrize(
    ("config", "field", "words"),
    [
        ("[1]", "parameters.config", "must be a JSON object"),
        ("{", "parameters.config", "is not JSON"),
        ({"name": "other"}, "parameters.config.name", "for model 'other', not 'm'"),
        ({"optimization": {}}, "parameters.config.optimization", "cannot be set by a load"),
        ({"dynamic_batching": []}, "parameters.config.dynamic_batching", "must be an object"),
        (
            {"dynamic_batching": {"max_queue_delay_microseconds": True}},
            "parameters.config.dynamic_batching.max_queue_delay_microseconds",
            "must be a number",
        ),
        (
            {"dynamic_batching": {"preserve_ordering": True}},
            "parameters.config.dynamic_batching.preserve_ordering",
            "not one carpool has",
        ),
        ({"instance_group": []}, "parameters.config.instance_group", "non-empty list"),
        ({"instance_group": [3]}, "parameters.config.instance_group[0]", "must be an object"),
        (
            {"instance_group": [{"count": "x"}]},
            "parameters.config.instance_group[0].count",
            "must be a number",
        ),
    ],
)
def test_a_config_it_cannot_take_is_a_400_naming_the_field(
    config: Any, field: str, words: str
) -> None:
    text = config if isinstance(config, str) else json.dumps(config)
    with pytest.raises(ProtocolError) as info:
        config_overrides(text, "m")
    assert (info.value.field, info.value.status) == (field, 400)
    assert words in str(info.value)


def test_request_parameters_from_a_rest_body() -> None:
    assert request_parameters(b"") == {}
    assert request_parameters(b"  ") == {}
    assert request_parameters(b'{"parameters": {"config": "{}"}}') == {"config": "{}"}
    for body, field in (
        (b"{", "body"),
        (b"[]", "body"),
        (b'{"other": 1}', "body"),
        (b'{"parameters": 3}', "parameters"),
    ):
        with pytest.raises(ProtocolError) as info:
            request_parameters(body)
        assert info.value.field == field


def test_load_parameters_take_a_config_only() -> None:
    assert load_overrides({}, "m") is None
    assert load_overrides({"config": '{"max_batch_size": 2}'}, "m") == {"max_batch_size": 2}
    assert load_overrides({"config": b'{"workers": 2}'}, "m") == {"workers": 2}
    with pytest.raises(ProtocolError, match="cannot carry model files") as info:
        load_overrides({"file:1/model.py": b"..."}, "m")
    assert info.value.field == "parameters.file:1/model.py"
    with pytest.raises(ProtocolError, match="load parameter 'other' is unknown"):
        load_overrides({"other": 1}, "m")
    with pytest.raises(ProtocolError, match="string holding JSON"):
        load_overrides({"config": 3}, "m")


def test_unload_parameters_take_unload_dependents_only() -> None:
    check_unload({})
    check_unload({"unload_dependents": True})
    for parameters in ({"unload_dependents": "yes"}, {"force": True}):
        with pytest.raises(ProtocolError, match="an unload takes 'unload_dependents'"):
            check_unload(parameters)
