"""A servable step-wise model: a StepModel factory with a v2 signature, how one request row and
its parameters become the model's input, and how each step's output becomes response tensors.

The server streams it (generate_stream, gRPC's ModelStreamInfer) or answers it whole (infer).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from carpool.engine.options import check_int
from carpool.engine.stats import (
    LATENCY_BOUNDS,
    BatcherStats,
    BatchTimes,
    Histogram,
    HistogramSnapshot,
    Percentiles,
)
from carpool.errors import CarpoolError, ConfigError
from carpool.model import Model
from carpool.steps.batcher import StepBatcher
from carpool.steps.model import StepModel
from carpool.steps.stats import StepObserver, StepSnapshot
from carpool.steps.stream import Stream

__all__ = ["StepInputError", "StepServed", "StepwiseModel"]

Row = Mapping[str, np.ndarray[Any, Any]]
Parameters = Mapping[str, Any]


class StepInputError(CarpoolError, ValueError):
    """A request row or parameter the model's ``request`` refused: the request's fault (a
    400 naming ``field``), never the model's."""

    def __init__(self, message: str, field: str) -> None:
        self.message = message
        self.field = field
        super().__init__(message)

    def _fields(self) -> dict[str, Any]:
        return {"message": self.message, "field": self.field}


def _served_in_steps(batch: Any) -> Any:
    raise TypeError("a step-wise model is served in steps: use its batcher's stream()")


@dataclass
class StepwiseModel(Model):
    """A Model whose answers come in steps, from ``stepper()``'s StepModel.

    ``request(row, parameters)`` makes the model's input from one request row (input name
    -> that row's array) and the request's parameters, raising ValueError naming the field
    it refuses; ``response(output)`` is one step's row of outputs (name -> array);
    ``whole(outputs)`` the row of a whole answer (``/infer``, ``/generate``).
    ``max_sequences`` bounds the sequences aboard each replica, ``step_tokens`` a step's
    tokens; ``prefix_cache_bytes`` is what its replicas may keep of prompts' state for reuse
    (0: off; ``carpool serve`` sets its ``--prefix-cache-size``); workers, runner, queue size,
    policy and timeouts come from ``batching``.
    """

    fn: Callable[[Any], Any] = _served_in_steps
    stepper: Callable[[], StepModel[Any, Any, Any]] | None = None
    request: Callable[[Row, Parameters], Any] | None = None
    response: Callable[[Any], Row] | None = None
    whole: Callable[[list[Any]], Row] | None = None
    max_sequences: int = 16
    step_tokens: int | None = None
    prefix_cache_bytes: int = 0
    observer: StepObserver | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        for hook in ("stepper", "request", "response", "whole"):
            if not callable(getattr(self, hook)):
                raise ConfigError(f"a StepwiseModel needs {hook}=, a callable")
        check_int("prefix_cache_bytes", self.prefix_cache_bytes, 0, note="0: off")

    def batcher(self, **options: Any) -> StepServed:  # type: ignore[override]
        b = self.batching
        assert self.stepper is not None
        policy = "adaptive" if b.policy == "adaptive" else "eager"
        histograms = StepHistograms()
        steps: StepBatcher[Any, Any] = StepBatcher(
            self.stepper,
            max_sequences=self.max_sequences,
            step_tokens=self.step_tokens,
            workers=b.workers,
            runner=b.runner,
            runner_options=b.batcher_options()["runner_options"],
            max_queue_size=b.max_queue_size,
            policy=policy,
            step_timeout_ms=b.batch_timeout_ms,
            name=self.name or "steps",
            observer=options.get("observer", self.observer) or histograms,
            prefix_cache_bytes=self.prefix_cache_bytes,
        )
        return StepServed(self, steps, histograms)


class StepHistograms:
    """The times a server's metrics show for a step-wise model, as steps deliver outputs."""

    def __init__(self) -> None:
        self.first_output = Histogram(LATENCY_BOUNDS)
        self.next_output = Histogram(LATENCY_BOUNDS)

    def on_step(self, sequences: int, seconds: float) -> None:
        return None  # the steps' sizes are counted in the batcher's stats

    def on_first_output(self, seconds: float) -> None:
        self.first_output.add_many([seconds])

    def on_next_output(self, seconds: float) -> None:
        self.next_output.add_many([seconds])


class StepServed:
    """A StepBatcher as the server holds a model's batcher: started and closed on its loop,
    rows answered whole (``infer_many``) or a row's steps streamed (``stream``)."""

    def __init__(
        self, model: StepwiseModel, steps: StepBatcher[Any, Any], histograms: StepHistograms
    ) -> None:
        self.model = model
        self.steps = steps
        self.histograms = histograms
        self.name = steps.name

    async def __aenter__(self) -> StepServed:
        await asyncio.to_thread(self.steps.start)
        return self

    async def aclose(self, *, timeout: float | None = None) -> None:  # noqa: ASYNC109
        await asyncio.to_thread(self.steps.close, 10.0 if timeout is None else timeout)

    def stream(
        self,
        row: Row,
        parameters: Parameters,
        *,
        timeout_ms: float | None = None,
        priority: int = 0,
    ) -> Stream[Any]:
        """One row's sequence; :class:`StepInputError` when ``request`` refuses the row (a
        ValueError, whose second argument, if any, names the field)."""
        assert self.model.request is not None
        try:
            value = self.model.request(row, parameters)
        except ValueError as exc:
            named = len(exc.args) > 1 and isinstance(exc.args[1], str)
            raise StepInputError(str(exc.args[0]), exc.args[1] if named else "parameters") from exc
        return self.steps.stream(value, priority=priority, timeout_ms=timeout_ms)

    async def infer_many(
        self,
        xs: Mapping[str, np.ndarray[Any, Any]],
        *,
        timeout_ms: float | None = None,
        priority: int = 0,
        parameters: Parameters | None = None,
    ) -> dict[str, np.ndarray[Any, Any]]:
        """Each row's whole answer, its sequences run side by side."""
        rows = len(next(iter(xs.values())))
        params = parameters or {}
        streams = [
            self.stream(
                {k: v[i] for k, v in xs.items()}, params, timeout_ms=timeout_ms, priority=priority
            )
            for i in range(rows)
        ]
        try:
            answers = await asyncio.gather(*(s.collect() for s in streams))
        finally:
            for s in streams:
                s.cancel()
        assert self.model.whole is not None
        wholes = [self.model.whole(list(a)) for a in answers]
        return {name: np.stack([w[name] for w in wholes]) for name in wholes[0]}

    def step_stats(self) -> StepSnapshot:
        return self.steps.stats()

    def stats(self) -> BatcherStats:
        """The steps in a one-shot batcher's words: a sequence is a request (its row), a step
        a batch of the sequences it advanced."""
        s = self.steps.stats()
        empty = HistogramSnapshot((), (), 0, 0.0)
        return BatcherStats(
            submitted=s.submitted,
            completed=s.completed,
            failed=s.failed,
            expired=s.expired,
            cancelled=s.cancelled,
            rejected=s.refused,
            pending=self.steps.active + self.steps.waiting,
            queued_rows=self.steps.waiting,
            running_rows=self.steps.active,
            batches=s.steps,
            rows=s.submitted,
            batch_sizes=s.step_sizes,
            dispatch_reasons={},
            queue_wait_ms=Percentiles(),
            model_ms=Percentiles(),
            queue_wait_seconds=empty,
            model_seconds=empty,
            overloaded=s.refused,
            workers_alive=self.steps.workers,
            batch_times={n: BatchTimes() for n in s.step_sizes},
        )

    def learned(self) -> str:
        fixed, per = self.steps.cost_line()
        return f"a step costs {fixed * 1e3:.2f} ms + {per * 1e3:.3f} ms per sequence"

    @property
    def workers_alive(self) -> int:
        return self.steps.workers
