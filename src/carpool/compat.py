"""The classic, manually driven batcher, for code written against carpool's seed API: you decide
when to poll and when to process. A thin shell over the engine's own pieces
(:class:`~carpool.policies.base.FixedPolicy`, :class:`~carpool.collation.collate.Collator`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from carpool.collation.collate import Collator
from carpool.policies.base import Dispatch, FixedPolicy, QueueView

__all__ = ["InferenceBatcher", "batch_inference"]

_COLLATOR = Collator()
_PYTHON_ROWS = _COLLATOR.handler(None)  # what the engine does with plain Python objects


def _run(model_fn: Callable[[Any], Any], inputs: Sequence[Any]) -> list[Any]:
    rows = list(inputs)
    batch = _COLLATOR.stack(rows)
    if _COLLATOR.handler(rows[0]) is _PYTHON_ROWS:
        # The seed API stacks numbers (scalars, nested lists) with numpy; text and other
        # objects stay a list rather than becoming a string or object array.
        try:
            stacked = np.stack(rows)
        except ValueError:  # ragged rows
            stacked = None
        if stacked is not None and stacked.dtype.kind not in "OUSV":
            batch = stacked
    return _COLLATOR.split(model_fn(batch), None, len(rows))


def _check_batch_size(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


def batch_inference(
    model_fn: Callable[[Any], Any], inputs: Sequence[Any], batch_size: int = 32
) -> list[Any]:
    """Run ``model_fn`` once per consecutive chunk of ``batch_size`` inputs; rows out, in order."""
    _check_batch_size("batch_size", batch_size)
    outputs: list[Any] = []
    for start in range(0, len(inputs), batch_size):
        outputs.extend(_run(model_fn, inputs[start : start + batch_size]))
    return outputs


class InferenceBatcher:
    """Queue requests with :meth:`add_request`; poll :meth:`should_process`; then
    :meth:`process_batch` runs up to ``max_batch_size`` of them in one ``model_fn`` call."""

    def __init__(
        self, model_fn: Callable[[Any], Any], max_batch_size: int = 32, max_wait_ms: float = 50.0
    ) -> None:
        self.model_fn = model_fn
        self.max_batch_size = _check_batch_size("max_batch_size", max_batch_size)
        self.max_wait_ms = max_wait_ms
        self.queue: list[dict[str, Any]] = []
        self._policy = FixedPolicy()

    def add_request(self, input_data: Any, request_id: Hashable) -> None:
        self.queue.append({"id": request_id, "input": input_data, "timestamp": time.monotonic()})

    def should_process(self) -> bool:
        """True when ``max_batch_size`` requests wait or the oldest waited ``max_wait_ms``."""
        if not self.queue:
            return False
        view = QueueView(
            queued_rows=len(self.queue),
            head_rows=len(self.queue),
            head_arrival=self.queue[0]["timestamp"],
            idle_workers=1,
            busy_workers=0,
            max_batch_size=self.max_batch_size,
            max_wait=self.max_wait_ms / 1000.0,
        )
        return isinstance(self._policy.decide(view, time.monotonic()), Dispatch)

    def process_batch(self) -> list[dict[str, Any]]:
        """Run the oldest ``max_batch_size`` requests; ``[{"id": ..., "output": row}, ...]``.

        If ``model_fn`` raises, the requests stay queued (nothing is lost) and the error
        propagates to the caller.
        """
        if not self.queue:
            return []
        batch = self.queue[: self.max_batch_size]
        outputs = _run(self.model_fn, [request["input"] for request in batch])
        del self.queue[: len(batch)]
        return [
            {"id": request["id"], "output": output}
            for request, output in zip(batch, outputs, strict=True)
        ]
