"""The narrated run behind ``carpool demo``: the demo model served one by one, then batched.

It prints what batching bought on this machine and checks that every caller got its own row;
the model itself lives in :mod:`carpool.backends.demo`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from carpool.backends.demo import DemoMLP
from carpool.compat import batch_inference
from carpool.engine.batcher import Batcher

__all__ = ["run_demo"]


async def _serve_concurrently(
    model: DemoMLP, rows: list[np.ndarray[Any, Any]], concurrency: int, max_batch_size: int
) -> tuple[list[Any], float, Any]:
    async with Batcher(model, max_batch_size=max_batch_size, name="demo") as batcher:
        results: list[Any] = [None] * len(rows)
        next_index = 0

        async def caller() -> None:
            nonlocal next_index
            while next_index < len(rows):
                i = next_index
                next_index += 1
                results[i] = await batcher.infer(rows[i])

        started = time.perf_counter()
        async with asyncio.TaskGroup() as tg:
            for _ in range(concurrency):
                tg.create_task(caller())
        elapsed = time.perf_counter() - started
        return results, elapsed, batcher.stats()


def _same_row(got: np.ndarray[Any, Any], expected: np.ndarray[Any, Any]) -> bool:
    """Whether ``got`` is ``expected``'s row, computed in a batch of another size.

    Not bit for bit: BLAS picks its kernel, and so its order of summation, by the batch's
    size and by the CPU (AVX2 or AVX-512), and the demo's rows then differ by up to about
    1.3e-6 (an AVX2 CPU, batches of 5 against batches of 8); another caller's row is off by
    tenths.
    """
    return bool(np.allclose(got, expected, rtol=1e-5, atol=1e-5))


def run_demo(requests: int = 2000, concurrency: int = 64, max_batch_size: int = 32) -> int:
    """Serve ``requests`` single-row requests from ``concurrency`` callers; print what happened."""
    # One BLAS thread: idle OpenBLAS threads spin on both cores and starve the event loop,
    # and a serving process wants one thread per model worker anyway.
    threadpool_limits(1, user_api="blas")
    model = DemoMLP()
    rng = np.random.default_rng(1)
    rows = [rng.standard_normal(model.features).astype(np.float32) for _ in range(requests)]

    print(
        f"carpool demo: {requests} requests, {concurrency} concurrent callers, "
        f"model = numpy MLP {'->'.join(map(str, model.dims))}"
    )
    started = time.perf_counter()
    alone = [model(row[np.newaxis])[0] for row in rows]
    one_by_one = time.perf_counter() - started

    results, batched, stats = asyncio.run(
        _serve_concurrently(model, rows, concurrency, max_batch_size)
    )
    offline = batch_inference(model, rows, batch_size=max_batch_size)
    same = all(_same_row(r, a) for r, a in zip(results, alone, strict=True))
    same_offline = all(_same_row(r, o) for r, o in zip(results, offline, strict=True))

    print(f"  one model call per request : {requests / one_by_one:10.0f} requests/s")
    print(
        f"  carpool.Batcher            : {requests / batched:10.0f} requests/s  "
        f"({one_by_one / batched:.1f}x)"
    )
    print(
        f"  model calls                : {stats.batches} for {stats.rows} rows "
        f"(mean batch {stats.mean_batch_size:.1f}, max_batch_size={max_batch_size})"
    )
    sizes = ", ".join(f"{size}x{count}" for size, count in stats.batch_sizes.items())
    print(f"  batch sizes (rows x calls) : {sizes}")
    reasons = ", ".join(f"{reason}={count}" for reason, count in stats.dispatch_reasons.items())
    print(f"  why batches left           : {reasons}")
    print(
        f"  queue wait p50/p99         : {stats.queue_wait_ms.p50:.2f} / "
        f"{stats.queue_wait_ms.p99:.2f} ms; model call p50 {stats.model_ms.p50:.2f} ms"
    )
    print(f"  every caller got its own row (same as running it alone): {same and same_offline}")
    print(
        f"  outcomes: completed={stats.completed} failed={stats.failed} "
        f"expired={stats.expired} cancelled={stats.cancelled}"
    )
    return 0 if same and same_offline and stats.completed == requests else 1
