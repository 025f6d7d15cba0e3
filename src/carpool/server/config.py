"""From targets, flags and a config file to the models a server runs, and its settings.

Precedence for a model's batching settings, strongest first: command-line flags (or their
``CARPOOL_*`` environment variables), the config file's ``[models.NAME]`` table, what a
:class:`~carpool.Model` object declares, carpool's defaults.
"""

from __future__ import annotations

import importlib
import sys
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from carpool.model import Batching, Model, Tensor

__all__ = ["ConfigError", "ServerConfig", "load_target", "resolve_models"]

DEMO = "demo"


class ConfigError(ValueError):
    """A target, flag or config file that cannot be used; the message says what to fix."""


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    log_level: str = "info"
    log_format: str = "text"  # or "json": one object per line
    access_log: bool = True
    max_body_bytes: int = 64 * 1024 * 1024  # Triton's HTTP default is the same order
    drain_timeout_s: float = 30.0  # Kubernetes' default terminationGracePeriodSeconds
    models: tuple[Model, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not self.drain_timeout_s >= 0:
            raise ConfigError(f"drain timeout must be >= 0 seconds, got {self.drain_timeout_s}")
        if not 0 < self.port < 65536:
            raise ConfigError(f"port must be in 1..65535, got {self.port}")
        if self.max_body_bytes < 1:
            raise ConfigError(f"max body bytes must be >= 1, got {self.max_body_bytes}")
        names = [m.name for m in self.models]
        for name in names:
            if names.count(name) > 1:
                raise ConfigError(f"two models are named {name!r}; give one another name (--name)")
        if self.log_format not in ("text", "json"):
            raise ConfigError(f"log format must be 'text' or 'json', got {self.log_format!r}")
        if self.log_level.lower() not in ("debug", "info", "warning", "error", "critical"):
            raise ConfigError(
                f"log level must be debug, info, warning, error or critical, got {self.log_level!r}"
            )


def load_target(target: str, *, name: str | None = None) -> Model:
    """A :class:`Model` from ``module:attr`` (a function or a Model), or ``demo``."""
    if target == DEMO:
        from carpool.demo import demo_model

        model = demo_model()
    else:
        module_name, sep, attr = target.partition(":")
        if not sep or not module_name or not attr:
            raise ConfigError(
                f"target {target!r} must look like 'module:attr' (as with uvicorn), "
                f"e.g. 'mypkg.models:predict', or be {DEMO!r}"
            )
        if "" not in sys.path and "." not in sys.path:
            sys.path.insert(0, "")  # like `python -m`, find modules in the current folder
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ConfigError(
                f"cannot import module {module_name!r} of target {target!r}: {exc}"
            ) from exc
        obj: Any = module
        for part in attr.split("."):
            try:
                obj = getattr(obj, part)
            except AttributeError:
                raise ConfigError(
                    f"module {module_name!r} has no attribute {attr!r} (target {target!r})"
                ) from None
        if isinstance(obj, Model):
            model = obj
        elif callable(obj):
            model = Model(obj, name=attr.rsplit(".", 1)[-1])
        else:
            raise ConfigError(
                f"target {target!r} is a {type(obj).__name__}; it must be a batched function "
                "or a carpool.Model"
            )
    if name is not None:
        model = replace(model, name=name)
    elif model.name is None:
        model = replace(model, name=target.rpartition(":")[2])
    return model


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The parsed TOML file: ``[server]`` settings and ``[models.NAME]`` tables."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from None
    unknown = set(data) - {"server", "models"}
    if unknown:
        raise ConfigError(
            f"config file {str(path)!r}: unknown tables {sorted(unknown)}; "
            "use [server] and [models.NAME]"
        )
    return data


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


def resolve_models(
    targets: Sequence[str],
    *,
    name: str | None,
    flags: Mapping[str, Any],
    file_models: Mapping[str, Mapping[str, Any]],
    inputs: Sequence[Tensor] = (),
    outputs: Sequence[Tensor] = (),
) -> tuple[Model, ...]:
    """Load every target and settle each model's signature and batching settings.

    ``inputs``/``outputs`` (the ``--input``/``--output`` flags) declare the signature of a
    single target; a config file's ``inputs``/``outputs`` do it per model.
    """
    if name is not None and len(targets) > 1:
        raise ConfigError("--name applies to a single target; use a config file for several")
    if (inputs or outputs) and len(targets) != 1:
        raise ConfigError("--input/--output declare one target's tensors; name one TARGET")
    models = []
    for target in targets or [DEMO]:
        model = load_target(target, name=name)
        overrides = dict(file_models.get(model.name or "", {}))
        declared_in = _tensors(overrides.pop("inputs"), "inputs") if "inputs" in overrides else ()
        declared_out = (
            _tensors(overrides.pop("outputs"), "outputs") if "outputs" in overrides else ()
        )
        declared_in, declared_out = tuple(inputs) or declared_in, tuple(outputs) or declared_out
        overrides.update(flags)
        try:
            batching = model.batching.merged(overrides)
            check_batching(batching)
            model = replace(
                model,
                batching=batching,
                inputs=declared_in or model.inputs,
                outputs=declared_out or model.outputs,
            )
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"model {model.name!r}: {exc}") from None
        models.append(model)
    unknown = set(file_models) - {m.name for m in models}
    if unknown:
        raise ConfigError(
            f"config file has settings for models {sorted(unknown)} that are not served; "
            f"serving {[m.name for m in models]}"
        )
    return tuple(models)


def check_batching(batching: Batching) -> None:
    """Refuse settings the batcher would refuse, before the server binds its port."""
    from carpool.batcher import Batcher

    try:
        Batcher(lambda rows: rows, **batching.batcher_options())
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
