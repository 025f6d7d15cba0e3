"""A GIL-bound model: 2 process workers vs 2 thread workers, rows/s side by side.

What: a pure-Python model (about 2 ms per batch plus a per-row cost, all of it holding the
GIL: tokenizer-like loops) called on 32-row batches by 2 threads for a fixed time:

``threads``    each thread calls the model itself, as a batcher's 2 worker threads do today
``processes``  each thread calls ``ProcessPool(model, 2).call``, so the model runs in 2
               child processes (shared-memory transfer included)

Each repeat runs both, one after the other; the medians over repeats are compared.
Goal: processes/threads >= 1.6x rows/s on a 2-core machine (threads cannot beat 1x: the
GIL lets one of them run at a time). Beside rows/s it prints how many cores each run kept
busy (CPU seconds of this process and the workers / wall seconds): on a shared machine
whose other users leave less than 2 cores, processes cannot reach 2x, and this says so.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _bench  # before numpy: sets single-thread BLAS env vars
import numpy as np

_bench.import_carpool()

from carpool.process_pool import ProcessPool  # noqa: E402

ROWS = 32
FIXED_MS = 2.0  # per batch
ROW_MS = 0.05  # per row: 32 rows add 1.6 ms


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


def cpu_seconds(pids: list[int]) -> float:
    """CPU time used so far by this process and the processes ``pids`` (Linux /proc)."""
    total = time.process_time()
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return total


def rows_per_s(
    call: Callable[[Any], Any], seconds: float, pids: list[int], threads: int = 2
) -> tuple[float, float]:
    """Rows/s that ``threads`` threads calling ``call`` in a loop get in ``seconds``, and
    how many cores this process and ``pids`` kept busy meanwhile (CPU seconds / wall)."""
    batch = np.random.default_rng(0).standard_normal((ROWS, 8)).astype(np.float32)
    counts = [0] * threads
    start_line = threading.Barrier(threads + 1)
    stop_at = [0.0]

    def loop(index: int) -> None:
        start_line.wait()
        while time.perf_counter() < stop_at[0]:
            call(batch)
            counts[index] += ROWS

    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    cpu = cpu_seconds(pids)
    begin = time.perf_counter()
    stop_at[0] = begin + seconds
    start_line.wait()
    for worker in workers:
        worker.join()
    wall = time.perf_counter() - begin
    return sum(counts) / wall, (cpu_seconds(pids) - cpu) / wall


def main() -> None:
    p = _bench.base_parser(__doc__, default_cpus="none", default_repeats=5)
    args = p.parse_args()
    repeats = args.repeats or (1 if args.quick else 5)
    seconds = 1.0 if args.quick else 3.0
    pinned = _bench.pin(_bench.parse_cpus(args.cpus))
    speed = iterations_per_ms()
    fixed, per_row = int(FIXED_MS * speed), int(ROW_MS * speed)
    _bench.header(
        "GIL-bound model: 2 process workers vs 2 thread workers",
        {
            "cpus": pinned,
            "load": f"{os.getloadavg()[0]:.1f}",
            "rows/batch": ROWS,
            "seconds": seconds,
            "repeats": repeats,
        },
    )
    model = GilModel(fixed, per_row)
    print(f"model: {FIXED_MS} ms/batch + {ROW_MS} ms/row of pure Python ({fixed} + {per_row}/row)")
    spec = functools.partial(GilModel, fixed, per_row)  # built once in each worker
    threads, processes, thread_cores, process_cores = [], [], [], []
    with ProcessPool(spec, 2, name="gil") as pool:
        pids = [w.pid for w in pool.stats().processes if w.pid is not None]
        rows_per_s(pool.call, 0.2, pids)  # warm both workers up
        for _ in range(repeats):
            rate, cores = rows_per_s(model, seconds, [])
            threads.append(rate)
            thread_cores.append(cores)
            rate, cores = rows_per_s(pool.call, seconds, pids)
            processes.append(rate)
            process_cores.append(cores)
            print(
                f"  threads {threads[-1]:8.0f} rows/s on {thread_cores[-1]:.2f} cores   "
                f"processes {processes[-1]:8.0f} rows/s on {process_cores[-1]:.2f} cores"
            )
        stats = pool.stats()
    t, pr = _bench.median(threads), _bench.median(processes)
    print()
    print(
        _bench.table(
            ["workers", "rows/s (median)", "cores busy (median)"],
            [
                ("2 threads", _bench.fmt_num(t), f"{_bench.median(thread_cores):.2f}"),
                ("2 processes", _bench.fmt_num(pr), f"{_bench.median(process_cores):.2f}"),
            ],
        )
    )
    ratio = pr / t
    print()
    print(
        f"processes/threads = {ratio:.2f}x (goal >= 1.6x: {_bench.verdict(ratio, 1.6)}); "
        f"worker restarts {stats.restarts}, retried {stats.retried}"
    )
    per_core = _bench.median(r / c for r, c in zip(processes, process_cores, strict=True)) / (
        _bench.median(r / c for r, c in zip(threads, thread_cores, strict=True))
    )
    print(
        f"rows per busy core-second, processes/threads = {per_core:.2f}x "
        "(below 1: what the boundary costs; the speedup is this times the cores available)"
    )


if __name__ == "__main__":
    main()
