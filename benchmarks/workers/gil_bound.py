"""A GIL-bound model in carpool.Batcher(workers=2): 2 process workers against 2 threads.

Rows/s and the cores each kept busy, 128 closed-loop callers; goal: processes/threads
>= 1.6x on 2 free cores (threads cannot beat 1x: the GIL runs one at a time).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import carpool
from benchmarks.harness import Figures, common, run
from benchmarks.harness import processes as _process
from carpool.bench.callers import closed_window

ROWS = 32
FIXED_MS = 2.0  # per batch
ROW_MS = 0.05  # per row: 32 rows add 1.6 ms
CLIENTS = 128  # two batches running and two staged behind them: no worker waits


class GilModel:
    """Spins pure Python for ``fixed + rows * per_row`` loop iterations per batch."""

    def __init__(self, fixed: int, per_row: int) -> None:
        self.fixed = fixed
        self.per_row = per_row

    def __call__(self, batch: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        total = 0
        for i in range(self.fixed + len(batch) * self.per_row):
            total += i % 7
        return np.full((len(batch), 4), total % 1000, dtype=np.float32)


def iterations_per_ms() -> float:
    """How many loop iterations of GilModel take 1 ms here (best of a few)."""
    probe = GilModel(200_000, 0)
    batch = np.zeros((1, 8), np.float32)
    best = min(_timed_once(probe, batch) for _ in range(5))
    return 200_000 / (best * 1000)


def _timed_once(fn: Callable[[Any], Any], batch: Any) -> float:
    start = time.perf_counter()
    fn(batch)
    return time.perf_counter() - start


async def rows_per_s(
    batcher: carpool.Batcher, seconds: float, pids: list[int]
) -> tuple[float, float]:
    """Rows/s that CLIENTS closed-loop callers get through ``batcher`` in ``seconds`` (every
    answer that arrives in the window counts), and how many cores this process and ``pids``
    kept busy meanwhile (CPU seconds / wall)."""
    row = np.zeros(8, np.float32)

    async def send(i: int) -> None:
        await batcher.infer(row)

    window = await closed_window(
        send,
        callers=CLIENTS,
        warmup_s=0.2,  # every caller has a request in the queue
        seconds=seconds,
        read=lambda: _process.total_cpu_seconds(pids),
    )
    return window.answered_per_s, (window.closed - window.opened) / window.seconds


async def side_by_side(fixed: int, per_row: int, repeats: int, seconds: float) -> dict[str, Any]:
    options: dict[str, Any] = {"max_batch_size": ROWS, "workers": 2, "name": "gil"}
    spec = functools.partial(GilModel, fixed, per_row)  # built once in each worker process
    runs: dict[str, list[tuple[float, float]]] = {"threads": [], "processes": []}
    async with (
        carpool.Batcher(GilModel(fixed, per_row), **options) as threads,
        carpool.Batcher(spec, runner="process", **options) as processes,
    ):
        pids = _process.worker_pids()
        await rows_per_s(processes, 0.2, pids)  # warm both workers up
        for _ in range(repeats):
            runs["threads"].append(await rows_per_s(threads, seconds, []))
            runs["processes"].append(await rows_per_s(processes, seconds, pids))
            (t, tc), (p, pc) = runs["threads"][-1], runs["processes"][-1]
            print(
                f"  threads {t:8.0f} rows/s on {tc:.2f} cores   "
                f"processes {p:8.0f} rows/s on {pc:.2f} cores"
            )
        stats = processes.stats()
    return {"runs": runs, "stats": stats, "mean_batch": stats.mean_batch_size}


def parser() -> argparse.ArgumentParser:
    return common.base_parser(__doc__, default_cpus="none", default_repeats=5)


def measure(args: argparse.Namespace) -> Figures:
    """Both runners, their repeats interleaved: medians of rows/s and cores busy, their
    ratio, and the process workers' restarts and retried batches (none expected)."""
    repeats = args.repeats or (1 if args.quick else 5)
    seconds = 1.0 if args.quick else 3.0
    pinned = common.pin(common.parse_cpus(args.cpus))
    speed = iterations_per_ms()
    fixed, per_row = int(FIXED_MS * speed), int(ROW_MS * speed)
    common.header(
        "GIL-bound model: 2 process workers vs 2 thread workers, through carpool.Batcher",
        {
            "cpus": pinned,
            "load": f"{os.getloadavg()[0]:.1f}",
            "max_batch_size": ROWS,
            "callers": CLIENTS,
            "seconds": seconds,
            "repeats": repeats,
        },
    )
    print(f"model: {FIXED_MS} ms/batch + {ROW_MS} ms/row of pure Python ({fixed} + {per_row}/row)")
    result = asyncio.run(side_by_side(fixed, per_row, repeats, seconds))
    threads, processes = result["runs"]["threads"], result["runs"]["processes"]
    t, pr = common.median(r for r, _ in threads), common.median(r for r, _ in processes)
    tc, pc = common.median(c for _, c in threads), common.median(c for _, c in processes)
    print()
    print(
        common.table(
            ["workers", "rows/s (median)", "cores busy (median)"],
            [
                ("2 threads", common.fmt_num(t), f"{tc:.2f}"),
                ("2 processes", common.fmt_num(pr), f"{pc:.2f}"),
            ],
        )
    )
    stats = result["stats"]
    per_core = common.median(r / c for r, c in processes) / common.median(r / c for r, c in threads)
    figures = Figures()
    figures.add("threads_rows_per_s", t, "rows/s")
    figures.add("processes_rows_per_s", pr, "rows/s")
    figures.add("threads_cores_busy", tc, "cores")
    figures.add("processes_cores_busy", pc, "cores")
    figures.at_least("processes_over_threads", pr / t, 1.6)
    # below 1: what the boundary costs; the speedup is this times the cores available
    figures.add("processes_over_threads_per_core", per_core, "x")
    figures.add("processes_mean_batch", result["mean_batch"], "rows")
    figures.add("worker_restarts", stats.worker_restarts)
    figures.add("retried_batches", stats.retried_batches)
    return figures


if __name__ == "__main__":
    raise SystemExit(run(measure, parser()))
