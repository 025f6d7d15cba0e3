"""A load request's config override (Triton's ``load_model(name, config=JSON)``) as carpool's
batching settings: Triton's model configuration as ``GET /v2/models/NAME/config`` shows it, or
carpool's own keys. Fields that describe the model are left alone, so a config read, edited
and sent back loads; anything else is refused, naming the field. Pure."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from carpool.model import Batching
from carpool.server.messages import ProtocolError

__all__ = ["config_overrides", "load_overrides", "request_parameters", "check_unload"]

# carpool's own settings a load may change: how the model is batched and run, all of them.
_OWN = frozenset(Batching.__dataclass_fields__)
# Fields of the config carpool shows that describe the model, not its serving: left alone.
_DESCRIPTIVE = frozenset(
    {
        "name",
        "platform",
        "backend",
        "version_policy",
        "input",
        "output",
        "model_transaction_policy",
    }
)
_FIELD = "parameters.config"


def request_parameters(body: bytes) -> dict[str, Any]:
    """A REST load or unload body's ``parameters``: ``{"parameters": {...}}``, or an empty
    body for none."""
    if not body.strip():
        return {}
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise ProtocolError(f"the request body is not JSON: {exc}", field="body") from None
    if not isinstance(doc, dict) or set(doc) - {"parameters"}:
        raise ProtocolError('the body must be {"parameters": {...}} or empty', field="body")
    parameters = doc.get("parameters", {})
    if not isinstance(parameters, dict):
        raise ProtocolError("parameters must be an object", field="parameters")
    return parameters


def load_overrides(parameters: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """The batching settings a load of ``name`` with ``parameters`` sets (its ``config``),
    or None for none. Model files sent in the request (``file:...``) are refused: a load
    reads the model from the repository."""
    for key in parameters:
        if key.startswith("file:"):
            raise ProtocolError(
                "a load cannot carry model files; put them in the model repository",
                field=f"parameters.{key}",
            )
        if key != "config":
            raise ProtocolError(
                f"load parameter {key!r} is unknown; a load takes 'config'",
                field=f"parameters.{key}",
            )
    text = parameters.get("config")
    if text is None:
        return None
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str):
        raise ProtocolError("config must be a string holding JSON", field=_FIELD)
    return config_overrides(text, name)


def check_unload(parameters: Mapping[str, Any]) -> None:
    """An unload takes ``unload_dependents`` (carpool's models have no dependents)."""
    for key, value in parameters.items():
        if key != "unload_dependents" or not isinstance(value, bool):
            raise ProtocolError(
                f"unload parameter {key!r} is unknown or not a boolean; an unload takes "
                "'unload_dependents' (true/false)",
                field=f"parameters.{key}",
            )


def config_overrides(text: str, name: str) -> dict[str, Any]:
    """The batching settings the config ``text`` (JSON) of a load of model ``name`` sets;
    :class:`ProtocolError` (a 400) names a field it cannot take."""
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise ProtocolError(f"the load's config is not JSON: {exc}", field=_FIELD) from None
    if not isinstance(config, dict):
        raise ProtocolError("the load's config must be a JSON object", field=_FIELD)
    if config.get("name", name) != name:
        raise ProtocolError(
            f"the load's config is for model {config['name']!r}, not {name!r}",
            field=f"{_FIELD}.name",
        )
    overrides: dict[str, Any] = {}
    for key, value in config.items():
        if key in _OWN:
            overrides[key] = value
        elif key == "dynamic_batching":
            overrides.update(_dynamic_batching(value))
        elif key == "instance_group":
            overrides["workers"] = _instances(value)
        elif key not in _DESCRIPTIVE:
            raise ProtocolError(
                f"config field {key!r} cannot be set by a load; it may set "
                f"{', '.join(sorted(_OWN))}, dynamic_batching and instance_group",
                field=f"{_FIELD}.{key}",
            )
    if isinstance(overrides.get("allowed_batch_sizes"), list):
        overrides["allowed_batch_sizes"] = tuple(overrides["allowed_batch_sizes"])
    return overrides


def _dynamic_batching(value: Any) -> dict[str, Any]:
    where = f"{_FIELD}.dynamic_batching"
    if not isinstance(value, Mapping):
        raise ProtocolError("dynamic_batching must be an object", field=where)
    overrides: dict[str, Any] = {}
    for key, item in value.items():
        if key == "max_queue_delay_microseconds":
            overrides["max_wait_ms"] = _number(item, f"{where}.{key}") / 1000.0
        elif key == "policy":
            overrides[key] = item
        elif key in ("priority_levels", "default_priority_level"):
            overrides[key] = _whole(item, f"{where}.{key}")
        elif key == "max_queue_size":
            overrides[key] = _whole(item, f"{where}.{key}") or None  # Triton's 0: no limit
        elif key == "default_queue_policy":
            overrides.update(_queue_policy(item, f"{where}.{key}"))
        elif key != "preferred_batch_size":  # carpool shows it; its batch sizes follow load
            raise ProtocolError(
                f"dynamic_batching field {key!r} is not one carpool has; it takes "
                "max_queue_delay_microseconds, priority_levels, default_priority_level, "
                "max_queue_size, default_queue_policy and policy",
                field=f"{where}.{key}",
            )
    return overrides


def _queue_policy(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ProtocolError("default_queue_policy must be an object", field=where)
    timeout = value.get("default_timeout_microseconds")
    if timeout is None:
        return {}
    microseconds = _number(timeout, f"{where}.default_timeout_microseconds")
    return {"default_timeout_ms": microseconds / 1000.0 if microseconds else None}


def _instances(value: Any) -> int:
    where = f"{_FIELD}.instance_group"
    if not isinstance(value, list) or not value:
        raise ProtocolError("instance_group must be a non-empty list of groups", field=where)
    total = 0
    for index, group in enumerate(value):
        if not isinstance(group, Mapping):
            raise ProtocolError("an instance group must be an object", field=f"{where}[{index}]")
        total += _whole(group.get("count", 1), f"{where}[{index}].count")
    return total


def _whole(value: Any, where: str) -> int:
    number = _number(value, where)
    if not number.is_integer():
        raise ProtocolError(f"{where.rsplit('.', 1)[-1]} must be a whole number", field=where)
    return int(number)


def _number(value: Any, where: str) -> float:
    if isinstance(value, str):  # protobuf's JSON writes 64-bit integers as strings
        try:
            value = int(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProtocolError(f"{where.rsplit('.', 1)[-1]} must be a number", field=where)
    return float(value)
