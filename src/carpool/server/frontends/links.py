"""The link between a front-end process and the main one: framed pickles over a Unix socket,
their arrays through two shared-memory arenas each way. A reader copies a frame out as it
arrives and acknowledges it (``TAKEN``) on its next frame; a writer with both arenas in flight
puts further values in its next frame. So no arena is written while read, and a busy reader
gets larger frames rather than more of them."""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import struct
import time
from collections.abc import Callable
from typing import Any, cast

import numpy as np

from carpool.errors import SharedMemoryFull
from carpool.ipc.transport import ALIGN, Arena, Attached, ShrinkPolicy, decode, lay_out

__all__ = [
    "CANCEL",
    "END",
    "ERROR",
    "INFER",
    "OUTPUT",
    "PING",
    "PONG",
    "QUERY",
    "RESULT",
    "SNAPSHOT",
    "STATE",
    "STREAM",
    "TAKEN",
    "Link",
    "pickled_error",
]

# The ops. A front end sends (INFER, id, model, timeout_ms, priority, parameters) with the
# request's inputs as its value, (STREAM, id, model, timeout_ms, priority, parameters) with
# a step-wise model's row as its value, (CANCEL, id) and (QUERY, id). The main process sends
# (RESULT, id) with the outputs as its value, (OUTPUT, id, pickled output) for each step of a
# stream and (END, id) after its last, (ERROR, id, exception) for either, (STATE, {model:
# workers alive}) and (SNAPSHOT, id, ({model: (stats, statuses, seconds, steps)}, own)),
# ``steps`` a step-wise model's (carpool.server.frontends.remote) and ``own`` the server's
# counts of answers no model counts (every front end's: carpool.server.frontends.tallies).
# The main process sends (PING,) every second; a front end answers (PONG,) (the hub's
# liveness probe: carpool.server.frontends.hub).
_clock = time.monotonic  # the arenas' shrink policy's (a test's own, there)
INFER, STREAM, CANCEL, QUERY = "infer", "stream", "cancel", "query"
RESULT, OUTPUT, END, ERROR = "result", "output", "end", "error"
STATE, SNAPSHOT = "state", "snapshot"
PING, PONG = "ping", "pong"
# The link's own: (TAKEN, n): the reader copied the next n frames of values out, their
# arenas are free again; (WANT,): the writer waits for its TAKEN, send it now.
TAKEN, WANT = "taken", "want"
_LENGTH = struct.Struct("!I")
_DUMPS = pickle.dumps
_LOADS = pickle.loads
_PROTOCOL = pickle.HIGHEST_PROTOCOL
MAX_FRAME = 1 << 30  # bytes of one pickled frame: more is a broken peer, not a message
_ARENAS = 2  # frames of values in flight each way
_FAST, _TREE = 0, 1  # how a frame's values are laid out

Op = tuple[Any, ...]
_DTYPES: dict[Any, str] = {}  # dtype -> its name, for the dtypes a name rebuilds exactly


def _dtype_name(dtype: np.dtype[Any]) -> str | None:
    name = _DTYPES.get(dtype)
    if name is None:
        if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
            return None
        name = _DTYPES[dtype] = dtype.str
    return name


def _lay_out(values: list[Any]) -> tuple[int, Any, list[tuple[Any, int]]] | None:
    """Where each array of ``values`` goes when every value is a dict of numeric arrays:
    the bytes in all, each value's ``((name, dtype, shape, offset), ...)``, and what to
    write where; None for anything else."""
    offset = 0
    layout = []
    writes = []
    for value in values:
        if type(value) is not dict:
            return None
        arrays = []
        for name, array in value.items():
            if type(array) is not np.ndarray:
                return None
            dtype = _dtype_name(array.dtype)
            if dtype is None:
                return None
            arrays.append((name, dtype, array.shape, offset))
            if array.nbytes:
                writes.append((array, offset))
                offset += -(-array.nbytes // ALIGN) * ALIGN
        layout.append(arrays)
    return offset, layout, writes


def _write(buf: memoryview, writes: list[tuple[Any, int]]) -> None:
    for array, offset in writes:
        if array.flags.c_contiguous:
            buf[offset : offset + array.nbytes] = array.reshape(-1).view(np.uint8).data
        else:
            np.copyto(
                np.frombuffer(buf, array.dtype, array.size, offset).reshape(array.shape), array
            )


def _read(private: bytearray, layout: Any) -> list[Any]:
    frombuffer = np.frombuffer
    values = []
    for arrays in layout:
        value = {}
        for name, dtype, shape, offset in arrays:
            count = 1
            for n in shape:
                count *= n
            if count:
                value[name] = frombuffer(private, dtype, count, offset).reshape(shape)
            else:
                value[name] = np.empty(shape, dtype)
        values.append(value)
    return values


def pickled_error(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a RuntimeError with its type and message (a
    model's exception class may not import on the other side)."""
    try:
        _LOADS(_DUMPS(exc, _PROTOCOL))
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


class Link(asyncio.Protocol):
    """One end of a link. ``on_ops(ops, values)`` gets each frame's ops and the values of
    the first ``len(values)`` of them (private copies); ``on_lost()`` runs once when the
    other end is gone (its process died or closed the link); ``refused(op, exc)`` when
    ``op``'s value could not be sent (it does not pickle, or shared memory is full).

    Whatever is posted in one turn of the loop leaves in one frame, after that turn. Bare
    ops never wait, and under load no frame is sent for an acknowledgement alone."""

    def __init__(
        self,
        on_ops: Callable[[list[Op], list[Any]], None],
        on_lost: Callable[[], None],
        refused: Callable[[Op, Exception], None] = lambda op, exc: None,
    ) -> None:
        self._on_ops = on_ops
        self._on_lost = on_lost
        self._refused = refused
        self._transport: asyncio.Transport | None = None
        self._inbox = bytearray()
        self._attached = [Attached() for _ in range(_ARENAS)]
        self._arenas: list[Arena | None] = [None] * _ARENAS  # made on first use
        self._next = 0  # the arena the next frame of values goes in
        self._in_flight = 0  # frames of values sent and not yet TAKEN
        self._wanted = False  # a WANT is out, its TAKEN not back
        self._owed = 0  # frames of values read here and not yet TAKEN back
        self._asked = False  # the writer sent WANT: send the TAKEN owed even alone
        self._values: list[tuple[Op, Any]] = []  # waiting for an arena
        self._ops: list[Op] = []  # bare, leave with the next frame
        self._flushing = False
        self.lost = False

    # ------------------------------------------------------------- sending

    def post(self, op: Op) -> None:
        """Send ``op`` (no value) after this turn of the loop."""
        self._ops.append(op)
        self._schedule()

    def post_value(self, op: Op, value: Any) -> None:
        """Send ``op`` with ``value`` (arrays and what holds them) as soon as an arena is
        free: after this turn of the loop, or when a frame in flight is TAKEN."""
        self._values.append((op, value))
        self._schedule()

    def withdraw(self, op: Op) -> bool:
        """Take back a value op not sent yet (the same object); True when it was waiting."""
        for index, (waiting, _) in enumerate(self._values):
            if waiting is op:
                del self._values[index]
                return True
        return False

    def _schedule(self) -> None:
        if not self._flushing and not self.lost:
            self._flushing = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flushing = False
        if self._transport is None or self.lost:
            return
        ops, self._ops = self._ops, []
        sending = bool(self._values) and self._in_flight < _ARENAS
        if self._values and not sending and not self._wanted:
            self._wanted = True
            ops.append((WANT,))
        if self._owed and (ops or sending or self._asked):  # never a frame for TAKEN alone,
            ops.append((TAKEN, self._owed))  # unless the writer asked for it
            self._owed = 0
        self._asked = False
        if not sending:
            if ops:
                self._send(None, ops)
            return
        waiting, self._values = self._values, []
        try:
            self._send_values(waiting, ops)
        except Exception as exc:
            self._send_what_can_go(waiting, ops, exc)

    def _send_what_can_go(
        self, waiting: list[tuple[Op, Any]], ops: list[Op], exc: Exception
    ) -> None:
        """Sending ``waiting`` failed with ``exc``: with shared memory full, every value
        fails; with a value that does not pickle, that one fails and the rest still go."""
        sendable = []
        if not isinstance(exc, SharedMemoryFull):
            for op, value in waiting:
                try:
                    _DUMPS(lay_out(value).tree, _PROTOCOL)
                except Exception:
                    self._refused(op, exc)
                else:
                    sendable.append((op, value))
        else:
            for op, _ in waiting:
                self._refused(op, exc)
        if sendable:
            self._send_values(sendable, ops)
        elif ops:
            self._send(None, ops)

    def _send_values(self, waiting: list[tuple[Op, Any]], ops: list[Op]) -> None:
        values = [value for _, value in waiting]
        laid = _lay_out(values)
        if laid is not None:
            nbytes, layout, writes = laid
            arena = self._arena(nbytes)
            _write(arena.segment.shm.buf, writes)  # type: ignore[arg-type]
            kind = _FAST
        else:
            general = lay_out(values)
            nbytes, layout = general.nbytes, general.tree
            arena = self._arena(nbytes)
            general.write(arena.buf)
            kind = _TREE
        header = (self._next, arena.name, nbytes, kind, layout)
        self._send(header, [op for op, _ in waiting] + ops)
        self._next = (self._next + 1) % _ARENAS
        self._in_flight += 1

    def _arena(self, nbytes: int) -> Arena:
        # Grown to fit the largest frame, shrunk back once that size goes unneeded (as a
        # process replica's arenas); the frame's header names it either way.
        arena = self._arenas[self._next]
        if arena is None:
            arena = self._arenas[self._next] = Arena(nbytes, shrink=ShrinkPolicy())
        else:
            arena.fit(nbytes, _clock())  # free: its last frame was TAKEN
        return arena

    def _send(self, header: Any, ops: list[Op]) -> None:
        payload = _DUMPS((header, ops), _PROTOCOL)
        assert self._transport is not None
        self._transport.write(_LENGTH.pack(len(payload)) + payload)

    # ------------------------------------------------------------- receiving

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        if self._ops or self._values:
            self._schedule()

    def data_received(self, data: bytes) -> None:
        inbox = self._inbox
        inbox += data
        start = 0
        end = len(inbox)
        while end - start >= 4:
            (size,) = _LENGTH.unpack_from(inbox, start)
            if size > MAX_FRAME:
                self._close()
                return
            if end - start - 4 < size:
                break
            with memoryview(inbox) as view:
                header, ops = _LOADS(view[start + 4 : start + 4 + size])
            start += 4 + size
            self._frame(header, ops)
        del inbox[:start]

    def _frame(self, header: Any, ops: list[Op]) -> None:
        values: list[Any] = []
        if header is not None:
            index, segment, nbytes, kind, layout = header
            buf = self._attached[index].buf(segment)
            private = bytearray(buf[:nbytes].data)  # the one copy out: the arena is free
            if kind == _FAST:
                values = _read(private, layout)
            else:
                values = decode(layout, np.frombuffer(private, np.uint8))
            self._owed += 1  # its TAKEN rides on the next frame that leaves
        if ops and ops[-1][0] in (TAKEN, WANT):  # the link's own ops, after the others
            ops = self._own(ops)
        if ops:
            self._on_ops(ops, values)

    def _own(self, ops: list[Op]) -> list[Op]:
        kept = []
        for op in ops:
            kind = op[0]
            if kind == TAKEN:
                self._in_flight -= op[1]
                self._wanted = False
                if self._values:
                    self._schedule()
            elif kind == WANT:
                self._asked = True
                self._schedule()
            else:
                kept.append(op)
        return kept

    def connection_lost(self, exc: Exception | None) -> None:
        self._close()

    def eof_received(self) -> bool | None:
        self._close()
        return None

    def close(self) -> None:
        """Close the link (the other end sees it lost) and free its shared memory."""
        self._close()

    def _close(self) -> None:
        if self.lost:
            return
        self.lost = True
        if self._transport is not None:
            self._transport.close()
        for attached in self._attached:
            attached.close()
        for arena in self._arenas:
            if arena is not None:
                with contextlib.suppress(Exception):
                    arena.close()
        self._on_lost()
