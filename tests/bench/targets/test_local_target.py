"""A model served in this process (``carpool.bench.targets.local_target``): its metadata as
``carpool serve`` answers it, the in-process client, and server-side
figures from a batcher's stats read exactly as a scrape of carpool's ``/metrics`` would read
them."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import numpy as np
import pytest

from carpool import Batching, Model, Tensor
from carpool.bench.report.scrape import parse_metrics, server_side
from carpool.bench.targets.local_target import LocalTarget, metadata_of, snapshot_of
from carpool.server.lifecycle.registry import Registry, ServedModel
from carpool.server.telemetry.metrics import Metrics


def _declared(name: str, batching: Batching) -> Model:
    return Model(
        lambda batch: batch,
        name=name,
        inputs=[Tensor("INPUT0", "FP32", (4,)), Tensor("ids", "INT64", (-1,))],
        outputs=[Tensor("OUTPUT0", "FP32", (4,))],
        batching=batching,
    )


@pytest.mark.parametrize("batching", [Batching(), Batching(max_batch_size=0)])
def test_in_process_metadata_is_what_carpool_serve_answers(batching: Batching) -> None:
    model = _declared("m", batching)
    assert metadata_of(model) == ServedModel(model).metadata()


def _negative_fails(batch: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    if (batch < 0).any():
        raise ValueError("negative")
    return batch


async def test_the_in_process_client_counts_failures_by_exception_type() -> None:
    model = Model(_negative_fails, name="neg", batching=Batching(max_queue_size=1, workers=1))
    rows = [{"INPUT0": np.ones((1, 2), np.float32)}, {"INPUT0": -np.ones((1, 2), np.float32)}]
    async with LocalTarget.serving(model, "neg") as target, target.client(rows).open(1) as send:
        assert await send(0) is None
        assert await send(1) == "ValueError"
        outcomes = await asyncio.gather(*(send(0) for _ in range(5)))
    assert "QueueFull" in outcomes  # five at once into a queue of one row


async def test_a_model_without_batching_gets_its_whole_tensor() -> None:
    seen: list[tuple[int, ...]] = []

    def whole(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        seen.append(x.shape)
        return x

    model = Model(
        whole,
        name="whole",
        inputs=[Tensor("INPUT0", "FP32", (2, 3))],
        batching=Batching(max_batch_size=0),
    )
    rows = [{"INPUT0": np.zeros((2, 3), np.float32)}]
    async with LocalTarget.serving(model, "whole") as target, target.client(rows).open(1) as send:
        assert await send(0) is None
    assert seen == [(2, 3)]


async def test_in_process_server_side_reads_as_a_scrape_of_the_same_batcher() -> None:
    """snapshot_of(stats) is what parse_metrics reads from /metrics for that batcher but
    for its buckets, one per size, so in-process and HTTP steps report the same figures and
    in-process batch sizes are exact."""
    model = Model(lambda batch: batch * 2, name="double", batching=Batching(max_batch_size=8))
    registry = Registry([model])
    (served,) = registry
    async with served.batcher as batcher:
        empty = snapshot_of(batcher.stats(), 8)
        await asyncio.gather(
            *(batcher.infer_many({"INPUT0": np.ones((k, 3), np.float32)}) for k in (1, 2, 3, 5))
        )
        stats = batcher.stats()
        text = Metrics(registry).render().decode()
    scraped = parse_metrics(text, "double")
    assert scraped is not None
    snapshot = snapshot_of(stats, 8)
    assert dataclasses.replace(snapshot, batch_buckets=scraped.batch_buckets) == scraped
    side = server_side(empty, snapshot, latency_sum_s=1.0)
    assert (side.rows, side.batches) == (11, stats.batches)
    assert side.batch_sizes == {str(size): n for size, n in stats.batch_sizes.items()}
    assert side.batch_size_floors == {}
