"""Padding that lets unequal requests share a batch, and the way back to each caller's rows.
:class:`Padding` pads ragged rows to the batch's longest, grouped in length buckets so that a
7-token request does not pay for a 250-token one; :func:`pad_rows` pads a static-shape model's
batch up to an allowed size. Pure: numpy in, numpy out."""

from __future__ import annotations

import bisect
import math
import numbers
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from carpool.collation.collate import Collator, Span
from carpool.errors import CollationError

__all__ = ["PaddedBatch", "Padding", "allowed_size", "pad_rows", "take_rows"]


class PaddedBatch(dict[str, Any]):
    """The batch a padded model receives: a dict of stacked inputs, plus ``lengths``, the
    true row shape of the first ragged input for each row (``(rows, ndim)``)."""

    lengths: np.ndarray[Any, Any]


@dataclass(frozen=True, slots=True)
class Padding:
    """How to batch inputs whose non-batch dimensions differ between requests.

    ``inputs``: ragged input name -> pad value. Every non-batch axis of these inputs may vary;
    a row's *lengths* are the row shape of the first one listed (for token ids: the number of
    tokens). ``buckets``: ascending length bounds; a row is grouped with rows whose lengths
    fall under the same bounds (a length beyond the last bound groups with its exact length);
    empty puts every length in one group. ``lengths``: if set, the model receives an INT64
    input of that name holding each row's lengths (``(rows,)`` for one ragged axis).
    ``outputs``: output name -> the row axis (or axes, one per ragged axis) that follows the
    input's lengths; each row of that output is cut back to its own lengths.
    """

    inputs: Mapping[str, float]
    buckets: tuple[int, ...] = ()
    lengths: str | None = None
    outputs: Mapping[str, int | tuple[int, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.inputs or not all(isinstance(k, str) for k in self.inputs):
            raise ValueError("padding inputs must map at least one input name to a pad value")
        for name, value in self.inputs.items():
            pad: object = value  # a config file or a caller may hand anything
            if isinstance(pad, bool | np.bool_) or not isinstance(pad, numbers.Real):
                raise ValueError(f"padding for input {name!r}: pad value must be a number")
        buckets = tuple(self.buckets)
        if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in buckets) or list(
            buckets
        ) != sorted(set(buckets)):
            raise ValueError(f"padding buckets must be ascending ints >= 1, got {list(buckets)}")
        outputs = {}
        for name, axes in self.outputs.items():
            axes = (
                (axes,)
                if isinstance(axes, int)
                else tuple(axes)
                if isinstance(axes, tuple | list)
                else ()
            )
            if not axes or any(
                isinstance(a, bool) or not isinstance(a, int) or a < 0 for a in axes
            ):
                raise ValueError(
                    f"padding for output {name!r}: give the row axis (>= 0) that follows the "
                    f"input's length, got {self.outputs[name]!r}"
                )
            outputs[name] = axes
        if self.lengths is not None and self.lengths in self.inputs:
            raise ValueError(f"padding lengths input {self.lengths!r} is also a ragged input")
        object.__setattr__(self, "inputs", dict(self.inputs))
        object.__setattr__(self, "buckets", buckets)
        object.__setattr__(self, "outputs", outputs)

    @property
    def first(self) -> str:
        return next(iter(self.inputs))

    def bucket(self, length: int) -> int:
        """The bound a length is grouped under (itself beyond the last bound)."""
        if not self.buckets:
            return 0
        at = bisect.bisect_left(self.buckets, length)
        return self.buckets[at] if at < len(self.buckets) else length

    def check(self, value: Mapping[str, Any], *, many: bool = True, field: str = "input") -> None:
        """Raise :class:`CollationError` for a request these rules cannot batch: a ragged
        input missing or not an array, a dtype that cannot hold its pad value, or a request
        sending the input that carries lengths."""
        if self.first not in value:
            raise CollationError(f"the ragged input {self.first!r} is missing", field=field)
        if self.lengths is not None and self.lengths in value:
            raise CollationError(
                f"input {self.lengths!r} is where the model gets each row's lengths; "
                "a request cannot send it",
                field=self.lengths,
            )
        for name, pad in self.inputs.items():
            array = value.get(name)
            if array is None:
                continue
            if not isinstance(array, np.ndarray) or array.ndim < (2 if many else 1):
                raise _ragged_error(name, array, name)
            _check_pad(pad, array.dtype, name)

    def collator(self) -> Collator:
        """A collator that pads dicts of arrays (the server's request values)."""
        return Collator({dict: _PaddedDict(self)})

    def unpad(self, outputs: Mapping[str, Any], lengths: np.ndarray[Any, Any]) -> dict[str, Any]:
        """``outputs`` with each ragged output turned into a list of rows cut to their
        lengths (the collator splits a list by rows like an array)."""
        result = dict(outputs)
        for name, spec in self.outputs.items():
            if name not in result:
                continue
            axes = (spec,) if isinstance(spec, int) else spec
            array = np.asarray(result[name])
            if array.ndim < 1 + max(axes) + 1:
                raise ValueError(
                    f"padded output {name!r} has shape {list(array.shape)}; it has no row "
                    f"axis {max(axes)} to cut back to each row's length"
                )
            if len(axes) > lengths.shape[1]:
                raise ValueError(
                    f"padded output {name!r} names {len(axes)} ragged axes, but the ragged "
                    f"input {self.first!r} has {lengths.shape[1]}"
                )
            rows = []
            for i in range(len(lengths)):
                index: list[Any] = [i] + [slice(None)] * (array.ndim - 1)
                for j, axis in enumerate(axes):
                    index[1 + axis] = slice(0, int(lengths[i, j]))
                rows.append(array[tuple(index)])
            result[name] = rows
        return result


def _rows_of(value: np.ndarray[Any, Any], span: Span) -> np.ndarray[Any, Any]:
    return value[np.newaxis] if span is None else value


class _PaddedDict:
    """The dict handler of a padded model: groups by length bucket, pads when stacking."""

    def __init__(self, padding: Padding) -> None:
        self._padding = padding
        self._base = Collator().handler({})

    def key(self, collator: Collator, value: Any, many: bool, field: str) -> Hashable:
        padding = self._padding
        padding.check(value, many=many, field=field)
        parts: list[Hashable] = []
        for name in sorted(value):
            array = value[name]
            if name in padding.inputs:
                parts.append((name, array.dtype, array.ndim - (1 if many else 0)))
            else:
                parts.append((name, collator.key(array, many, f"{field}[{name!r}]")))
        first = value[padding.first]
        row_shape = first.shape[1:] if many else first.shape
        return (Padding, tuple(padding.bucket(n) for n in row_shape), *parts)

    def rows(self, collator: Collator, value: Any, field: str) -> int:
        return int(self._base.rows(collator, value, field))

    def length(self, collator: Collator, value: Any, many: bool) -> int:
        """What each row computes: the first ragged input's row size (its tokens)."""
        first = value[self._padding.first]
        return math.prod(first.shape[1:] if many else first.shape)

    def take(self, collator: Collator, value: Any, start: int, stop: int) -> Any:
        return self._base.take(collator, value, start, stop)

    def stack(self, collator: Collator, values: list[Any], spans: list[Span] | None) -> Any:
        padding = self._padding
        spans_: list[Span] = spans if spans is not None else [None] * len(values)
        batch = PaddedBatch()
        for name in values[0]:
            parts = [_rows_of(v[name], s) for v, s in zip(values, spans_, strict=True)]
            if name in padding.inputs:
                batch[name] = _pad_stack(parts, padding.inputs[name])
            else:
                batch[name] = collator.stack([v[name] for v in values], spans)
        first = padding.first
        batch.lengths = np.concatenate(
            [
                np.broadcast_to(
                    np.asarray(v[first].shape[0 if s is None else 1 :], dtype=np.int64),
                    (1 if s is None else s, v[first].ndim - (0 if s is None else 1)),
                )
                for v, s in zip(values, spans_, strict=True)
            ]
        )
        if padding.lengths is not None:
            lengths = batch.lengths
            batch[padding.lengths] = lengths[:, 0].copy() if lengths.shape[1] == 1 else lengths
        return batch

    def split(
        self, collator: Collator, output: Any, spans: list[Span] | None, total: int, field: str
    ) -> list[Any]:
        return list(self._base.split(collator, output, spans, total, field))

    def concat(self, collator: Collator, pieces: list[Any]) -> Any:
        return self._base.concat(collator, pieces)


def _ragged_error(name: str, value: Any, field: str) -> Exception:
    return CollationError(
        f"ragged input {name!r} must be a numpy array with a batch axis and at least one more "
        f"axis, got {type(value).__name__} of shape {list(getattr(value, 'shape', []))}",
        field=field,
    )


_FITS: dict[tuple[float, np.dtype[Any]], bool] = {}


def _check_pad(value: float, dtype: np.dtype[Any], name: str) -> None:
    """Refuse a request whose dtype cannot hold the pad value, before it joins a batch."""
    fits = _FITS.get((value, dtype))
    if fits is None:
        try:
            with np.errstate(all="ignore"):
                fits = bool(np.array(value).astype(dtype) == value)
        except (OverflowError, ValueError, TypeError):
            fits = False
        _FITS[(value, dtype)] = fits
    if not fits:
        raise CollationError(
            f"ragged input {name!r} is {dtype}, which cannot hold its pad value {value!r}",
            field=name,
        )


def _pad_stack(parts: list[np.ndarray[Any, Any]], value: float) -> np.ndarray[Any, Any]:
    shapes = np.array([p.shape[1:] for p in parts])
    target = tuple(int(n) for n in shapes.max(axis=0))
    if (shapes == target).all():
        return np.concatenate(parts)
    total = sum(p.shape[0] for p in parts)
    out = np.full((total, *target), value, dtype=parts[0].dtype)
    at = 0
    for p in parts:
        out[(slice(at, at + p.shape[0]), *(slice(0, n) for n in p.shape[1:]))] = p
        at += p.shape[0]
    return out


def allowed_size(rows: int, allowed: Sequence[int]) -> int:
    """The smallest allowed batch size that holds ``rows`` (``allowed`` is ascending)."""
    at = bisect.bisect_left(allowed, rows)
    if at == len(allowed):
        raise ValueError(f"a batch of {rows} rows exceeds the largest allowed size {allowed[-1]}")
    return allowed[at]


def pad_rows(batch: Any, size: int) -> Any:
    """``batch`` (an array or a dict of arrays) grown to ``size`` rows by repeating the last
    row: a real row, so the filler never feeds the model values it would choke on."""
    if isinstance(batch, Mapping):
        padded = {k: pad_rows(v, size) for k, v in batch.items()}
        if isinstance(batch, PaddedBatch):
            out = PaddedBatch(padded)
            out.lengths = pad_rows(batch.lengths, size)
            return out
        return padded
    array = np.asarray(batch)
    missing = size - array.shape[0]
    if missing <= 0:
        return array
    return np.concatenate([array, np.repeat(array[-1:], missing, axis=0)])


def take_rows(outputs: Any, rows: int) -> Any:
    """The first ``rows`` rows of every output (an array, a list, or a dict of them)."""
    if isinstance(outputs, Mapping):
        return {k: take_rows(v, rows) for k, v in outputs.items()}
    if isinstance(outputs, tuple):
        return tuple(take_rows(v, rows) for v in outputs)
    return outputs[:rows]
