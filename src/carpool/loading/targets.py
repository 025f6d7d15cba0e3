"""From targets, flags and a config file to the models to serve or benchmark.

Precedence for a model's settings, strongest first: command-line flags (or their
``CARPOOL_*`` environment variables), the config file's ``[models.NAME]`` table, a model
folder's own ``carpool.toml``, what the model itself declares (a :class:`~carpool.Model`, an
ONNX graph), carpool's defaults.
"""

from __future__ import annotations

import importlib
import os
import sys
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from carpool.errors import ConfigError
from carpool.loading.repository import (
    LoadFailure,
    as_model,
    load_file,
    load_folder,
    model_folders,
)
from carpool.loading.settings import apply_settings, parse_tensor
from carpool.model import Model, Tensor

__all__ = [
    "BUILTINS",
    "LoadFailure",
    "load_target",
    "parse_tensor",
    "read_config_file",
    "resolve_models",
]

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


BUILTINS: dict[str, Callable[[Mapping[str, Any]], Model]] = {DEMO: _demo, "minilm": _minilm}


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


def resolve_models(
    targets: Sequence[str],
    *,
    name: str | None,
    flags: Mapping[str, Any],
    file_models: Mapping[str, Mapping[str, Any]],
    inputs: Sequence[Tensor] = (),
    outputs: Sequence[Tensor] = (),
) -> tuple[tuple[Model, ...], tuple[LoadFailure, ...]]:
    """Load every target and settle each model's signature and batching settings.

    A folder target is a model repository: a model in it that fails to load is returned as
    :class:`LoadFailure`, and the others serve. Any other target that fails is a
    :class:`ConfigError`. ``inputs``/``outputs`` (the ``--input``/``--output`` flags) declare
    the signature of a single target; a config file's ``inputs``/``outputs`` do it per model.
    """
    if name is not None and (len(targets) > 1 or any(Path(t).is_dir() for t in targets)):
        raise ConfigError(
            "--name applies to a single model; a repository names models after their folders"
        )
    if (inputs or outputs) and (len(targets) != 1 or Path(targets[0]).is_dir()):
        raise ConfigError("--input/--output declare one model's tensors; name one TARGET")
    models: list[Model] = []
    unavailable: list[LoadFailure] = []
    for target in targets or [DEMO]:
        if Path(target).is_dir():
            loaded, failed = _load_repository(Path(target), flags, file_models)
            models.extend(loaded)
            unavailable.extend(failed)
            continue
        stem = Path(target).stem if Path(target).is_file() else None
        table = file_models.get(name or stem or target, {})
        model = load_target(target, name=name, options=table)
        layers = [file_models.get(model.name or "", {})]
        try:
            model = apply_settings(model, layers, flags=flags, inputs=inputs, outputs=outputs)
        except ConfigError as exc:
            raise ConfigError(f"model {model.name!r}: {exc}") from None
        models.append(model)
    served = {m.name for m in models} | {u.name for u in unavailable}
    unknown = set(file_models) - served
    if unknown:
        raise ConfigError(
            f"config file has settings for models {sorted(unknown)} that are not served; "
            f"serving {sorted(n for n in served if n is not None)}"
        )
    if not models and unavailable:
        problems = "; ".join(f"{u.name}: {u.reason}" for u in unavailable)
        raise ConfigError(f"no model of the repository loaded ({problems})")
    return tuple(models), tuple(unavailable)


def _load_repository(
    repository: Path, flags: Mapping[str, Any], file_models: Mapping[str, Mapping[str, Any]]
) -> tuple[list[Model], list[LoadFailure]]:
    folders = model_folders(repository)
    if not folders:
        raise ConfigError(
            f"model repository {str(repository)!r} has no model folders; put each model in a "
            "folder of its own, named after the model"
        )
    models, unavailable = [], []
    for folder in folders:
        table = file_models.get(folder.name, {})
        try:
            model, own = load_folder(folder, table)
            models.append(apply_settings(model, [own, table], flags=flags))
        except (ValueError, TypeError, ImportError, OSError) as exc:  # ConfigError: ValueError
            version = str(read_version(folder))
            unavailable.append(LoadFailure(folder.name, version, f"{folder}: {exc}"))
    return models, unavailable


def read_version(folder: Path) -> str:
    """The version a broken model folder would have served, for its status."""
    versions = [int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit()]
    return str(max(versions)) if versions else "1"
