"""Batches across a process boundary: arrays through shared memory, a small pickled header by
pipe. :func:`lay_out` lays a batch's arrays out in one buffer, :meth:`Layout.write` copies them in
once, :func:`decode` rebuilds the batch as views. An :class:`Arena` is reused: grown when a
batch does not fit, shrunk once its size goes unneeded, never made per batch."""

from __future__ import annotations

import contextlib
import errno
import os
import pickle
import re
import secrets
import struct
from multiprocessing import resource_tracker, shared_memory
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from carpool.errors import SharedMemoryFull

__all__ = [
    "Arena",
    "Attached",
    "Bytes",
    "Channel",
    "Header",
    "Layout",
    "ShrinkPolicy",
    "decode",
    "dumps",
    "extent",
    "lay_out",
    "sweep_orphans",
    "unlink_made_by",
]

ALIGN = 64  # bytes: a cache line, and the widest SIMD load numpy uses
MIN_ARENA = 1 << 20  # bytes: 1 MiB holds a 32x4096 FP32 batch; most never regrow
SHRINK_AFTER_S = 30.0  # seconds an arena's large size goes unneeded before it shrinks back

# Header nodes are plain tuples (cheap to pickle): (ARRAY, dtype, shape, offset),
# (INLINE, value), (DICT, keys, children[, cls, attributes]), (TUPLE, children),
# (LIST, children).
ARRAY, INLINE, DICT, TUPLE, LIST = range(5)
Node = tuple[Any, ...]
# What crosses the pipe: (arena name, node tree).
Header = tuple[str, Node]
# A buffer as a flat uint8 array: slicing one costs a tenth of np.ndarray(buffer=memoryview).
Bytes = np.ndarray[Any, np.dtype[np.uint8]]


_KEYS: dict[np.dtype[Any], Any] = {}  # dtype -> its name in headers
_DTYPES: dict[str, np.dtype[Any]] = {}  # and back


def _at(buf: Bytes, dtype: np.dtype[Any], shape: tuple[int, ...], offset: int) -> Any:
    count = 1
    for n in shape:
        count *= n
    return np.frombuffer(buf, dtype, count, offset).reshape(shape)


class Layout:
    """Where each array of one batch goes in a buffer of ``nbytes``; ``tree`` says how
    to rebuild the batch from it."""

    __slots__ = ("arrays", "nbytes", "tree")

    def __init__(self) -> None:
        self.tree: Node = ()
        self.nbytes = 0
        self.arrays: list[tuple[np.ndarray[Any, Any], int]] = []

    def write(self, buf: Bytes) -> None:
        """Copy every array into ``buf`` at its offset (any strides: ``np.copyto`` gathers)."""
        for array, offset in self.arrays:
            np.copyto(_at(buf, array.dtype, array.shape, offset), array, casting="no")


def lay_out(value: Any) -> Layout:
    """Lay out ``value``: arrays go to the buffer, dicts and tuples or lists holding arrays
    are walked (two levels deep: a dict of tuples of arrays), anything else is inlined."""
    out = Layout()
    out.tree = _node(value, out, depth=0)
    return out


def _node(value: Any, out: Layout, depth: int) -> Node:
    if type(value) is np.ndarray and not value.dtype.hasobject:
        dtype = value.dtype
        key = _KEYS.get(dtype)
        if key is None:  # the dtype's name, or itself when the name loses fields
            key = dtype.str if dtype.fields is None and dtype.subdtype is None else dtype
            _KEYS[dtype] = key
        offset = out.nbytes
        if value.nbytes:
            out.arrays.append((value, offset))
            out.nbytes = offset + -(-value.nbytes // ALIGN) * ALIGN
        return (ARRAY, key, value.shape, offset)
    if depth < 2 and isinstance(value, dict) and type(value).__init__ is dict.__init__:
        keys = tuple(value)
        children = tuple(_node(value[k], out, depth + 1) for k in keys)
        if type(value) is dict:
            return (DICT, keys, children)
        # A dict subclass (carpool.collation.padding.PaddedBatch): its class, and its attributes
        # (the batch's row lengths) laid out like items.
        return (DICT, keys, children, type(value), _node(vars(value), out, depth + 1))
    if depth < 2 and type(value) in (tuple, list) and _holds_arrays(value):
        kind = TUPLE if type(value) is tuple else LIST
        return (kind, tuple(_node(v, out, depth + 1) for v in value))
    return (INLINE, value)  # scalars, strings, object arrays, lists of numbers: pickled


def _holds_arrays(items: tuple[Any, ...] | list[Any]) -> bool:
    return any(type(v) is np.ndarray or type(v) in (dict, tuple, list) for v in items)


def decode(tree: Node, buf: Bytes, *, copy: bool = False) -> Any:
    """The batch ``tree`` describes, its arrays read from ``buf``: views that alias it (valid
    until the buffer is written again), or private copies with ``copy=True``."""
    kind = tree[0]
    if kind == ARRAY:
        _, key, shape, offset = tree
        dtype = _DTYPES.get(key) if type(key) is str else np.dtype(key)
        if dtype is None:
            dtype = _DTYPES[key] = np.dtype(key)
        if not shape or all(shape):  # not empty
            array = _at(buf, dtype, shape, offset)
            return array.copy() if copy else array
        return np.empty(shape, dtype)
    if kind == INLINE:
        return tree[1]
    if kind == DICT:
        named = {k: decode(n, buf, copy=copy) for k, n in zip(tree[1], tree[2], strict=True)}
        if len(tree) == 3:
            return named
        rebuilt = tree[3](named)
        vars(rebuilt).update(decode(tree[4], buf, copy=copy))
        return rebuilt
    items = [decode(n, buf, copy=copy) for n in tree[1]]
    return tuple(items) if kind == TUPLE else items


def extent(tree: Node) -> int:
    """The bytes of its buffer the arrays of ``tree`` take (what :func:`lay_out` made
    ``nbytes``): how much of an arena a batch the other side wrote used."""
    kind = tree[0]
    if kind == ARRAY:
        _, key, shape, offset = tree
        dtype = _DTYPES.get(key) if type(key) is str else None
        nbytes = (dtype if dtype is not None else np.dtype(key)).itemsize
        for n in shape:
            nbytes *= n
        return offset + -(-nbytes // ALIGN) * ALIGN if nbytes else 0
    if kind == INLINE:
        return 0
    children = tree[1] if kind != DICT else tree[2] + tree[4:5]
    return max((extent(n) for n in children), default=0)


def dumps(message: Any) -> bytes:
    """A message (a small tuple) as bytes for :meth:`Channel.send_bytes`."""
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


_LENGTH = struct.Struct("!I")


class Channel:
    """One end of a message channel made of two one-way pipes; at most one message is in
    flight each way (request, answer). Plain pipes wake the other side in half the time of
    the socket pair behind ``multiprocessing.Pipe()``, and writing the framed pickle with
    ``os.write`` skips ``Connection.send``'s per-message pickler set-up."""

    def __init__(self, reader: Connection, writer: Connection) -> None:
        self.reader = reader  # for multiprocessing.connection.wait()
        self.writer = writer
        self._read = reader.fileno()
        self._write = writer.fileno()

    @classmethod
    def pair(cls, ctx: Any) -> tuple[Channel, tuple[Connection, Connection]]:
        """This side's channel, and the two ends to hand the other process (``reader,
        writer``) for :class:`Channel` there; ``ctx`` is a multiprocessing context."""
        ours_r, theirs_w = ctx.Pipe(duplex=False)
        theirs_r, ours_w = ctx.Pipe(duplex=False)
        return cls(ours_r, ours_w), (theirs_r, theirs_w)

    def send(self, message: Any) -> None:
        """Send a message; raises what pickling raises before anything is written, and
        OSError (BrokenPipeError) once the other end is gone."""
        self.send_bytes(dumps(message))

    def send_bytes(self, payload: bytes) -> None:
        data = memoryview(_LENGTH.pack(len(payload)) + payload)
        while data:
            data = data[os.write(self._write, data) :]

    def receive(self) -> Any:
        """The next message; EOFError once the other end is closed. Blocks."""
        (size,) = _LENGTH.unpack(self._exactly(_LENGTH.size))
        return pickle.loads(self._exactly(size))

    def poll(self, timeout: float) -> bool:
        """Whether a message (or end of file) is ready within ``timeout`` seconds."""
        return self.reader.poll(timeout)

    def _exactly(self, size: int) -> bytes:
        data = os.read(self._read, size)
        if len(data) == size:
            return data
        if not data:
            raise EOFError
        parts = [data]
        size -= len(data)
        while size:
            part = os.read(self._read, size)
            if not part:
                raise EOFError
            parts.append(part)
            size -= len(part)
        return b"".join(parts)

    def close(self) -> None:
        self.reader.close()
        self.writer.close()


PREFIX = "carpool_"  # segment names: carpool_<pid of their creator>_<random>
_ORPHAN = re.compile(rf"{PREFIX}(\d+)_[0-9a-f]+")


class Segment:
    """One shared-memory segment and a flat uint8 array over it.

    A new one is named after the process that makes it, so that :func:`sweep_orphans` can
    tell those whose maker is dead, and its pages are reserved at once (``posix_fallocate``):
    a full ``/dev/shm`` is :class:`~carpool.errors.SharedMemoryFull` here, not SIGBUS at the
    first write past its end."""

    def __init__(self, name: str | None = None, size: int = 0) -> None:
        if name is None:
            self.shm = _created(size)
        else:
            self.shm = shared_memory.SharedMemory(name=name)
        self.name = self.shm.name
        view = self.shm.buf
        assert view is not None  # None only once closed
        self.buf: Bytes = np.frombuffer(view, np.uint8)

    def release(self, *, unlink: bool) -> None:
        """Unmap (and unlink) it. A mapping that arrays still view cannot be unmapped: it
        stays until they are gone (a model that kept its inputs) instead of failing.
        Idempotent."""
        if not hasattr(self, "buf"):
            return
        del self.buf
        if unlink:
            with contextlib.suppress(FileNotFoundError):
                self.shm.unlink()
        try:
            self.shm.close()
        except BufferError:
            _kept.append(self.shm)


_kept: list[shared_memory.SharedMemory] = []


def _created(size: int) -> shared_memory.SharedMemory:
    name = f"{PREFIX}{os.getpid()}_{secrets.token_hex(6)}"
    shm = shared_memory.SharedMemory(name=name, create=True, size=size)
    fd = getattr(shm, "_fd", -1)  # POSIX: the segment's descriptor, kept while mapped
    if fd >= 0 and hasattr(os, "posix_fallocate"):
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            free = _free_bytes()
            shm.close()
            shm.unlink()
            if exc.errno in (errno.ENOSPC, errno.ENOMEM):
                raise SharedMemoryFull(needed=size, free=free) from None
            if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):  # no fallocate there
                raise
            return shared_memory.SharedMemory(name=name, create=True, size=size)
    return shm


def _free_bytes(folder: str = "/dev/shm") -> int:
    try:
        stat = os.statvfs(folder)
    except OSError:
        return 0
    return stat.f_bavail * stat.f_frsize


def sweep_orphans(folder: str = "/dev/shm") -> list[str]:
    """Unlink the segments whose maker is dead (``carpool_<pid>_...`` of no live pid):
    what a process-group SIGKILL (an OOM kill, a grace period's end) left behind, which
    nothing else frees. The names unlinked."""
    swept: list[str] = []
    try:
        names = os.listdir(folder)
    except OSError:
        return swept
    for name in names:
        match = _ORPHAN.fullmatch(name)
        if match is None or _alive(int(match.group(1))):
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(folder, name))
            swept.append(name)
    return swept


def unlink_made_by(pid: int, folder: str = "/dev/shm") -> list[str]:
    """Unlink the segments process ``pid`` made and left (it was killed), and take them off
    the resource tracker's list: the tracker every process shares would unlink them again
    as the server ends and warn that they leaked. The names unlinked."""
    unlinked: list[str] = []
    try:
        names = os.listdir(folder)
    except OSError:
        return unlinked
    for name in names:
        match = _ORPHAN.fullmatch(name)
        if match is None or int(match.group(1)) != pid:
            continue
        try:
            os.unlink(os.path.join(folder, name))
        except FileNotFoundError:
            continue
        resource_tracker.unregister(f"/{name}", "shared_memory")  # as SharedMemory names it
        unlinked.append(name)
    return unlinked


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True


class ShrinkPolicy:
    """When an arena that grew for a large batch gives its pages back.

    Kept, the room one rare large batch took would stay out of ``/dev/shm`` (often 64 MiB in
    all) for the process's life. A batch *needs* an arena when it takes more than a quarter
    of it. Once none has for ``after_s`` seconds, the next batch that does not need it gets
    a smaller arena: twice the largest batch since, rounded up to a power-of-two multiple of
    ``floor``, so the recent batches fit with room to spare and a steady batch size never
    flaps between shrinking and regrowing. Time, not a count of batches: at a thousand
    batches a second, a large batch every few hundred would otherwise remake a large
    segment each time. Checked as batches are written, with no thread: a reader maps the
    old segment until a header names the new one, so shrinking between batches would free
    nothing sooner. Pure: the caller passes the time."""

    __slots__ = ("_peak", "_since", "after_s", "floor")

    def __init__(self, after_s: float = SHRINK_AFTER_S, floor: int = MIN_ARENA) -> None:
        self.after_s = after_s
        self.floor = floor
        self._since: float | None = None  # when a batch last needed the arena
        self._peak = 0  # the largest batch since

    def observe(self, nbytes: int, size: int, now: float) -> int | None:
        """The size to remake an arena of ``size`` bytes at before it takes a batch of
        ``nbytes`` at ``now`` (seconds on any monotonic clock), or None to keep it."""
        needed = nbytes > size // 4
        if needed or size <= self.floor or self._since is None:
            self._since, self._peak = now, 0 if needed else nbytes
            return None
        self._peak = max(self._peak, nbytes)
        if now - self._since < self.after_s:
            return None
        target = self.floor
        while target < 2 * self._peak:
            target *= 2
        self._since, self._peak = now, 0
        return target if target < size else None


class Arena:
    """A shared-memory segment its creator reuses for batch after batch. ``fit`` replaces
    it by a larger one when a batch does not fit and, given a :class:`ShrinkPolicy`, by a
    smaller one when its batches stopped needing the room; either way under a new name
    (readers re-attach by the name headers carry) and the old one unlinked."""

    def __init__(self, nbytes: int = MIN_ARENA, shrink: ShrinkPolicy | None = None) -> None:
        self.segment = Segment(size=max(nbytes, MIN_ARENA))
        self.shrink = shrink

    @property
    def name(self) -> str:
        return self.segment.name

    @property
    def size(self) -> int:
        return len(self.segment.buf)

    @property
    def buf(self) -> Bytes:
        return self.segment.buf

    def fit(self, nbytes: int, now: float = 0.0) -> bool:
        """Make room for ``nbytes``, or give back room the shrink policy says is unneeded
        (``now``: its clock); True when that took a new segment (a new name). Growing
        raises SharedMemoryFull when ``/dev/shm`` has no room; a shrink that finds none
        keeps the segment it has, which still fits."""
        size = len(self.segment.buf)
        grew = nbytes > size
        if grew:
            self._remake(max(nbytes, 2 * size))
        target = None if self.shrink is None else self.shrink.observe(nbytes, self.size, now)
        if target is None:
            return grew
        try:
            self._remake(target)
        except (SharedMemoryFull, OSError):  # the policy tries again after after_s
            return grew
        return True

    def _remake(self, size: int) -> None:
        old = self.segment
        self.segment = Segment(size=size)
        old.release(unlink=True)

    def close(self) -> None:
        """Unmap and unlink the segment (processes that attached it keep their mapping)."""
        self.segment.release(unlink=True)


class Attached:
    """The reader's side: the segment a header names, attached once and kept until a header
    names another (the writer grew its arena)."""

    def __init__(self) -> None:
        self.segment: Segment | None = None

    def buf(self, name: str) -> Bytes:
        """The buffer of segment ``name``; raises FileNotFoundError if it no longer exists."""
        segment = self.segment
        if segment is None or segment.name != name:
            if segment is not None:
                self.segment = None
                segment.release(unlink=False)
            segment = self.segment = Segment(name)
        return segment.buf

    def close(self) -> None:
        if self.segment is not None:
            self.segment.release(unlink=False)
            self.segment = None
