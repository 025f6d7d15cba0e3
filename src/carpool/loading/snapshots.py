"""A loaded version's files, kept as they were when it loaded.

A repository model's replicas (child processes, Ray actors) build the model themselves,
when they start and each time one restarts. They build it from a :class:`Snapshot`: a
private copy of the version folder, taken when the version loaded, so that a restart runs
the code of the version it belongs to, whatever happened to the folder since (an edited
``model.py``, a broken one whose load failed, a folder removed). The server loads the
model from the same copy, so what it serves and what its replicas rebuild are one.

A file up to :data:`COPY_LIMIT` bytes is copied (code, settings, tokenizers, small
weights); a larger one (weights) is linked: hard-linked where the snapshot's filesystem
allows, else symbolically. So a large file rewritten in place under a loaded version
reaches that version's restarted replicas; new weights belong in a new version folder, or
in a new file renamed over the old one (a hard link keeps the old one).

The copy lives under the system's temporary folder (``TMPDIR``) until its version is
gone: the snapshot is removed when nothing holds it any more (the version unloaded or
replaced, and its replicas closed) and at the server's exit. A snapshot that crosses to a
replica (pickled) crosses as its path only, and the replica never removes it.
"""

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
