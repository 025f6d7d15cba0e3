"""A step-wise model served in this process, as ``carpool bench --stream`` measures it: its
batcher started as ``carpool serve`` starts it, each request a ``stream()`` read to its end,
steps counted as a batcher's batches. No HTTP: the step batcher measured alone."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from carpool.bench.report.data import ServerSide
from carpool.bench.report.scrape import Histograms, server_side
from carpool.bench.targets.base import Client, Send, Streamed
from carpool.bench.targets.local_target import metadata_of, snapshot_of
from carpool.bench.targets.stream_requests import StreamRequest
from carpool.stepwise import StepServed, StepwiseModel

__all__ = ["StepClient", "StepTarget"]


class StepTarget:
    """A step-wise model served in this process by its step batcher, which ``serving`` runs;
    its server side is the batcher's steps (a step is a batch of the sequences it advanced)."""

    kind = "in-process"

    def __init__(self, model: StepwiseModel, served: StepServed, text: str) -> None:
        self.model = model
        self.served = served
        self.metadata = metadata_of(model)
        self.name = str(model.name)
        self._text = text

    def __str__(self) -> str:
        return self._text

    @classmethod
    @asynccontextmanager
    async def serving(cls, model: StepwiseModel, text: str) -> AsyncIterator[StepTarget]:
        served = await model.batcher().__aenter__()
        try:
            yield cls(model, served, text)
        finally:
            await served.aclose()

    def client(self, requests: Sequence[StreamRequest]) -> Client:
        batched = self.model.batching.batched
        rows = tuple((r.row(batched), r.parameters) for r in requests)
        return StepClient(self.served, rows)

    async def snapshot(self) -> Histograms:
        return snapshot_of(self.served.stats(), self.model.max_sequences)

    def server_side(
        self, before: Histograms, after: Histograms, latency_sum_s: float
    ) -> ServerSide:
        return server_side(before, after, latency_sum_s=latency_sum_s)


@dataclass(frozen=True, slots=True)
class StepClient:
    """Rows streamed straight from a running step batcher, as the server streams them."""

    served: StepServed
    rows: tuple[tuple[dict[str, Any], dict[str, int]], ...]

    @asynccontextmanager
    async def open(self, connections: int) -> AsyncIterator[Send]:
        stream, rows, clock = self.served.stream, self.rows, time.perf_counter

        async def send(i: int) -> str | Streamed | None:
            sent = clock()
            arrivals: list[float] = []
            row, parameters = rows[i % len(rows)]
            try:
                async for _ in stream(row, parameters):
                    arrivals.append(clock())
            except Exception as exc:  # counted by kind: QueueFull, the model's own error
                return type(exc).__name__
            return Streamed.of(sent, arrivals)

        yield send
