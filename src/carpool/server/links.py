"""The link between a front-end process and the main one: framed messages over a Unix
socket, their arrays through shared memory (:mod:`carpool.transport`'s arena and layout).

A frame is ``(segment, tree, ops)``, pickled behind its length. ``ops`` are small tuples; the
first ``len(values)`` of them each carry a value (a request's inputs one way, its outputs the
other), whose arrays the sender lays out in its own arena and ``tree`` describes. One frame
with values is in flight each way at a time: the reader copies the arrays out as the frame
arrives and answers ``TAKEN``; until then the sender holds back further values (they go
together in the next frame) but not bare ops, which leave at once. So the arena is never
written while it is being read, each array is copied once in and once out, and a busy
reader gets larger frames rather than more of them.

Whatever is posted in one turn of the loop leaves in one frame, after that turn. Only
asyncio, pickle and the transport: no batcher, no server.
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import struct
from collections.abc import Callable
from typing import Any, cast

from carpool.transport import Arena, Attached, decode, plan

__all__ = [
    "CANCEL",
    "COUNTS",
    "ERROR",
    "FLUSH",
    "INFER",
    "QUERY",
    "RESULT",
    "SNAPSHOT",
    "STATE",
    "TAKEN",
    "Link",
    "pickled_error",
]

# The ops. A front end sends (INFER, id, model, timeout_ms, priority) with the request's
# inputs as its value, (CANCEL, id), (COUNTS, {model: (statuses, seconds)}) and (QUERY, id).
# The main process sends (RESULT, id) with the outputs as its value, (ERROR, id, exception),
# (STATE, {model: workers alive}), (SNAPSHOT, id, {model: (stats, statuses, seconds)}) and
# (FLUSH,): send your COUNTS now.
INFER, CANCEL, COUNTS, QUERY = "infer", "cancel", "counts", "query"
RESULT, ERROR, STATE, SNAPSHOT, FLUSH = "result", "error", "state", "snapshot", "flush"
TAKEN = "taken"  # the reader copied the last frame's arrays out: the arena is free again
_LENGTH = struct.Struct("!I")
_DUMPS = pickle.dumps
_LOADS = pickle.loads
_PROTOCOL = pickle.HIGHEST_PROTOCOL
MAX_FRAME = 1 << 30  # bytes of one pickled frame: more is a broken peer, not a message

Op = tuple[Any, ...]


def pickled_error(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a RuntimeError with its type and message (a
    model's exception class may not import on the other side)."""
    try:
        _LOADS(_DUMPS(exc, _PROTOCOL))
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


_StreamProtocol = asyncio.Protocol  # (not carpool's connections.Protocol, to the layer test)


class Link(_StreamProtocol):
    """One end of a link. ``on_ops(ops, values)`` gets each frame's ops and the values of
    the first ``len(values)`` of them (private copies); ``on_lost()`` runs once when the
    other end is gone (its process died or closed the link); ``refused(op, exc)`` when
    ``op``'s value could not be sent (it does not pickle)."""

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
        self._attached = Attached()
        self._arena: Arena | None = None  # created on the first value sent
        self._values: list[tuple[Op, Any]] = []  # waiting for the arena
        self._ops: list[Op] = []  # bare, leave with the next frame
        self._in_flight = False  # a frame of values not yet TAKEN
        self._flushing = False
        self.lost = False

    # ------------------------------------------------------------- sending

    def post(self, op: Op) -> None:
        """Send ``op`` (no value) after this turn of the loop."""
        self._ops.append(op)
        self._schedule()

    def post_value(self, op: Op, value: Any) -> None:
        """Send ``op`` with ``value`` (arrays and what holds them) as soon as the arena is
        free: after this turn of the loop, or when the last frame is TAKEN."""
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
        if not self._values or self._in_flight:
            if ops:
                self._write(None, None, ops)
            return
        waiting, self._values = self._values, []
        try:
            self._write_values(waiting, ops)
        except Exception as exc:  # a value that does not pickle: the rest still go
            sendable = []
            for op, value in waiting:
                try:
                    _DUMPS(plan(value).tree, _PROTOCOL)
                except Exception:
                    self._refused(op, exc)
                else:
                    sendable.append((op, value))
            self._write_values(sendable, ops)

    def _write_values(self, waiting: list[tuple[Op, Any]], ops: list[Op]) -> None:
        if not waiting:
            if ops:
                self._write(None, None, ops)
            return
        laid = plan([value for _, value in waiting])
        arena = self._arena
        if arena is None:
            arena = self._arena = Arena(laid.nbytes)
        else:
            arena.fit(laid.nbytes)
        laid.write(arena.buf)
        self._write(arena.name, laid.tree, [op for op, _ in waiting] + ops)
        self._in_flight = True

    def _write(self, segment: str | None, tree: Any, ops: list[Op]) -> None:
        payload = _DUMPS((segment, tree, ops), _PROTOCOL)
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
                frame = _LOADS(view[start + 4 : start + 4 + size])
            start += 4 + size
            self._frame(*frame)
        del inbox[:start]

    def _frame(self, segment: str | None, tree: Any, ops: list[Op]) -> None:
        values: list[Any] = []
        if segment is not None:
            values = decode(tree, self._attached.buf(segment), copy=True)
            self.post((TAKEN,))
        if any(op[0] == TAKEN for op in ops):  # the link's own op, among the bare ones
            ops = [op for op in ops if op[0] != TAKEN]
            self._in_flight = False
            if self._values:
                self._schedule()
        if ops:
            self._on_ops(ops, values)

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
        self._attached.close()
        if self._arena is not None:
            with contextlib.suppress(Exception):
                self._arena.close()
        self._on_lost()
