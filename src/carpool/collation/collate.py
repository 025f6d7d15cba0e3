"""Rows <-> batches: stack requests into one model input, split the model's output back per
request. Values whose :meth:`Collator.key` differ (shape, dtype) are never stacked together.
Pure; torch tensors are handled only when the caller imported torch, so carpool never does."""

from __future__ import annotations

import sys
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from carpool.errors import BatchSizeMismatch, CollationError

__all__ = ["Collator", "Handler", "Span"]

Span = int | None


class Handler(Protocol):
    """How one kind of value is grouped, stacked, split and reassembled.

    ``collator`` is passed to every method so that container kinds can recurse into their
    parts. ``field`` names the value in error messages.
    """

    def key(self, collator: Collator, value: Any, many: bool, field: str) -> Hashable:
        """A hashable signature; values with equal keys can be stacked together."""
        ...

    def rows(self, collator: Collator, value: Any, field: str) -> int:
        """The number of rows along axis 0 of a multi-row value."""
        ...

    def take(self, collator: Collator, value: Any, start: int, stop: int) -> Any:
        """Rows ``start:stop`` of a multi-row value (a view where the kind allows)."""
        ...

    def stack(self, collator: Collator, values: list[Any], spans: list[Span] | None) -> Any:
        """One batch from the segments' values; ``spans=None`` means all single rows."""
        ...

    def split(
        self, collator: Collator, output: Any, spans: list[Span] | None, total: int, field: str
    ) -> list[Any]:
        """The output of each segment, after checking the output has ``total`` rows."""
        ...

    def concat(self, collator: Collator, pieces: list[Any]) -> Any:
        """Reassemble the outputs of one request that ran in several batches."""
        ...


def _offsets(spans: list[Span]) -> list[tuple[int, int, bool]]:
    out = []
    pos = 0
    for span in spans:
        if span is None:
            out.append((pos, pos + 1, True))
            pos += 1
        else:
            out.append((pos, pos + span, False))
            pos += span
    return out


def _check_rows(actual: int, total: int, field: str) -> None:
    if actual != total:
        raise BatchSizeMismatch(expected=total, actual=actual, field=field)


class _ArrayHandler:
    """numpy arrays and numpy scalars; rows come back as views into the output array."""

    def key(self, collator: Collator, value: Any, many: bool, field: str) -> Hashable:
        shape = value.shape
        if many:
            if not shape:
                raise CollationError(
                    "a multi-row request needs a batch axis, got a 0-d array", field=field
                )
            shape = shape[1:]
        return (np.ndarray, shape, value.dtype)

    def rows(self, collator: Collator, value: Any, field: str) -> int:
        return int(value.shape[0])

    def take(self, collator: Collator, value: Any, start: int, stop: int) -> Any:
        return value[start:stop]

    def stack(self, collator: Collator, values: list[Any], spans: list[Span] | None) -> Any:
        if spans is None:
            return np.stack(values)
        return np.concatenate(
            [v[np.newaxis] if s is None else v for v, s in zip(values, spans, strict=True)]
        )

    def split(
        self, collator: Collator, output: Any, spans: list[Span] | None, total: int, field: str
    ) -> list[Any]:
        if not output.shape:
            raise CollationError("model_fn returned a 0-d array; it has no rows", field=field)
        _check_rows(output.shape[0], total, field)
        if spans is None:
            return list(output)
        return [output[a] if one else output[a:b] for a, b, one in _offsets(spans)]

    def concat(self, collator: Collator, pieces: list[Any]) -> Any:
        return np.concatenate(pieces)


class _TorchHandler:
    """torch tensors; shapes, dtype and device must match to share a batch."""

    def __init__(self, torch: Any) -> None:
        self._torch = torch

    def key(self, collator: Collator, value: Any, many: bool, field: str) -> Hashable:
        shape = tuple(value.shape)
        if many:
            if not shape:
                raise CollationError(
                    "a multi-row request needs a batch axis, got a 0-d tensor", field=field
                )
            shape = shape[1:]
        return (self._torch.Tensor, shape, value.dtype, value.device)

    def rows(self, collator: Collator, value: Any, field: str) -> int:
        return int(value.shape[0])

    def take(self, collator: Collator, value: Any, start: int, stop: int) -> Any:
        return value[start:stop]

    def stack(self, collator: Collator, values: list[Any], spans: list[Span] | None) -> Any:
        if spans is None:
            return self._torch.stack(values)
        return self._torch.cat(
            [v.unsqueeze(0) if s is None else v for v, s in zip(values, spans, strict=True)]
        )

    def split(
        self, collator: Collator, output: Any, spans: list[Span] | None, total: int, field: str
    ) -> list[Any]:
        if output.dim() == 0:
            raise CollationError("model_fn returned a 0-d tensor; it has no rows", field=field)
        _check_rows(int(output.shape[0]), total, field)
        if spans is None:
            return list(output.unbind(0))
        return [output[a] if one else output[a:b] for a, b, one in _offsets(spans)]

    def concat(self, collator: Collator, pieces: list[Any]) -> Any:
        return self._torch.cat(pieces)


class _ListHandler:
    """Python objects: a batch is a list of rows, the output any sequence of rows."""

    def key(self, collator: Collator, value: Any, many: bool, field: str) -> Hashable:
        if many and not isinstance(value, Sequence | np.ndarray):
            raise CollationError(
                f"a multi-row request must be a sequence of rows, got {type(value).__name__}",
                field=field,
            )
        return list

    def rows(self, collator: Collator, value: Any, field: str) -> int:
        return len(value)

    def take(self, collator: Collator, value: Any, start: int, stop: int) -> Any:
        return list(value[start:stop])

    def stack(self, collator: Collator, values: list[Any], spans: list[Span] | None) -> Any:
        if spans is None:
            return values
        batch: list[Any] = []
        for v, s in zip(values, spans, strict=True):
            if s is None:
                batch.append(v)
            else:
                batch.extend(v)
        return batch

    def split(
        self, collator: Collator, output: Any, spans: list[Span] | None, total: int, field: str
    ) -> list[Any]:
        try:
            actual = len(output)
        except TypeError:
            raise CollationError(
                f"model_fn returned {type(output).__name__}, which has no rows; return a "
                "list (or array) with one output per input row",
                field=field,
            ) from None
        _check_rows(actual, total, field)
        if spans is None:
            return list(output)
        return [output[a] if one else list(output[a:b]) for a, b, one in _offsets(spans)]

    def concat(self, collator: Collator, pieces: list[Any]) -> Any:
        return [row for piece in pieces for row in piece]


class _DictHandler:
    """Mappings: every key is collated on its own; all keys must carry the same rows."""

    def key(self, collator: Collator, value: Any, many: bool, field: str) -> Hashable:
        if len(value) == 1:  # one array by name (every one-input model the server runs)
            ((name, array),) = value.items()
            handler = collator.handler(array)
            if type(handler) is _ArrayHandler and (not many or array.ndim):
                # The array's own key, without the sort and the field name only errors use.
                return (dict, (name, handler.key(collator, array, many, field)))
        # Sorted, so the same fields in another order (JSON from different clients) share a
        # batch; stack() reads values by key, never by position.
        try:
            names = sorted(value)
        except TypeError:  # keys of mixed types: insertion order
            names = list(value)
        return (dict, *((k, collator.key(value[k], many, f"{field}[{k!r}]")) for k in names))

    def rows(self, collator: Collator, value: Any, field: str) -> int:
        if len(value) == 1:
            (array,) = value.values()
            handler = collator.handler(array)
            if type(handler) is _ArrayHandler and array.ndim:
                return handler.rows(collator, array, field)
        counts = {k: collator.rows(v, f"{field}[{k!r}]") for k, v in value.items()}
        if not counts:
            raise CollationError("an empty dict carries no rows", field=field)
        if len(set(counts.values())) > 1:
            raise CollationError(f"keys carry different numbers of rows: {counts}", field=field)
        return next(iter(counts.values()))

    def take(self, collator: Collator, value: Any, start: int, stop: int) -> Any:
        return {k: collator.take(v, start, stop) for k, v in value.items()}

    def stack(self, collator: Collator, values: list[Any], spans: list[Span] | None) -> Any:
        return {k: collator.stack([v[k] for v in values], spans) for k in values[0]}

    def split(
        self, collator: Collator, output: Any, spans: list[Span] | None, total: int, field: str
    ) -> list[Any]:
        parts = {k: collator.split(v, spans, total, f"{field}[{k!r}]") for k, v in output.items()}
        count = total if spans is None else len(spans)
        return [{k: rows[i] for k, rows in parts.items()} for i in range(count)]

    def concat(self, collator: Collator, pieces: list[Any]) -> Any:
        return {k: collator.concat([p[k] for p in pieces]) for k in pieces[0]}


class _TupleHandler:
    """Tuples: each position is collated on its own (several inputs or several outputs)."""

    def key(self, collator: Collator, value: Any, many: bool, field: str) -> Hashable:
        return (tuple, *(collator.key(v, many, f"{field}[{i}]") for i, v in enumerate(value)))

    def rows(self, collator: Collator, value: Any, field: str) -> int:
        counts = [collator.rows(v, f"{field}[{i}]") for i, v in enumerate(value)]
        if not counts:
            raise CollationError("an empty tuple carries no rows", field=field)
        if len(set(counts)) > 1:
            raise CollationError(
                f"positions carry different numbers of rows: {counts}", field=field
            )
        return counts[0]

    def take(self, collator: Collator, value: Any, start: int, stop: int) -> Any:
        return tuple(collator.take(v, start, stop) for v in value)

    def stack(self, collator: Collator, values: list[Any], spans: list[Span] | None) -> Any:
        return tuple(collator.stack([v[i] for v in values], spans) for i in range(len(values[0])))

    def split(
        self, collator: Collator, output: Any, spans: list[Span] | None, total: int, field: str
    ) -> list[Any]:
        parts = [collator.split(v, spans, total, f"{field}[{i}]") for i, v in enumerate(output)]
        return list(zip(*parts, strict=True))

    def concat(self, collator: Collator, pieces: list[Any]) -> Any:
        return tuple(collator.concat([p[i] for p in pieces]) for i in range(len(pieces[0])))


_LIST = _ListHandler()


class Collator:
    """Dispatches each value to the handler of its type (exact type first, then its MRO).

    ``Collator({MyType: handler})`` adds or overrides handlers; the built-in kinds stay.
    """

    def __init__(self, handlers: Mapping[type, Handler] | None = None) -> None:
        self._by_type: dict[type, Handler] = {
            np.ndarray: _ArrayHandler(),
            dict: _DictHandler(),
            tuple: _TupleHandler(),
            list: _LIST,
        }
        self._by_type[np.generic] = self._by_type[np.ndarray]
        self._custom = dict(handlers or {})
        self._by_type.update(self._custom)
        self._cache: dict[type, Handler] = dict(self._by_type)

    def handler(self, value: Any) -> Handler:
        """The handler for ``value``'s type; unknown types are rows of a Python list."""
        cls = type(value)
        found = self._cache.get(cls)
        if found is None:
            found = self._resolve(cls)
            self._cache[cls] = found
        return found

    def _resolve(self, cls: type) -> Handler:
        for base in cls.__mro__:
            if base in self._by_type:
                return self._by_type[base]
        torch = sys.modules.get("torch")
        if torch is not None and issubclass(cls, torch.Tensor):
            handler = _TorchHandler(torch)
            self._by_type[torch.Tensor] = handler
            return handler
        return _LIST

    def key(self, value: Any, many: bool = False, field: str = "input") -> Hashable:
        """The grouping signature; raises :class:`CollationError` for an unusable value."""
        handler = self._cache.get(value.__class__) or self.handler(value)
        return handler.key(self, value, many, field)

    @property
    def pads(self) -> bool:
        """Whether some kind of value is padded (:meth:`length` tells its rows' length)."""
        return any(hasattr(handler, "length") for handler in self._by_type.values())

    def length(self, value: Any, many: bool) -> int:
        """The length a padded kind's rows have (every row of ``value``: it was padded to
        its longest); 0 for a kind that is not padded."""
        measure = getattr(self.handler(value), "length", None)
        return 0 if measure is None else int(measure(self, value, many))

    def rows(self, value: Any, field: str = "input") -> int:
        """Rows of a multi-row value; raises :class:`CollationError` when they disagree."""
        return self.handler(value).rows(self, value, field)

    def take(self, value: Any, start: int, stop: int) -> Any:
        return self.handler(value).take(self, value, start, stop)

    def stack(self, values: list[Any], spans: list[Span] | None = None) -> Any:
        """One model input from segments of equal key; ``spans=None``: all single rows."""
        return self.handler(values[0]).stack(self, values, spans)

    def split(
        self, output: Any, spans: list[Span] | None, total: int, field: str = "output"
    ) -> list[Any]:
        """Each segment's share of ``output``; raises :class:`BatchSizeMismatch` when
        ``output`` does not have ``total`` rows."""
        return self.handler(output).split(self, output, spans, total, field)

    def concat(self, pieces: list[Any]) -> Any:
        return self.handler(pieces[0]).concat(self, pieces)
