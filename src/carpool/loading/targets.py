"""From targets, flags and a config file to the models to serve or benchmark. A model's settings,
strongest first: flags (or their ``CARPOOL_*`` variables), the config file's
``[models.NAME]``, a model folder's ``carpool.toml``, what the model declares, the defaults."""

from __future__ import annotations

import importlib
import os
import sys
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from carpool.engine.options import check_int
from carpool.errors import ConfigError
from carpool.loading.repository import as_model, described, load_file, run_model_code
from carpool.loading.settings import parse_tensor
from carpool.model import Model

__all__ = ["BUILTINS", "DEMO", "load_target", "parse_tensor", "read_config_file"]

DEMO = "demo"


def load_target(
    target: str, *, name: str | None = None, options: Mapping[str, Any] | None = None
) -> Model:
    """A :class:`Model` from ``module:attr`` (a function, a torch module or a Model), a model
    file (``.onnx``, ``.pt``), or a built-in name (``demo``, ``minilm``). ``options`` are the
    model's load settings (``backend``, ``[onnx]``, ``[torch]``) for a file."""
    path = Path(target)
    if target in BUILTINS:
        model = BUILTINS[target](options or {})
    elif path.is_file() or (path.suffix.lower() in (".onnx", ".pt", ".pth", ".ts")):
        if not path.is_file():
            raise ConfigError(f"model file {target!r} does not exist")
        try:
            model = load_file(path, name=name, options=options or {})
        except (ValueError, TypeError, ImportError, OSError) as exc:
            raise ConfigError(f"model file {target!r}: {exc}") from None
    else:
        model = _load_attr(target)
    if name is not None:
        model = replace(model, name=name)
    elif model.name is None:
        model = replace(model, name=target.rpartition(":")[2])
    if model.recipe is None:  # how a worker process loads it again
        recipe = partial(load_target, target, name=name, options=dict(options or {}))
        model = replace(model, recipe=recipe)
    return model


def _load_attr(target: str) -> Model:
    """The model ``module:attr`` names, imported as uvicorn imports its app."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"target {target!r} must look like 'module:attr' (as with uvicorn), "
            f"e.g. 'mypkg.models:predict', a model file (.onnx, .pt), a model repository "
            f"folder, or one of {sorted(BUILTINS)}"
        )
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # like `python -m`, find modules in the current folder
    imported: list[Any] = []
    error = run_model_code(
        lambda: imported.append(importlib.import_module(module_name)), name=module_name
    )
    if isinstance(error, Exception) and not isinstance(error, ImportError):
        raise error  # the module's own bug, with its traceback
    if error is not None:  # not there, or it exited: SystemExit is no exit of the server
        why = error if isinstance(error, ImportError) else described(error)
        raise ConfigError(
            f"cannot import module {module_name!r} of target {target!r}: {why}"
        ) from error
    obj: Any = imported[0]
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(
                f"module {module_name!r} has no attribute {attr!r} (target {target!r})"
            ) from None
    return as_model(obj, name=attr.rsplit(".", 1)[-1], where=f"target {target!r}")


def _demo(options: Mapping[str, Any]) -> Model:
    from carpool.backends.demo import demo_model

    return demo_model()


def _minilm(options: Mapping[str, Any]) -> Model:
    """all-MiniLM-L6-v2; ``engine`` picks torch, onnx or onnx-int8 (``$CARPOOL_MINILM_ENGINE``
    overrides it, as environment variables override tables); ``[models.minilm.torch]`` sets
    ``device`` and ``threads``, whatever the engine."""
    from carpool.backends.minilm import ENGINE_ENV, check_engine, minilm_model

    from_env = os.environ.get(ENGINE_ENV)
    try:
        if from_env:
            engine = check_engine(from_env, where=ENGINE_ENV)
        else:
            engine = check_engine(options.get("engine"), where="[models.minilm] engine")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    torch_options = options.get("torch", {})
    try:
        return minilm_model(engine=engine, **torch_options)
    except ImportError as exc:
        raise ConfigError(str(exc)) from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"model 'minilm' [torch] options: {exc}") from None


def _smollm2(options: Mapping[str, Any]) -> Model:
    """SmolLM2-135M-Instruct, step-wise; ``engine`` picks torch or llama
    (``$CARPOOL_SMOLLM2_ENGINE`` overrides it); ``threads`` and ``max_sequences`` per replica."""
    from carpool.backends.smollm2.files import gguf_path
    from carpool.backends.smollm2.served import ENGINE_ENV, smollm2_model

    gguf_path()  # a missing package says what to install, at start
    engine = os.environ.get(ENGINE_ENV) or options.get("engine")
    unknown = sorted(set(options) - {"engine", "threads", "max_sequences"})
    if unknown:
        raise ConfigError(
            f"[models.smollm2] takes engine, threads and max_sequences, not {unknown[0]!r}"
        )
    try:
        return smollm2_model(
            engine,
            threads=check_int("threads", options.get("threads", 1), 1),
            max_sequences=check_int("max_sequences", options.get("max_sequences", 16), 1),
        )
    except ConfigError as exc:
        raise ConfigError(f"[models.smollm2] {exc}") from None


BUILTINS: dict[str, Callable[[Mapping[str, Any]], Model]] = {
    DEMO: _demo,
    "minilm": _minilm,
    "smollm2": _smollm2,
}


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
