"""Running a batch: a model's errors reach only the rows that raised them, a wrong row count
fails the whole batch, plain models run in worker threads, several workers at once."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from carpool import Batcher, BatchSizeMismatch, ModelExit


async def test_a_model_error_reaches_only_the_failing_rows() -> None:
    calls: list[int] = []

    def model(batch: np.ndarray) -> np.ndarray:
        calls.append(len(batch))
        if (batch < 0).any():
            raise ValueError("negative input")
        return batch * 2

    async with Batcher(model, max_batch_size=8) as batcher:
        results = await asyncio.gather(
            *(batcher.infer(np.array([v])) for v in [1, 2, -3, 4, 5, 6, 7, 8]),
            return_exceptions=True,
        )
        stats = batcher.stats()
    error = results[2]
    assert isinstance(error, ValueError)
    assert str(error) == "negative input"
    assert any("on a batch of 1 rows" in note for note in error.__notes__)
    assert [r.tolist() for i, r in enumerate(results) if i != 2] == [
        [2], [4], [8], [10], [12], [14], [16]
    ]  # fmt: skip
    # halves re-run down to the bad row: 8 -> 4 (bad) -> 2 (ok), 2 (bad) -> 1 (bad), 1 -> 4 (ok)
    assert calls == [8, 4, 2, 2, 1, 1, 4]
    assert (stats.completed, stats.failed) == (7, 1)


@pytest.mark.parametrize("raised", [SystemExit(3), KeyboardInterrupt()])
async def test_a_model_that_exits_fails_only_its_rows_and_the_batcher_serves_on(
    raised: BaseException,
) -> None:
    # In a worker thread, SystemExit or KeyboardInterrupt would reach the loop and stop it.
    def model(batch: np.ndarray) -> np.ndarray:
        if (batch == 13).any():
            raise raised
        return batch * 2

    async with Batcher(model, max_batch_size=4) as batcher:
        results = await asyncio.gather(
            *(batcher.infer(np.array([v])) for v in [1, 13, 3, 4]), return_exceptions=True
        )
        assert (await batcher.infer(np.array([5]))).tolist() == [10]  # it serves on
    error = results[1]
    assert isinstance(error, ModelExit)
    assert error.error is raised
    assert str(error).startswith(f"the model raised {type(raised).__name__}")
    assert any("on a batch of 1 rows" in note for note in error.__notes__)
    assert [r.tolist() for i, r in enumerate(results) if i != 1] == [[2], [6], [8]]


async def test_an_async_model_that_exits_fails_its_rows_and_the_batcher_serves_on() -> None:
    # On the loop's own thread: a task raising SystemExit would stop the loop.
    async def model(batch: np.ndarray) -> np.ndarray:
        if (batch == 13).any():
            raise SystemExit(3)
        return batch * 2

    async with Batcher(model, max_batch_size=4) as batcher:
        results = await asyncio.gather(
            *(batcher.infer(np.array([v])) for v in [1, 13]), return_exceptions=True
        )
        assert (await batcher.infer(np.array([5]))).tolist() == [10]
    assert results[0].tolist() == [2]  # type: ignore[union-attr]
    assert isinstance(results[1], ModelExit)
    assert isinstance(results[1].error, SystemExit)


async def test_without_isolation_the_whole_batch_fails() -> None:
    def model(batch: np.ndarray) -> np.ndarray:
        if (batch < 0).any():
            raise ValueError("negative input")
        return batch

    async with Batcher(model, max_batch_size=4, isolate_errors=False) as batcher:
        results = await asyncio.gather(
            *(batcher.infer(np.array([v])) for v in [1, -2, 3, 4]), return_exceptions=True
        )
        assert (await batcher.infer(np.array([5]))).tolist() == [5]  # the next batch is fine
    assert all(isinstance(r, ValueError) for r in results)


async def test_wrong_row_count_is_an_error_for_the_whole_batch() -> None:
    async with Batcher(lambda b: b[:-1], max_batch_size=4) as batcher:
        results = await asyncio.gather(
            *(batcher.infer(np.array([v])) for v in range(4)), return_exceptions=True
        )
    assert all(isinstance(r, BatchSizeMismatch) for r in results)
    error = results[0]
    assert isinstance(error, BatchSizeMismatch)
    assert (error.expected, error.actual) == (4, 3)
    assert "returned 3 rows" in str(error)
    assert "batch of 4 rows" in str(error)


async def test_workers_run_batches_concurrently_and_results_route_correctly() -> None:
    releases = [asyncio.Event(), asyncio.Event()]
    entered: list[asyncio.Event] = [asyncio.Event(), asyncio.Event()]
    order: list[int] = []

    async def model(batch: np.ndarray) -> np.ndarray:
        index = len(order)
        order.append(index)
        entered[index].set()
        await releases[index].wait()
        return batch + 1000 * index

    async with Batcher(model, max_batch_size=4, workers=2) as batcher:
        first = asyncio.ensure_future(batcher.infer(np.array([1])))
        await entered[0].wait()
        second = asyncio.ensure_future(batcher.infer(np.array([2])))
        await entered[1].wait()  # both workers busy at once
        releases[1].set()  # the later batch finishes first
        assert (await second).tolist() == [1002]
        assert not first.done()
        releases[0].set()
        assert (await first).tolist() == [1]


async def test_a_plain_model_runs_in_worker_threads() -> None:
    threads: set[int] = set()

    def model(batch: np.ndarray) -> np.ndarray:
        threads.add(threading.get_ident())
        return batch

    async with Batcher(model) as batcher:
        await batcher.infer(np.array([1]))
    assert threads
    assert threading.get_ident() not in threads
