"""Large JSON ``data`` arrays read piece by piece, so a body's numbers never all exist as Python
objects (orjson's 32 bytes a number: 269 MB for a 16 MiB body). Number-only arrays of at least
:data:`LIFT_BYTES` are cut out before parsing (:func:`lift`) and read into numpy a piece at a
time (:func:`read_lifted`), each piece strict JSON, so what is accepted and refused is what
the whole text would give."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import orjson

from carpool.server.messages import Array, ProtocolError

__all__ = ["LIFT_BYTES", "Lifted", "lift", "read_lifted", "syntax_error"]

LIFT_BYTES = 256 * 1024  # a smaller array costs orjson at most ~8 MB: not worth the cut
PIECE_BYTES = 64 * 1024  # the JSON text read at once: orjson's peak is ~17x the piece

_DATA = re.compile(rb'"data"[ \t\r\n]*:[ \t\r\n]*\[')
_NOT_NUMERIC = re.compile(rb"[^0-9.eE+\-,\[\] \t\r\n]")  # what ends an array of numbers
_ROW_END = re.compile(rb"\][ \t\r\n]*,")


@dataclass(frozen=True, slots=True)
class Lifted:
    """A body with its large arrays cut out: ``text`` to parse, and where each array was
    in ``source`` by the string that replaces it."""

    source: bytes
    text: bytes
    spans: dict[str, tuple[int, int]]

    def position(self, at: int) -> int:
        """Where ``text``'s byte ``at`` was in ``source``, for a syntax error's message."""
        shift = 0
        for marker, (start, end) in self.spans.items():
            placed = start - shift  # where the marker's string begins in ``text``
            if at < placed:
                break
            shift += (end - start) - (len(marker) + 2)
        return at + shift


def lift(text: bytes | memoryview) -> Lifted | None:
    """``text`` with every ``data`` array of :data:`LIFT_BYTES` or more that holds only
    numbers replaced by a fresh string; ``None`` when there is none (parse it whole)."""
    if len(text) < LIFT_BYTES:  # before any copy: most bodies stop here
        return None
    source = text if isinstance(text, bytes) else bytes(text)
    found: list[tuple[int, int]] = []
    for match in _DATA.finditer(source):
        start = match.end() - 1
        stop = _NOT_NUMERIC.search(source, start)
        end = source.rfind(b"]", start, stop.start() if stop else len(source)) + 1
        if end - start >= LIFT_BYTES:
            found.append((start, end))
    if not found:
        return None
    nonce = os.urandom(8).hex()  # a client cannot send a string it cannot guess
    spans = {f"carpool-array-{nonce}-{k}": span for k, span in enumerate(found)}
    parts: list[bytes] = []
    done = 0
    for marker, (start, end) in spans.items():
        parts += (source[done:start], b'"', marker.encode(), b'"')
        done = end
    parts.append(source[done:])
    return Lifted(source, b"".join(parts), spans)


def read_lifted(
    lifted: Lifted,
    marker: str,
    *,
    count: int,
    name: str,
    read: Callable[[list[object], int], Array],
) -> Array:
    """The array ``marker`` stands for, as ``count`` elements of ``read``'s dtype.

    ``read(values, first)`` turns one piece's values (its top-level elements, nested or
    not) into a flat array, ``first`` being the index of its first element, as the whole
    array's reader would. Raises ``ProtocolError`` for JSON the whole text would refuse,
    ``ValueError`` for values its datatype refuses or a count the shape does not take.
    """
    start, end = lifted.spans[marker]
    source = lifted.source
    out: Array | None = None
    filled = 0
    refused: ValueError | None = None  # said only if the count is right, as the whole says
    for first, last in _pieces(source, start, end):
        values = _parse_piece(source, first, last, whole=(first, last) == (start + 1, end - 1))
        if refused is None and (out is not None or not filled):
            try:
                part = read(values, filled)  # BYTES and BOOL refuse numbers here, first
            except ValueError as exc:
                refused = exc
            else:
                if out is None:
                    out = np.empty(count, dtype=part.dtype)
                if filled + part.size <= count:
                    out[filled : filled + part.size] = part
                    filled += part.size
                    continue
                out = None  # a count the shape refuses: keep counting only
        filled += _elements(values)
    if filled != count:
        raise ValueError(
            f"Unable to parse 'data' of input '{name}': it holds {filled} elements but the "
            f"shape needs {count}"
        )
    if refused is not None:
        raise refused
    assert out is not None  # ``count`` elements were read and kept
    return out


def syntax_error(source: bytes, at: int, reason: str) -> ProtocolError:
    """The 400 orjson's message would be for a syntax error at byte ``at`` of ``source``."""
    line = source.count(b"\n", 0, at) + 1
    column = at - source.rfind(b"\n", 0, at)
    return ProtocolError(
        f"failed to parse the request JSON buffer: {reason}: line {line} column {column} "
        f"(char {at})",
        field="body",
    )


def _parse_piece(source: bytes, first: int, last: int, *, whole: bool) -> list[object]:
    # One piece, its elements between ``first`` and ``last``, read as the array it is part
    # of; an empty piece is an empty array only when it is the whole of it.
    try:
        values = orjson.loads(b"".join((b"[", source[first:last], b"]")))
    except orjson.JSONDecodeError as exc:
        raise syntax_error(source, first + exc.pos - 1, exc.msg) from None
    if not values and not whole:  # ``[1,,2]``: the cut fell on an element that is not there
        raise syntax_error(source, first, "unexpected character")
    return values  # type: ignore[no-any-return]


def _elements(values: list[object]) -> int:
    # How many numbers a piece holds, its nesting flattened (iteratively: no recursion).
    total = 0
    stack = [values]
    while stack:
        for item in stack.pop():
            if type(item) is list:
                stack.append(item)
            else:
                total += 1
    return total


def _pieces(source: bytes, start: int, end: int) -> Iterator[tuple[int, int]]:
    # The array ``source[start:end]`` as runs of whole top-level elements of about
    # PIECE_BYTES each, cut at the commas between them.
    first, last = start + 1, end - 1
    nested = source.find(b"[", first, last) != -1
    while first + PIECE_BYTES < last:
        cut = _next_cut(source, first, first + PIECE_BYTES, last, nested)
        if cut == -1:
            break
        yield first, cut
        first = cut + 1
    yield first, last


def _next_cut(source: bytes, first: int, at: int, last: int, nested: bool) -> int:
    # The first comma at or after ``at`` that separates two top-level elements; ``first``
    # begins one. Nested, that is a comma after a ``]`` that brings the depth back to 1.
    if not nested:
        return source.find(b",", at, last)
    depth = 1 + source.count(b"[", first, at) - source.count(b"]", first, at)
    if depth == 1:
        comma = source.find(b",", at, last)
        if comma != -1 and source.find(b"[", at, comma) == -1:
            return comma  # between two numbers of the top level
    for match in _ROW_END.finditer(source, at, last):
        close = match.start()
        depth += source.count(b"[", at, close) - source.count(b"]", at, close + 1)
        at = close + 1
        if depth <= 1:
            return match.end() - 1 if depth == 1 else -1
    return -1
