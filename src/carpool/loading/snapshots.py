"""A loaded version's files as they were when it loaded, so that a replica that restarts rebuilds
the version it belongs to, whatever happened to the folder since. Files up to
:data:`COPY_LIMIT` bytes are copied, larger ones (weights) linked: new weights belong in a new
version folder, or a new file renamed over the old one. The copy lives under ``TMPDIR`` until
nothing holds it; pickled, a snapshot crosses as its path only."""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from pathlib import Path

from carpool.errors import ConfigError

__all__ = ["COPY_LIMIT", "Snapshot", "take"]

COPY_LIMIT = 16 * 2**20  # bytes: a file larger is linked, not copied
_SKIPPED = ("__pycache__",)


class Snapshot:
    """The private copy of a version folder at ``folder`` (see the module docstring);
    removed once nothing holds this object, by the process that took it."""

    def __init__(self, folder: Path, *, owned: bool = True) -> None:
        self.folder = folder
        self._remove = weakref.finalize(self, _remove, folder, os.getpid()) if owned else None

    def remove(self) -> None:
        """Remove it now (a load that failed), not once nothing holds it."""
        if self._remove is not None:
            self._remove()

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return _borrowed, (str(self.folder),)  # a replica's: the path, never its removal

    def __repr__(self) -> str:
        return f"Snapshot({str(self.folder)!r})"


def take(source: Path, *, name: str) -> Snapshot:
    """A snapshot of the folder ``source``, for model ``name``; a :class:`ConfigError` if
    a file cannot be read."""
    folder = Path(tempfile.mkdtemp(prefix=f"carpool-{name}-"))
    snapshot = Snapshot(folder)
    try:
        _copy_tree(source, folder)
    except OSError as exc:
        snapshot.remove()
        raise ConfigError(f"cannot copy {source} for its replicas: {exc}") from None
    return snapshot


def _copy_tree(source: Path, target: Path) -> None:
    for entry in sorted(source.iterdir()):
        if entry.name in _SKIPPED:
            continue
        if entry.is_dir():
            (target / entry.name).mkdir()
            _copy_tree(entry, target / entry.name)
        elif entry.is_file():
            _copy_file(entry, target / entry.name)


def _copy_file(source: Path, target: Path) -> None:
    if source.stat().st_size <= COPY_LIMIT:
        shutil.copyfile(source, target)
        return
    real = source.resolve()
    try:
        os.link(real, target)
    except OSError:  # another filesystem, or links not allowed: refer to it by path
        target.symlink_to(real)


def _borrowed(folder: str) -> Snapshot:
    return Snapshot(Path(folder), owned=False)


def _remove(folder: Path, owner: int) -> None:
    if os.getpid() == owner:  # never from a forked copy of the owner
        shutil.rmtree(folder, ignore_errors=True)
