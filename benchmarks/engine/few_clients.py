"""A few closed-loop clients, fewer than max_batch_size: what each policy makes of them.

4, 8 and 16 clients (threads and asyncio tasks) against a sleep model, eager vs adaptive:
req/s, p50/p99 and mean batch; the figure ``default_policy`` names the default.
Method and results: docs/benchmarks/engine.md."""

from __future__ import annotations

import argparse
import asyncio
import inspect
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

import carpool
from benchmarks.harness import Figures, run
from benchmarks.harness import common as _bench
from carpool.bench.report.data import percentile

MAX_BATCH = 32
SLO_MS = 25.0  # about 7 full batches of the sleep model: room to batch, tight enough to matter
FIXED_S, PER_ROW_S = 0.002, 0.00005  # the sleep model: 2 ms + 0.05 ms per row
ROW = np.zeros(4, np.float32)
STAGGER_S = 0.004  # the clients' first requests spread over about one batch time
WARM_S = 0.2  # threads started, batches settled into their pattern


def sleep_model(batch: Any) -> Any:
    """A GPU-like cost that releases the GIL: 2 ms + 0.05 ms per row."""
    time.sleep(FIXED_S + PER_ROW_S * len(batch))
    return batch


def policies() -> dict[str, dict[str, Any]]:
    """The Batcher options of each policy compared."""
    return {
        "eager": {"policy": "eager"},
        "adaptive": {"policy": "adaptive", "latency_slo_ms": SLO_MS, "warmup": ROW},
    }


async def closed_loop(
    options: dict[str, Any], clients: int, seconds: float, kind: str
) -> dict[str, Any]:
    """``clients`` closed-loop callers: requests/s, every latency (seconds) and the mean
    batch size of ``seconds`` measured after a warm-up. ``kind="tasks"``: asyncio tasks
    awaiting ``infer`` on the batcher's loop; ``kind="threads"``: threads blocking on
    ``submit(row).result()``, as separate callers (a server's handlers, other processes)
    reach a batcher, an answer's round trip away. The clients join one by one, spread over
    about one batch time as in life, and run on without a pause into the measured part."""
    latencies: list[float] = []
    refused = [0]  # adaptive's answers that the objective cannot be made (a busy box)
    async with carpool.Batcher(sleep_model, max_batch_size=MAX_BATCH, **options) as b:
        loop = asyncio.get_running_loop()
        measured = time.perf_counter() + WARM_S
        until = measured + seconds
        delays = [i * STAGGER_S / clients for i in range(clients)]

        def done(start: float) -> None:
            if start >= measured:
                latencies.append(time.perf_counter() - start)

        async def task(delay: float) -> None:
            await asyncio.sleep(delay)
            while (start := time.perf_counter()) < until:
                try:
                    await b.infer(ROW)
                except carpool.CarpoolError:
                    refused[0] += 1
                    continue
                done(start)

        def thread(delay: float) -> None:
            time.sleep(delay)
            while (start := time.perf_counter()) < until:
                try:
                    b.submit(ROW).result()
                except carpool.CarpoolError:  # raised here, it would leave the loop blocked
                    refused[0] += 1  # in the pool's exit, the others' answers never sent
                    continue
                done(start)

        before: list[carpool.BatcherStats] = []
        loop.call_later(WARM_S, lambda: before.append(b.stats()))
        if kind == "tasks":
            await asyncio.gather(*(task(delay) for delay in delays))
        else:
            with ThreadPoolExecutor(clients) as pool:
                await asyncio.gather(*(loop.run_in_executor(pool, thread, d) for d in delays))
        after = b.stats()
    batches = after.batches - before[0].batches
    rows = after.rows - before[0].rows
    return {
        "rps": len(latencies) / seconds,
        "latencies": latencies,
        "mean_batch": rows / batches if batches else float("nan"),
        "refused": refused[0],
    }


def parser() -> argparse.ArgumentParser:
    p = _bench.base_parser(__doc__, default_cpus="none", default_repeats=3)
    p.add_argument("--seconds", type=float, default=None, help="per run (default 2.0)")
    p.add_argument("--clients", default="4,8,16", help="comma-separated client counts")
    return p


def measure(args: argparse.Namespace) -> Figures:
    _bench.pin(_bench.parse_cpus(args.cpus))
    repeats = args.repeats or (1 if args.quick else 3)
    seconds = args.seconds or (0.25 if args.quick else 2.0)
    counts = [int(n) for n in args.clients.split(",")]
    default = inspect.signature(carpool.Batcher).parameters["policy"].default
    print(
        f"== few closed-loop clients: sleep model 2 ms + 0.05 ms/row, max_batch_size "
        f"{MAX_BATCH}, 1 worker, adaptive latency_slo_ms={SLO_MS:g}; {repeats} x {seconds:g} s =="
    )
    kinds = ["threads", "tasks"]
    runs: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for repeat in range(repeats):
        for kind in kinds:
            for clients in counts:
                for name, options in policies().items():
                    result = asyncio.run(closed_loop(options, clients, seconds, kind))
                    runs.setdefault((kind, name, clients), []).append(result)
                    print(
                        f"  repeat {repeat + 1}/{repeats}  {kind:7s} {clients:3d} clients  "
                        f"{name:9s}{result['rps']:>9,.0f} req/s  "
                        f"mean batch {result['mean_batch']:5.1f}"
                        + (f"  refused {result['refused']}" if result["refused"] else "")
                    )
    figures = Figures()
    rows = []
    for kind in kinds:
        for clients in counts:
            for name in policies():
                results = runs[(kind, name, clients)]
                latencies = [x for r in results for x in r["latencies"]]
                rps = statistics.median(r["rps"] for r in results)
                p50 = percentile(latencies, 50) * 1000
                p99 = percentile(latencies, 99) * 1000
                batch = sum(r["mean_batch"] for r in results) / len(results)
                rows.append(
                    [
                        kind,
                        str(clients),
                        f"{name}{' (default)' if name == default else ''}",
                        f"{rps:,.0f}",
                        f"{p50:.2f}",
                        f"{p99:.2f}",
                        f"{batch:.1f}",
                    ]
                )
                where = f"{kind}_{clients}_clients_{name}"
                figures.add(f"{where}_req_per_s", rps, "req/s")
                figures.add(f"{where}_p50_ms", p50, "ms")
                figures.add(f"{where}_p99_ms", p99, "ms")
                figures.add(f"{where}_mean_batch", batch, "rows")
                figures.add(f"{where}_refused", sum(r["refused"] for r in results), "requests")
    print()
    headers = ["callers", "clients", "policy", "req/s", "p50 ms", "p99 ms", "mean batch"]
    print(_bench.table(headers, rows, left=3))
    print(f"\n  few clients: the default policy is {default!r}")
    figures.add("default_policy", str(default))
    return figures


if __name__ == "__main__":
    raise SystemExit(run(measure, parser()))
