"""Run one batch: collate -> model -> check rows -> split, and isolate failing rows.

Knows nothing of queues, policies or futures: it takes segments and returns one part per
segment, where a part is that segment's output or a :class:`Failure`. A plain ``model_fn``
runs in the batcher's worker threads together with stacking and splitting, so large copies
and GIL-releasing models (numpy, torch, onnxruntime) stay off the event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from carpool.collate import Collator, Span
from carpool.errors import BatchSizeMismatch
from carpool.queue import Segment

__all__ = ["BatchRunner", "Failure"]


class Failure:
    """The exception a segment's rows raised; never a value a model can return."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class BatchRunner:
    """Executes batches of one model. ``model_times`` receives each call's seconds."""

    def __init__(
        self,
        model_fn: Callable[[Any], Any],
        *,
        is_async: bool,
        collator: Collator,
        isolate_errors: bool,
        name: str,
        model_times: deque[float],
    ) -> None:
        self._model_fn = model_fn
        self._is_async = is_async
        self._collator = collator
        self._isolate = isolate_errors
        self._name = name
        self._model_times = model_times

    async def run(self, segments: list[Segment], executor: Executor | None) -> list[Any]:
        """One part per segment, in order; the model is re-run on halves to find bad rows."""
        for entry, _, _ in segments:
            if entry.span is not None:
                break
        else:  # all single rows: the common case, kept cheap
            values = [entry.value for entry, _, _ in segments]
            return await self._attempt(values, None, len(values), executor)
        take = self._collator.take
        values = []
        spans: list[Span] = []
        for entry, start, stop in segments:
            if entry.span is None:
                values.append(entry.value)
                spans.append(None)
            else:
                whole = start == 0 and stop == entry.rows
                values.append(entry.value if whole else take(entry.value, start, stop))
                spans.append(stop - start)
        rows = sum(1 if s is None else s for s in spans)
        return await self._attempt(values, spans, rows, executor)

    async def _attempt(
        self, values: list[Any], spans: list[Span] | None, rows: int, executor: Executor | None
    ) -> list[Any]:
        try:
            if self._is_async:
                return await self._execute_async(values, spans, rows)
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(executor, self._execute, values, spans, rows)
        except BatchSizeMismatch as exc:
            return [Failure(exc)] * len(values)
        except Exception as exc:
            if not self._isolate or len(values) == 1:
                exc.add_note(
                    f"carpool: raised by model_fn of batcher {self._name!r} "
                    f"on a batch of {rows} rows"
                )
                return [Failure(exc)] * len(values)
        mid = len(values) // 2
        if spans is None:
            left = await self._attempt(values[:mid], None, mid, executor)
            right = await self._attempt(values[mid:], None, rows - mid, executor)
        else:
            left_rows = sum(1 if s is None else s for s in spans[:mid])
            left = await self._attempt(values[:mid], spans[:mid], left_rows, executor)
            right = await self._attempt(values[mid:], spans[mid:], rows - left_rows, executor)
        return left + right

    def _execute(self, values: list[Any], spans: list[Span] | None, rows: int) -> list[Any]:
        collator = self._collator
        batch = collator.stack(values, spans)
        started = time.perf_counter()
        output = self._model_fn(batch)
        self._model_times.append(time.perf_counter() - started)
        return collator.split(output, spans, rows)

    async def _execute_async(
        self, values: list[Any], spans: list[Span] | None, rows: int
    ) -> list[Any]:
        collator = self._collator
        batch = collator.stack(values, spans)
        started = time.perf_counter()
        output = await self._model_fn(batch)
        self._model_times.append(time.perf_counter() - started)
        return collator.split(output, spans, rows)
