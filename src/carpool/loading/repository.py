"""Models from files and folders: ``model.onnx``, ``model.pt``, and a repository of one folder per
model as Triton lays them out (numbered versions, the highest served; an optional
``carpool.toml``). A broken model is reported by folder and problem, and the others serve.
Each load reads the folder again and serves a snapshot of it (:mod:`carpool.loading.snapshots`)."""

from __future__ import annotations

import sys
import threading
import tomllib
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from carpool.errors import ConfigError
from carpool.loading.snapshots import Snapshot, take
from carpool.model import Model

__all__ = [
    "MODEL_FILE",
    "LoadFailure",
    "as_model",
    "described",
    "forget_module",
    "load_file",
    "load_folder",
    "model_folders",
    "module_name",
    "run_model_code",
]

MODEL_FILE = "carpool.toml"
_BACKENDS = {".onnx": "onnx", ".pt": "torch", ".pth": "torch", ".ts": "torch", ".py": "python"}


@dataclass(frozen=True, slots=True)
class LoadFailure:
    """A model of the repository that failed to load, and why."""

    name: str
    version: str
    reason: str


def as_model(obj: Any, *, name: str, where: str) -> Model:
    """A Model from what a module exposes: a Model, a batched function or a torch module."""
    if isinstance(obj, Model):
        return obj if obj.name is not None else replace(obj, name=name)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.nn.Module):
        from carpool.backends.torch import torch_model

        return torch_model(obj, name=name)
    if callable(obj):
        return Model(obj, name=name)
    raise ConfigError(
        f"{where} is a {type(obj).__name__}; it must be a batched function, a torch.nn.Module "
        "or a carpool.Model"
    )


def load_file(path: Path, *, name: str | None, options: Mapping[str, Any]) -> Model:
    """The model in one file, by its suffix (or ``backend``); named after the file's stem."""
    backend = options.get("backend") or _BACKENDS.get(path.suffix.lower())
    name = name or path.stem
    if backend == "onnx":
        from carpool.backends.onnx import onnx_model

        return onnx_model(path, name=name, **_table(options, "onnx"))
    if backend == "torch":
        from carpool.backends.torch import torch_model

        return torch_model(path, name=name, **_table(options, "torch"))
    if backend == "python":
        attr = str(options.get("target", "model"))
        module = _import_file(path, module_name(name))
        if not hasattr(module, attr):
            raise ConfigError(
                f'{path.name} has no attribute {attr!r}; define it, or set target = "NAME" '
                f"in {MODEL_FILE}"
            )
        return as_model(getattr(module, attr), name=name, where=f"{path.name}:{attr}")
    known = ", ".join(sorted(_BACKENDS))
    raise ConfigError(
        f"{path.name}: no backend for {path.suffix or 'a file without a suffix'!r} files "
        f'(known: {known}); set backend = "onnx", "torch" or "python" in {MODEL_FILE}'
    )


def _table(options: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = options.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"[{key}] must be a table of {key} backend options")
    return value


def module_name(name: str) -> str:
    """The module a model's ``model.py`` runs as while the model is loaded."""
    return f"carpool_models.{name}"


def forget_module(name: str) -> None:
    """Model ``name`` is unloaded: its module goes, and with it what its code holds."""
    sys.modules.pop(module_name(name), None)


def _import_file(path: Path, module_name: str) -> Any:
    """``path`` run as module ``module_name``, compiled from its source every time: never
    through a ``.pyc``, which Python trusts when the source's mtime (whole seconds) and size
    match, so a model file rewritten within the second at the same size would reload stale."""
    try:
        source = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path.name}: {exc}") from None
    module = types.ModuleType(module_name)
    module.__file__ = str(path)
    sys.modules[module_name] = module

    def run() -> None:
        exec(compile(source, str(path), "exec"), module.__dict__)

    error = run_model_code(run, name=module_name)
    if error is not None:
        del sys.modules[module_name]
        raise ConfigError(f"importing {path.name} failed: {described(error)}") from error
    return module


def run_model_code(call: Callable[[], object], *, name: str) -> BaseException | None:
    """Run ``call``, a model's own code at load (its ``model.py``, a target's module), in a
    thread of its own, and return what it raised, if anything. Whatever that is (SystemExit,
    KeyboardInterrupt, any BaseException) is the model's failed load, never the server's
    exit: signals interrupt only the main thread, so a real Ctrl-C still arrives here as
    this thread waits, and goes on up. The thread is a daemon, so that an interrupted
    server does not wait for the import to end."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # the model's, whatever it is: see the docstring
            raised.append(exc)

    thread = threading.Thread(target=run, name=f"carpool-load {name}", daemon=True)
    thread.start()
    thread.join()
    return raised[0] if raised else None


def described(exc: BaseException) -> str:
    """``SystemExit: 3``, ``KeyboardInterrupt``: an error's type, and its message if any."""
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def read_model_file(folder: Path) -> dict[str, Any]:
    """The folder's ``carpool.toml``, or nothing."""
    path = folder / MODEL_FILE
    if not path.exists():
        return {}
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{MODEL_FILE} is not valid TOML: {exc}") from None


def _version_folder(folder: Path) -> tuple[Path, str | None]:
    versions = [p for p in folder.iterdir() if p.is_dir() and p.name.isdigit()]
    if not versions:
        return folder, None
    latest = max(versions, key=lambda p: int(p.name))
    return latest, latest.name


def load_folder(folder: Path, settings: Mapping[str, Any]) -> tuple[Model, dict[str, Any]]:
    """The model in one repository folder, and the settings its ``carpool.toml`` gives."""
    own = read_model_file(folder)
    options = {**own, **{k: v for k, v in settings.items() if k in ("backend", "file")}}
    where, version = _version_folder(folder)
    if "file" in options:
        path = where / str(options["file"])
        if not path.is_file():
            raise ConfigError(f"file = {options['file']!r} is not a file in {where}")
    else:
        candidates = sorted(
            p for p in where.iterdir() if p.is_file() and p.suffix.lower() in _BACKENDS
        )
        if not candidates:
            raise ConfigError(
                f"no model file in {where}: add a .onnx, .pt or model.py file "
                f'(or name it with file = "..." in {MODEL_FILE})'
            )
        if len(candidates) > 1:
            names = [p.name for p in candidates]
            raise ConfigError(
                f'several model files {names}; choose one with file = "..." in {MODEL_FILE}'
            )
        path = candidates[0]
    # The model loads from a copy of its version folder, and each replica, started or
    # restarted, rebuilds it from that copy: the code of this version, whatever the folder
    # holds by then (see carpool.loading.snapshots).
    snapshot = take(where, name=folder.name)
    inside = path.relative_to(where)
    try:
        model = load_file(snapshot.folder / inside, name=folder.name, options=options)
    except BaseException:  # a failed load's copy goes now, not when its traceback does
        snapshot.remove()
        raise
    recipe = partial(_snapshot_model, snapshot, str(inside), folder.name, options)
    model = replace(model, name=folder.name, recipe=recipe)
    if version is not None:
        model = replace(model, version=version)
    return model, own


def _snapshot_model(snapshot: Snapshot, inside: str, name: str, options: dict[str, Any]) -> Model:
    """In a replica: the model of a loaded version, from its snapshot."""
    return load_file(snapshot.folder / inside, name=name, options=options)


def model_folders(repository: Path) -> list[Path]:
    """The repository's model folders, by name (hidden folders skipped)."""
    return sorted(
        p for p in repository.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))
    )
