"""Goodput of 2 process workers while one is killed (SIGKILL) every 5 s, against no kills.

Batcher(runner="process", workers=2), a 10 ms GIL-releasing model, 64 closed-loop callers;
every request must end in an answer or a typed error. Goal: goodput ratio >= 0.8.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import time
from collections import Counter
from typing import Any

import numpy as np

import carpool
from benchmarks.harness import Figures, common, run
from benchmarks.harness import processes as _process
from carpool.bench.callers import closed_window

CLIENTS = 64
BATCH_S = 0.010
KILL_EVERY_S = 5.0


def sleepy(batch: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """10 ms a batch, the GIL released: the model process waits like a GPU call would."""
    time.sleep(BATCH_S)
    return batch * 2


async def killer(seconds: float, every: float, killed: list[int]) -> None:
    """SIGKILL one live worker every ``every`` seconds, for ``seconds``."""
    rng = random.Random(0)
    deadline = time.perf_counter() + seconds
    while True:
        await asyncio.sleep(every)
        if time.perf_counter() >= deadline:
            return
        pids = _process.worker_pids()
        if pids:
            victim = rng.choice(pids)
            os.kill(victim, signal.SIGKILL)
            killed.append(victim)


async def one_run(seconds: float, kill_every: float | None) -> dict[str, Any]:
    """One run: CLIENTS callers for ``seconds``, optionally killing workers meanwhile."""
    outcomes: Counter[str] = Counter()
    sent = [0]
    rows = [np.full(4, float(index), np.float32) for index in range(CLIENTS)]
    batcher = carpool.Batcher(sleepy, runner="process", workers=2, max_batch_size=32, name="sleepy")

    async def send(i: int) -> str | None:
        row = rows[i % CLIENTS]
        sent[0] += 1
        try:
            out = await batcher.infer(row)
        except carpool.CarpoolError as exc:
            outcomes[type(exc).__name__] += 1
            return type(exc).__name__
        assert np.array_equal(out, row * 2)
        outcomes["answered"] += 1
        return None

    async with batcher:
        killed: list[int] = []
        begin = time.perf_counter()
        async with asyncio.TaskGroup() as tg:
            if kill_every is not None:
                tg.create_task(killer(seconds, kill_every, killed))
            await closed_window(
                send, callers=CLIENTS, warmup_s=0.0, seconds=seconds, read=lambda: None
            )
        wall = time.perf_counter() - begin
        stats = batcher.stats()
    return {
        "goodput": outcomes["answered"] / wall,
        "outcomes": dict(outcomes),
        "sent": sent[0],
        "lost": sent[0] - sum(outcomes.values()),
        "books_agree": stats.pending == 0 and stats.submitted == sent[0],
        "killed": len(killed),
        "restarts": stats.worker_restarts,
        "retried": stats.retried_batches,
        "mean_batch": stats.mean_batch_size,
    }


def parser() -> argparse.ArgumentParser:
    return common.base_parser(__doc__, default_cpus="none", default_repeats=1)


def measure(args: argparse.Namespace) -> Figures:
    """A fault-free run, then a faulty one as long: goodput of each and their ratio, the
    faulty run's kills, restarts, retries and errors; checks that no request was lost and
    that the batcher's books agree (nothing pending, every request submitted)."""
    seconds = 5.0 if args.quick else 60.0
    every = 2.0 if args.quick else KILL_EVERY_S
    pinned = common.pin(common.parse_cpus(args.cpus))
    common.header(
        "process workers under kill -9: goodput against a fault-free run",
        {
            "cpus": pinned,
            "load": f"{os.getloadavg()[0]:.1f}",
            "callers": CLIENTS,
            "seconds": seconds,
            "kill every s": every,
        },
    )
    clean = asyncio.run(one_run(seconds, None))
    faulty = asyncio.run(one_run(seconds, every))
    rows = []
    errors = {}
    for name, r in (("fault-free", clean), ("faulty", faulty)):
        errors[name] = sum(n for k, n in r["outcomes"].items() if k != "answered")
        rows.append(
            (
                name,
                common.fmt_num(r["goodput"]),
                r["sent"],
                errors[name],
                r["lost"],
                r["killed"],
                r["restarts"],
                r["retried"],
                f"{r['mean_batch']:.1f}",
            )
        )
    print(
        common.table(
            [
                "run",
                "goodput rows/s",
                "sent",
                "errors",
                "lost",
                "killed",
                "restarts",
                "retried",
                "mean batch",
            ],
            rows,
        )
    )
    print()
    print(f"errors by type (faulty): {faulty['outcomes']}")
    figures = Figures()
    figures.add("fault_free_rows_per_s", clean["goodput"], "rows/s")
    figures.add("faulty_rows_per_s", faulty["goodput"], "rows/s")
    figures.at_least("faulty_over_fault_free", faulty["goodput"] / clean["goodput"], 0.8)
    figures.add("faulty_sent", faulty["sent"], "requests")
    figures.add("faulty_errors", errors["faulty"], "requests")
    figures.add("killed", faulty["killed"], "workers")
    figures.add("restarts", faulty["restarts"], "workers")
    figures.add("retried_batches", faulty["retried"], "batches")
    figures.add("fault_free_restarts", clean["restarts"], "workers")
    figures.check("none_lost", clean["lost"] == 0 and faulty["lost"] == 0)
    figures.check("books_agree", clean["books_agree"] and faulty["books_agree"])
    return figures


if __name__ == "__main__":
    raise SystemExit(run(measure, parser()))
