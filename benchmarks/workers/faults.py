"""Goodput while process workers are killed: kill -9 one of 2 workers every 5 s for 60 s.

What: ``carpool.Batcher(model, runner="process", workers=2, max_batch_size=32)`` serving a
GIL-releasing model (it sleeps 10 ms a batch, as a small GPU model would take), under 64
closed-loop callers on the event loop. Two runs of the same length, in this order:

``fault-free``  nothing happens
``faulty``      every 5 s one of the two worker processes gets SIGKILL (it is restarted
                with backoff; a batch it was running runs again on the other worker)

Every request is accounted for: each caller's ``infer`` returns a result or raises, and the
run fails unless answered + errors == sent, and the batcher's own books agree (nothing
pending). Goal: goodput (answered rows/s) faulty / fault-free >= 0.8, 0 lost requests.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections import Counter
from typing import Any

import _bench  # before numpy: sets single-thread BLAS env vars
import _process
import numpy as np

_bench.import_carpool()

import carpool  # noqa: E402
from carpool.bench.callers import closed_window  # noqa: E402

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


async def run(seconds: float, kill_every: float | None) -> dict[str, Any]:
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
    lost = sent[0] - sum(outcomes.values())
    assert lost == 0, f"{lost} requests got no answer"
    assert stats.pending == 0, stats
    assert stats.submitted == sent[0], stats
    return {
        "goodput": outcomes["answered"] / wall,
        "outcomes": dict(outcomes),
        "sent": sent[0],
        "killed": len(killed),
        "restarts": stats.worker_restarts,
        "retried": stats.retried_batches,
        "mean_batch": stats.mean_batch_size,
    }


def main() -> None:
    p = _bench.base_parser(__doc__, default_cpus="none", default_repeats=1)
    args = p.parse_args()
    seconds = 5.0 if args.quick else 60.0
    every = 2.0 if args.quick else KILL_EVERY_S
    pinned = _bench.pin(_bench.parse_cpus(args.cpus))
    _bench.header(
        "process workers under kill -9: goodput against a fault-free run",
        {
            "cpus": pinned,
            "load": f"{os.getloadavg()[0]:.1f}",
            "callers": CLIENTS,
            "seconds": seconds,
            "kill every s": every,
        },
    )
    clean = asyncio.run(run(seconds, None))
    faulty = asyncio.run(run(seconds, every))
    rows = []
    for name, r in (("fault-free", clean), ("faulty", faulty)):
        errors = sum(n for k, n in r["outcomes"].items() if k != "answered")
        rows.append(
            (
                name,
                _bench.fmt_num(r["goodput"]),
                r["sent"],
                errors,
                0,
                r["killed"],
                r["restarts"],
                r["retried"],
                f"{r['mean_batch']:.1f}",
            )
        )
    print(
        _bench.table(
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
    ratio = faulty["goodput"] / clean["goodput"]
    print()
    print(f"errors by type (faulty): {faulty['outcomes']}")
    print(f"goodput faulty/fault-free = {ratio:.2f} (goal >= 0.8: {_bench.verdict(ratio, 0.8)})")
    print("lost requests: 0 (every request answered or refused with a typed error)")


if __name__ == "__main__":
    main()
