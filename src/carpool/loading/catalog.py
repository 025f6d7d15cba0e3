"""Every model a ``carpool serve`` command line can serve, by name, and how to load each again.
:meth:`Catalog.load_all` loads them all at start (a repository model that fails is a
:class:`~carpool.loading.LoadFailure`, the others serve); :meth:`Catalog.load` loads one from
disk again, for model control. A repository's folders are listed at each call, so new ones load."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from carpool.errors import ConfigError
from carpool.loading.repository import LoadFailure, forget_module, load_folder, model_folders
from carpool.loading.settings import apply_settings
from carpool.loading.targets import DEMO, load_target
from carpool.model import Model, Tensor

__all__ = ["Catalog", "read_version", "resolve_models"]

# What loading a model may raise, by what was wrong with it (ConfigError is a ValueError).
_LOAD_ERRORS = (ValueError, TypeError, ImportError, OSError, SyntaxError)


class Catalog:
    """The models of ``targets`` (``carpool serve``'s TARGETs; none: the demo model), with the
    command line's batching ``flags``, the config file's ``[models.NAME]`` tables
    (``file_models``), the ``--input``/``--output`` of a single target, and the names of the
    models that answer from the response cache (``--response-cache NAME``)."""

    def __init__(
        self,
        targets: Sequence[str],
        *,
        name: str | None = None,
        flags: Mapping[str, Any] | None = None,
        file_models: Mapping[str, Mapping[str, Any]] | None = None,
        inputs: Sequence[Tensor] = (),
        outputs: Sequence[Tensor] = (),
        response_cache: Sequence[str] = (),
    ) -> None:
        if name is not None and (len(targets) > 1 or any(Path(t).is_dir() for t in targets)):
            raise ConfigError(
                "--name applies to a single model; a repository names models after their folders"
            )
        if (inputs or outputs) and (len(targets) != 1 or Path(targets[0]).is_dir()):
            raise ConfigError("--input/--output declare one model's tensors; name one TARGET")
        self.name = name
        self.flags = dict(flags or {})
        self.file_models = dict(file_models or {})
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.response_cache = frozenset(response_cache)
        self.order = list(targets or [DEMO])
        self.repositories = [Path(t) for t in self.order if Path(t).is_dir()]
        self.targets = [t for t in self.order if not Path(t).is_dir()]
        self._by_name: dict[str, str] = {}  # a target's model name -> the target

    # ------------------------------------------------------------- what there is

    def folder(self, name: str) -> Path | None:
        """The repository folder of model ``name``, as the repositories are now; None if
        none holds it (the first repository's wins, as at start)."""
        for repository in self.repositories:
            folder = repository / name
            if folder in model_folders(repository):
                return folder
        return None

    def folders(self) -> list[Path]:
        """Every repository's model folders, as they are now."""
        return [folder for repository in self.repositories for folder in model_folders(repository)]

    def names(self) -> list[str]:
        """The models this catalog can load by name now, sorted."""
        return sorted({f.name for f in self.folders()} | set(self._by_name))

    # ------------------------------------------------------------- loading

    def load_all(self) -> tuple[tuple[Model, ...], tuple[LoadFailure, ...]]:
        """Every target's model: what a server without model control serves. A repository
        model that fails to load is a :class:`LoadFailure` and the others load; any other
        failure is a :class:`ConfigError`, as is an empty repository or one where nothing
        loaded."""
        for repository in self.repositories:
            if not model_folders(repository):
                raise ConfigError(
                    f"model repository {str(repository)!r} has no model folders; put each "
                    "model in a folder of its own, named after the model"
                )
        models: list[Model] = []
        failures: list[LoadFailure] = []
        for target in self.order:
            if not Path(target).is_dir():
                models.append(self._load_target(target))
                continue
            for folder in model_folders(Path(target)):
                try:
                    models.append(self._load_folder(folder))
                except _LOAD_ERRORS as exc:
                    reason = f"{folder}: {exc}"
                    failures.append(LoadFailure(folder.name, read_version(folder), reason))
        self.check_settings({m.name for m in models if m.name} | {f.name for f in failures})
        if self.repositories and not models and failures:
            problems = "; ".join(f"{f.name}: {f.reason}" for f in failures)
            raise ConfigError(f"no model of the repository loaded ({problems})")
        return tuple(models), tuple(failures)

    def load_some(self, names: Sequence[str], given: str = "--load-model") -> tuple[Model, ...]:
        """The models a server in explicit model control starts with: every target that is
        not a repository (those always load), and of the repositories' models those named
        (by ``given``: ``--load-model`` or its variable); a name that is not there, or a
        model that fails, is a :class:`ConfigError`."""
        models = [self._load_target(target) for target in self.targets]
        for name in names:
            if self.folder(name) is None:
                raise ConfigError(
                    f"{given} {name!r}: no such model folder in the repository "
                    f"(there: {sorted(f.name for f in self.folders())})"
                )
            models.append(self.load(name))
        self.check_settings(set(self.names()))
        return tuple(models)

    def load(self, name: str, overrides: Mapping[str, Any] | None = None) -> Model:
        """Model ``name`` loaded again, from disk for a repository's; ``overrides`` (batching
        settings) apply over every other setting. A :class:`ConfigError` says why it cannot:
        no model has that name, or loading it failed."""
        folder = self.folder(name)
        try:
            if folder is not None:
                return self._load_folder(folder, overrides)
            if name in self._by_name:
                return self._load_target(self._by_name[name], overrides)
        except ConfigError:
            raise
        except _LOAD_ERRORS as exc:
            raise ConfigError(f"{folder or name}: {exc}") from exc
        raise ConfigError(f"no model named {name!r} in the model repository")

    def release(self, name: str) -> None:
        """Model ``name`` was unloaded: let go of what loading it left in this process (its
        ``model.py`` module, and what that holds: weights, say), even if its folder is
        gone already."""
        forget_module(name)

    def check_settings(self, names: set[str]) -> None:
        """The config file and ``--response-cache`` name only models in ``names``."""
        for what, named in (
            ("config file has settings for", set(self.file_models)),
            ("--response-cache names", set(self.response_cache)),
        ):
            unknown = named - names
            if unknown:
                raise ConfigError(
                    f"{what} models {sorted(unknown)} that are not served; serving {sorted(names)}"
                )

    def _load_target(self, target: str, overrides: Mapping[str, Any] | None = None) -> Model:
        stem = Path(target).stem if Path(target).is_file() else None
        table = self.file_models.get(self.name or stem or target, {})
        model = load_target(target, name=self.name, options=table)
        layers = [self.file_models.get(model.name or "", {})]
        model = self._settle(model, layers, overrides, inputs=self.inputs, outputs=self.outputs)
        self._by_name[model.name or ""] = target
        return model

    def _load_folder(self, folder: Path, overrides: Mapping[str, Any] | None = None) -> Model:
        table = self.file_models.get(folder.name, {})
        model, own = load_folder(folder, table)
        return self._settle(model, [own, table], overrides)

    def _settle(
        self,
        model: Model,
        layers: Sequence[Mapping[str, Any]],
        overrides: Mapping[str, Any] | None,
        **tensors: Sequence[Tensor],
    ) -> Model:
        flags = {**self.flags, **(overrides or {})}
        try:
            model = apply_settings(model, layers, flags=flags, **tensors)
        except ConfigError as exc:
            raise ConfigError(f"model {model.name!r}: {exc}") from None
        if model.name in self.response_cache:
            model = replace(model, response_cache=True)
        return model


def read_version(folder: Path) -> str:
    """The version a broken model folder would have served, for its status."""
    versions = [int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit()]
    return str(max(versions)) if versions else "1"


def resolve_models(
    targets: Sequence[str],
    *,
    name: str | None,
    flags: Mapping[str, Any],
    file_models: Mapping[str, Mapping[str, Any]],
    inputs: Sequence[Tensor] = (),
    outputs: Sequence[Tensor] = (),
) -> tuple[tuple[Model, ...], tuple[LoadFailure, ...]]:
    """Load every target and settle each model's signature and batching settings
    (:meth:`Catalog.load_all`): the models, and the repository models that failed."""
    catalog = Catalog(
        targets, name=name, flags=flags, file_models=file_models, inputs=inputs, outputs=outputs
    )
    return catalog.load_all()
