"""A model's settings as config files and flags state them, checked and applied to a Model. One
table shape serves the server config's ``[models.NAME]`` and a model folder's
``carpool.toml``: batching keys, ``version``, ``inputs``/``outputs``, ``[padding]``,
``openai``, ``response_cache``, and how to load the model."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from carpool.collation.padding import Padding
from carpool.errors import ConfigError
from carpool.model import Model, Tensor

__all__ = [
    "LOAD_KEYS",
    "apply_settings",
    "parse_tensor",
    "with_batching",
]

# Keys that say how to load a model, not how to serve it; read before loading. ``engine``:
# minilm's (torch, onnx or onnx-int8) and smollm2's (torch or llama); ``threads`` and
# ``max_sequences``: what smollm2's engine is built with, in each replica.
LOAD_KEYS = frozenset(
    {"backend", "file", "target", "onnx", "torch", "engine", "threads", "max_sequences"}
)


def parse_tensor(text: str) -> Tensor:
    """``NAME:DATATYPE:DIMS`` (``DIMS`` of one row, comma-separated, -1 for any size), as
    ``--input``/``--output`` take it: ``INPUT0:FP32:256``, ``tokens:INT64:-1``."""
    parts = text.split(":")
    if len(parts) != 3:
        raise ConfigError(
            f"tensor {text!r} must be NAME:DATATYPE:DIMS, e.g. INPUT0:FP32:256 or x:INT64:-1,3"
        )
    name, datatype, dims = parts
    try:
        shape = tuple(int(d) for d in dims.split(",")) if dims else ()
        return Tensor(name, datatype.upper(), shape)
    except ValueError as exc:
        raise ConfigError(f"tensor {text!r}: {exc}") from None


def _tensors(value: Any, what: str) -> tuple[Tensor, ...]:
    """Tensors from a config file list of ``{name, datatype, shape}`` tables or strings."""
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{what} must be a non-empty list of tensors")
    tensors = []
    for item in value:
        if isinstance(item, str):
            tensors.append(parse_tensor(item))
        elif isinstance(item, dict) and set(item) <= {"name", "datatype", "shape"}:
            try:
                tensors.append(Tensor(**item))
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"{what}: {exc}") from None
        else:
            raise ConfigError(f"{what}: {item!r} is not a tensor {{name, datatype, shape}}")
    return tuple(tensors)


def _padding(value: Any) -> Padding:
    if not isinstance(value, dict):
        raise ConfigError("padding must be a table: inputs, buckets, lengths, outputs")
    unknown = set(value) - {"inputs", "buckets", "lengths", "outputs"}
    if unknown:
        raise ConfigError(
            f"padding: unknown keys {sorted(unknown)}; known: buckets, inputs, lengths, outputs"
        )
    try:
        return Padding(
            inputs=value.get("inputs", {}),
            buckets=tuple(value.get("buckets", ())),
            lengths=value.get("lengths"),
            outputs={
                k: tuple(v) if isinstance(v, list) else v
                for k, v in value.get("outputs", {}).items()
            },
        )
    except (TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(f"padding: {exc}") from None


def apply_settings(
    model: Model,
    layers: Sequence[Mapping[str, Any]],
    *,
    flags: Mapping[str, Any] | None = None,
    inputs: Sequence[Tensor] = (),
    outputs: Sequence[Tensor] = (),
) -> Model:
    """``model`` with each settings table in ``layers`` applied, weakest first, then the
    command line's batching ``flags`` and declared ``inputs``/``outputs``, strongest."""
    batching, changes = _read_layers(layers)
    batching.update(flags or {})
    for own in ("openai", "response_cache"):  # the Model's own fields, not batching's
        if own in batching:
            changes[own] = batching.pop(own)
    if not model.batching.batched:
        # The model itself cannot batch (an ONNX graph without a batch axis): settings
        # meant for batching models (a flag applies to every model) leave it as it is.
        for key in ("max_batch_size", "allowed_batch_sizes", "max_wait_ms", "policy"):
            batching.pop(key, None)
    if inputs:
        changes["inputs"] = tuple(inputs)
    if outputs:
        changes["outputs"] = tuple(outputs)
    try:
        return replace(with_batching(model, batching), **changes)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None


def with_batching(model: Model, overrides: Mapping[str, Any]) -> Model:
    """``model`` with the batching settings ``overrides`` merged in (``max_batch_size``,
    ``max_wait_ms``, ...), checked as the batcher would check them: what ``carpool serve``
    does with its batching flags, and ``carpool bench`` with its own. :class:`ConfigError`
    names a setting that is unknown or refused."""
    try:
        return replace(model, batching=model.batching.merged(overrides))
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None


def _read_layers(layers: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The settings tables merged, weakest first: batching keys, and the Model's own fields
    (``inputs``, ``outputs``, ``padding``, ``version``) checked. Loading keys are skipped."""
    batching: dict[str, Any] = {}
    changes: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if key in LOAD_KEYS:
                continue
            if key in ("inputs", "outputs"):
                changes[key] = _tensors(value, key)
            elif key == "padding":
                changes[key] = _padding(value)
            elif key == "version":
                changes[key] = str(value)
            else:
                batching[key] = value
    return batching, changes
