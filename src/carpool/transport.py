"""Batches across a process boundary: arrays through shared memory, a small header by pipe.

:func:`plan` walks a batch (an array, a dict, tuple or list of them, scalars) and lays its
arrays out in one buffer; :meth:`Plan.write` copies them there once; :func:`decode` rebuilds
the batch on the other side as views of that buffer (or copies, with ``copy=True``).
Object arrays (BYTES) and anything that is not an array travel pickled in the header,
which should stay small. :class:`Arena` is a reusable shared-memory segment, recreated
larger when a batch does not fit, never once per batch. Imports numpy and the stdlib only.
"""

from __future__ import annotations

import contextlib
import pickle
from dataclasses import dataclass, field
from multiprocessing import shared_memory
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

__all__ = ["Arena", "Attached", "Header", "Plan", "decode", "plan", "receive", "send"]

ALIGN = 64  # bytes: a cache line, and the widest SIMD load numpy uses
MIN_ARENA = 1 << 20  # bytes: 1 MiB holds a 32x4096 FP32 batch; most never regrow

# Header nodes are plain tuples (cheap to pickle): (ARRAY, dtype, shape, offset),
# (INLINE, value), (DICT, keys, children), (TUPLE, children), (LIST, children).
ARRAY, INLINE, DICT, TUPLE, LIST = range(5)
Node = tuple[Any, ...]
# What crosses the pipe: (arena name, node tree).
Header = tuple[str, Node]


@dataclass(slots=True)
class Plan:
    """Where each array of one batch goes in a buffer of ``nbytes``; ``tree`` says how
    to rebuild the batch from it."""

    tree: Node
    nbytes: int = 0
    arrays: list[tuple[np.ndarray[Any, Any], int]] = field(default_factory=list)

    def write(self, buf: memoryview) -> None:
        """Copy every array into ``buf`` at its offset (any strides: ``np.copyto`` gathers)."""
        for array, offset in self.arrays:
            dst = np.ndarray(array.shape, array.dtype, buffer=buf, offset=offset)
            np.copyto(dst, array, casting="no")


def plan(value: Any) -> Plan:
    """Lay out ``value``: arrays go to the buffer, dicts and tuples or lists holding arrays
    are walked (two levels deep: a dict of tuples of arrays), anything else is inlined."""
    out = Plan(tree=())
    out.tree = _node(value, out, depth=0)
    return out


def _node(value: Any, out: Plan, depth: int) -> Node:
    if type(value) is np.ndarray and not value.dtype.hasobject:
        dtype = value.dtype
        key = dtype.str if dtype.fields is None and dtype.subdtype is None else dtype
        offset = out.nbytes
        if value.nbytes:
            out.arrays.append((value, offset))
            out.nbytes = offset + -(-value.nbytes // ALIGN) * ALIGN
        return (ARRAY, key, value.shape, offset)
    if depth < 2 and type(value) is dict:
        keys = tuple(value)
        return (DICT, keys, tuple(_node(value[k], out, depth + 1) for k in keys))
    if depth < 2 and type(value) in (tuple, list) and _holds_arrays(value):
        kind = TUPLE if type(value) is tuple else LIST
        return (kind, tuple(_node(v, out, depth + 1) for v in value))
    return (INLINE, value)  # scalars, strings, object arrays, lists of numbers: pickled


def _holds_arrays(items: tuple[Any, ...] | list[Any]) -> bool:
    return any(type(v) is np.ndarray or type(v) in (dict, tuple, list) for v in items)


def decode(tree: Node, buf: memoryview, *, copy: bool = False) -> Any:
    """The batch ``tree`` describes, its arrays read from ``buf``: views that alias it (valid
    until the buffer is written again), or private copies with ``copy=True``."""
    kind = tree[0]
    if kind == ARRAY:
        _, dtype, shape, offset = tree
        dtype = np.dtype(dtype)
        if not shape or all(shape):  # not empty
            array = np.ndarray(shape, dtype, buffer=buf, offset=offset)
            return array.copy() if copy else array
        return np.empty(shape, dtype)
    if kind == INLINE:
        return tree[1]
    if kind == DICT:
        return {k: decode(n, buf, copy=copy) for k, n in zip(tree[1], tree[2], strict=True)}
    items = [decode(n, buf, copy=copy) for n in tree[1]]
    return tuple(items) if kind == TUPLE else items


def send(conn: Connection, message: Any) -> None:
    """Send a message (a small tuple) on a pipe: plain pickle, which costs a third of
    ``Connection.send``'s pickler set-up per message. Raises what pickling raises before
    anything is written."""
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def receive(conn: Connection) -> Any:
    """The next message :func:`send` wrote; EOFError once the other end is closed."""
    return pickle.loads(conn.recv_bytes())


class Arena:
    """A shared-memory segment its creator reuses for batch after batch; ``fit`` replaces
    it by a larger one (and unlinks the old) when a batch does not fit."""

    def __init__(self, nbytes: int = MIN_ARENA) -> None:
        self.shm = shared_memory.SharedMemory(create=True, size=max(nbytes, MIN_ARENA))

    @property
    def name(self) -> str:
        return self.shm.name

    @property
    def size(self) -> int:
        return self.shm.size

    @property
    def buf(self) -> memoryview:
        buf = self.shm.buf
        assert buf is not None  # None only after close()
        return buf

    def fit(self, nbytes: int) -> bool:
        """Make room for ``nbytes``; True when that took a new segment (a new name)."""
        if nbytes <= self.shm.size:
            return False
        old = self.shm
        self.shm = shared_memory.SharedMemory(create=True, size=max(nbytes, 2 * old.size))
        _release(old, unlink=True)
        return True

    def close(self) -> None:
        """Unmap and unlink the segment (processes that attached it keep their mapping)."""
        _release(self.shm, unlink=True)


class Attached:
    """The reader's side: the segment a header names, attached once and kept until a header
    names another (the writer grew its arena)."""

    def __init__(self) -> None:
        self.shm: shared_memory.SharedMemory | None = None

    def buf(self, name: str) -> memoryview:
        """The buffer of segment ``name``; raises FileNotFoundError if it no longer exists."""
        shm = self.shm
        if shm is None or shm.name != name:
            if shm is not None:
                _release(shm, unlink=False)
            shm = self.shm = shared_memory.SharedMemory(name=name)
        buf = shm.buf
        assert buf is not None
        return buf

    def close(self) -> None:
        if self.shm is not None:
            _release(self.shm, unlink=False)
            self.shm = None


_kept: list[shared_memory.SharedMemory] = []


def _release(shm: shared_memory.SharedMemory, *, unlink: bool) -> None:
    """Close (and unlink) a segment. A mapping that arrays still view cannot close: it is
    kept open until the process exits instead of failing (a model that kept its inputs)."""
    if unlink:
        with contextlib.suppress(FileNotFoundError):
            shm.unlink()
    try:
        shm.close()
    except BufferError:
        _kept.append(shm)
