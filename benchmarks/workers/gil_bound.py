"""A GIL-bound model: 2 process workers vs 2 thread workers, rows/s side by side.

What: a pure-Python model (about 2 ms per batch plus a per-row cost, all of it holding the
GIL: tokenizer-like loops) served by ``carpool.Batcher(max_batch_size=32, workers=2)`` under
128 closed-loop callers on the event loop (each awaits ``infer(row)`` and asks again), so
that a full batch always waits for each worker:

``threads``    ``runner="thread"``: the batcher's 2 worker threads call the model
``processes``  ``runner="process"``: the model runs in 2 child processes (shared-memory
               transfer included), what ``carpool serve --runner process`` does

Each repeat runs both, one after the other; the medians over repeats are compared.
Goal: processes/threads >= 1.6x rows/s on a 2-core machine (threads cannot beat 1x: the
GIL lets one of them run at a time). Beside rows/s it prints how many cores each run kept
busy (CPU seconds of this process and the workers / wall seconds): on a shared machine
whose other users leave less than 2 cores, processes cannot reach 2x, and this says so.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Callable
from typing import Any

import _bench  # before numpy: sets single-thread BLAS env vars
import _process
import numpy as np

_bench.import_carpool()

import carpool  # noqa: E402
from carpool.bench.callers import closed_window  # noqa: E402

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


async def measure(fixed: int, per_row: int, repeats: int, seconds: float) -> dict[str, Any]:
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


def main() -> None:
    p = _bench.base_parser(__doc__, default_cpus="none", default_repeats=5)
    args = p.parse_args()
    repeats = args.repeats or (1 if args.quick else 5)
    seconds = 1.0 if args.quick else 3.0
    pinned = _bench.pin(_bench.parse_cpus(args.cpus))
    speed = iterations_per_ms()
    fixed, per_row = int(FIXED_MS * speed), int(ROW_MS * speed)
    _bench.header(
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
    result = asyncio.run(measure(fixed, per_row, repeats, seconds))
    threads, processes = result["runs"]["threads"], result["runs"]["processes"]
    t, pr = _bench.median(r for r, _ in threads), _bench.median(r for r, _ in processes)
    print()
    print(
        _bench.table(
            ["workers", "rows/s (median)", "cores busy (median)"],
            [
                ("2 threads", _bench.fmt_num(t), f"{_bench.median(c for _, c in threads):.2f}"),
                (
                    "2 processes",
                    _bench.fmt_num(pr),
                    f"{_bench.median(c for _, c in processes):.2f}",
                ),
            ],
        )
    )
    ratio = pr / t
    stats = result["stats"]
    print()
    print(
        f"processes/threads = {ratio:.2f}x (goal >= 1.6x: {_bench.verdict(ratio, 1.6)}); "
        f"mean batch {result['mean_batch']:.1f}; worker restarts {stats.worker_restarts}, "
        f"retried {stats.retried_batches}"
    )
    per_core = _bench.median(r / c for r, c in processes) / _bench.median(r / c for r, c in threads)
    print(
        f"rows per busy core-second, processes/threads = {per_core:.2f}x "
        "(below 1: what the boundary costs; the speedup is this times the cores available)"
    )


if __name__ == "__main__":
    main()
