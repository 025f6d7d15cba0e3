"""A model served in this process by its own batcher, as ``carpool bench`` measures it: loaded as
``carpool serve`` loads it, requests submitted as the server submits them, stats read as a
scrape of ``/metrics`` would read them. No HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from carpool.bench.report.data import ServerSide
from carpool.bench.report.scrape import Histograms, exact_buckets, server_side
from carpool.bench.targets.base import Client, Send
from carpool.engine.batcher import Batcher
from carpool.engine.stats import BatcherStats
from carpool.model import Model, Preprocess

__all__ = ["LocalClient", "LocalTarget", "metadata_of", "snapshot_of"]

Array = np.ndarray[Any, Any]


def metadata_of(model: Model) -> dict[str, Any]:
    """The v2 metadata ``carpool serve`` gives for ``model`` (a leading -1 when it batches)."""
    batched = model.batching.batched

    def tensor(spec: Any) -> dict[str, Any]:
        shape = [-1, *spec.shape] if batched else list(spec.shape)
        return {"name": spec.name, "datatype": spec.datatype, "shape": shape}

    return {
        "name": model.name,
        "versions": [model.version],
        "platform": model.platform,
        "inputs": [tensor(t) for t in model.input_specs],
        "outputs": [tensor(t) for t in model.output_specs],
    }


class LocalTarget:
    """A model served in this process by its own batcher, which ``serving`` runs."""

    kind = "in-process"

    def __init__(self, model: Model, batcher: Batcher, text: str) -> None:
        self.model = model
        self.batcher = batcher
        self.metadata = metadata_of(model)
        self.name = str(model.name)
        self._text = text

    def __str__(self) -> str:
        return self._text

    @classmethod
    @asynccontextmanager
    async def serving(cls, model: Model, text: str) -> AsyncIterator[LocalTarget]:
        async with model.batcher() as batcher:
            yield cls(model, batcher, text)

    def client(self, values: Sequence[Mapping[str, Array]]) -> Client:
        batched = self.model.batching.batched
        # a model that does not batch gets its tensor whole; the batcher still wants rows
        rows = [{k: v if batched else v[np.newaxis] for k, v in r.items()} for r in values]
        return LocalClient(self.batcher, rows, self.model.preprocess)

    async def snapshot(self) -> Histograms:
        return snapshot_of(self.batcher.stats(), self.model.batching.max_batch_size)

    def server_side(
        self, before: Histograms, after: Histograms, latency_sum_s: float
    ) -> ServerSide:
        return server_side(before, after, latency_sum_s=latency_sum_s)


@dataclass(frozen=True, slots=True)
class LocalClient:
    """Requests straight into a running batcher, as the server submits them: the model's
    ``preprocess`` on arrival, then ``infer_many``. No HTTP: the batcher measured alone."""

    batcher: Batcher
    values: list[dict[str, Array]]
    preprocess: Preprocess | None

    @asynccontextmanager
    async def open(self, connections: int) -> AsyncIterator[Send]:
        infer_many, values, n, prep = (
            self.batcher.infer_many,
            self.values,
            len(self.values),
            self.preprocess,
        )

        async def send(i: int) -> str | None:
            try:
                value: Any = values[i % n]
                if prep is not None:
                    value = dict(prep(value))
                await infer_many(value)
            except Exception as exc:  # counted by kind: QueueFull, the model's own error
                return type(exc).__name__
            return None

        yield send


def snapshot_of(stats: BatcherStats, max_batch_size: int) -> Histograms:
    """What ``/metrics`` would say of a batcher with these stats, as a scrape reads it, but
    with a bucket per batch size up to ``max_batch_size`` (the batcher counts each size
    exactly); so in-process and HTTP steps get their server-side figures from the same
    arithmetic."""
    return Histograms(
        batch_count=stats.batches,
        batch_rows=stats.rows,
        batch_buckets=exact_buckets(stats.batch_sizes, max(1, max_batch_size)),
        queue_wait_count=stats.queue_wait_seconds.count,
        queue_wait_sum=stats.queue_wait_seconds.sum,
        model_count=stats.model_seconds.count,
        model_sum=stats.model_seconds.sum,
    )
