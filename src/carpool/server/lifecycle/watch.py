"""What changed in a model repository between two looks (``--model-control-mode poll``). A
folder's :data:`Fingerprint` holds each file's size, inode and time, and a hash of small
files, so a rewrite within one clock tick still shows; :func:`settled` acts on a change once
the folder looked the same twice. Files that are not regular are never read (a pipe blocks)."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["NOT_READ", "Changes", "Fingerprint", "fingerprint", "fingerprints", "settled"]

# (path in the folder, size, inode, mtime in ns, hash of the bytes or "" for a large file)
Fingerprint = tuple[tuple[str, int, int, int, str], ...]
_HASHED_BYTES = 1 << 20  # files up to 1 MiB (code, settings) are hashed: big weights are not
NOT_READ = "not a regular file"  # the hash of a pipe, device or socket: never opened


@dataclass(frozen=True, slots=True)
class Changes:
    """Models to load (new or changed folders) and to unload (removed ones), by name."""

    load: tuple[str, ...] = ()
    unload: tuple[str, ...] = ()


def fingerprint(folder: Path) -> Fingerprint:
    """``folder``'s files as they are now (hidden files and ``__pycache__`` left out)."""
    files = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
        for name in sorted(names):
            if name.startswith("."):
                continue
            path = Path(root) / name
            try:
                found = path.stat()
                if not stat.S_ISREG(found.st_mode):
                    digest = NOT_READ
                elif found.st_size <= _HASHED_BYTES:
                    digest = _digest(path)
                else:
                    digest = ""
            except OSError:  # removed while looked at: the next look sees what is left
                continue
            relative = str(path.relative_to(folder))
            files.append((relative, found.st_size, found.st_ino, found.st_mtime_ns, digest))
    return tuple(files)


def _digest(path: Path) -> str:
    """The hash of ``path``'s bytes; opened without blocking and checked again once open,
    so that a file swapped for a named pipe since its stat is not waited on."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return NOT_READ
        with os.fdopen(fd, "rb", closefd=False) as file:
            return hashlib.blake2b(file.read(_HASHED_BYTES + 1), digest_size=16).hexdigest()
    finally:
        os.close(fd)


def fingerprints(folders: Iterable[Path]) -> dict[str, Fingerprint]:
    """Each model folder's fingerprint, by model name."""
    return {folder.name: fingerprint(folder) for folder in folders}


def settled(
    applied: Mapping[str, Fingerprint],
    seen: Mapping[str, Fingerprint],
    now: Mapping[str, Fingerprint],
) -> Changes:
    """What to do now: load a folder that differs from what was ``applied`` and looked the
    same at the last look (``seen``); unload one that was applied and is gone from both. A
    file written in parts further apart than one poll can look settled while half-written,
    and loads as it is: write a folder elsewhere and rename it in."""
    load = [
        name
        for name in sorted(now)
        if now[name] != applied.get(name) and seen.get(name) == now[name]
    ]
    unload = [name for name in sorted(applied) if name not in now and name not in seen]
    return Changes(tuple(load), tuple(unload))
