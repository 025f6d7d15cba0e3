"""Latency at low load: one caller at a time.

What: a single caller awaits requests one after another (never more than one
in flight), so a batcher can never form a batch bigger than 1.  We measure
the per-request latency of

  * ``model``  -- the model called directly on a prepared 1-row batch (no
                  batcher): the floor,
  * ``eager``  -- ``await b.infer(row)`` with ``policy="eager"`` (default),
  * ``submit`` -- ``b.submit(row).result()`` from a plain thread with the
                  ``with Batcher(...)`` (background loop) front end, eager,
  * ``fixed``  -- ``await b.infer(row)`` with ``policy="fixed"``,
                  ``max_wait_ms=5`` (waits for a full batch or the timeout,
                  so ~5 ms extra is expected: shown for contrast),

for two models (``models.py``): ``sleep`` (``time.sleep(0.002 + 0.00005)``,
about 2 ms, GIL released) and ``mlp`` (the numpy float32 MLP on one row, one
BLAS thread).  Variants are interleaved within each repeat; each repeat
records the median of its samples and the table shows the median over repeats
(default 5) plus the p90 over all samples.

Why: a work-conserving ("eager") batcher must not make a lightly loaded
service slower.  Target: eager median <= model median + 0.5 ms.

Pinning: default CPU 0 for the whole process (callers, carpool's loop and
the worker thread share one core; thread hand-offs on one core are the
common cheap case).  ``--cpus 0,1`` lets them spread.  Nothing is asserted;
exits 0.

    taskset -c 0 benchmarks/.venv/bin/python benchmarks/low_load.py
    benchmarks/.venv/bin/python benchmarks/low_load.py --quick
"""

from __future__ import annotations

import asyncio
import gc
import sys
from typing import Any

import _bench  # before numpy: sets single-thread BLAS env vars
import models
import numpy as np

_bench.import_carpool()

from carpool.bench.callers import closed_requests  # noqa: E402
from carpool.bench.report import percentile  # noqa: E402

MAX_BATCH = 32


def time_direct(model: Any, row: np.ndarray, n: int) -> list[float]:
    batch = np.stack([row])
    model(batch)
    out = []
    for _ in range(n):
        t0 = _bench.now()
        model(batch)
        out.append(_bench.now() - t0)
    return out


async def time_infer(
    carpool: Any, model: Any, row: np.ndarray, n: int, warm: int, **kw: Any
) -> list[float]:
    """Latencies of ``n`` requests from one caller, each sent when the last is answered."""
    async with carpool.Batcher(model, max_batch_size=MAX_BATCH, **kw) as b:

        async def send(i: int) -> None:
            await b.infer(row)

        await closed_requests(send, callers=1, requests=warm)
        tally, _ = await closed_requests(send, callers=1, requests=n)
    return tally.latencies


def time_submit(
    carpool: Any, model: Any, row: np.ndarray, n: int, warm: int, **kw: Any
) -> list[float]:
    out = []
    with carpool.Batcher(model, max_batch_size=MAX_BATCH, **kw) as b:
        for _ in range(warm):
            b.submit(row).result()
        for _ in range(n):
            t0 = _bench.now()
            b.submit(row).result()
            out.append(_bench.now() - t0)
    return out


def main() -> int:
    p = _bench.base_parser(__doc__, default_cpus="0")
    p.add_argument("--models", default="sleep,mlp")
    args = p.parse_args()

    cpus = _bench.parse_cpus(args.cpus)
    pinned = _bench.pin(cpus)
    carpool = _bench.import_carpool()
    repeats = args.repeats or (1 if args.quick else 5)
    n = 40 if args.quick else 300
    n_fixed = 20 if args.quick else 100
    warm = 5 if args.quick else 30
    row = models.make_rows(1)[0]
    model_fns = {"sleep": models.sleep_model, "mlp": models.MLP()}
    variants = ["model", "eager", "submit", "fixed"]
    names = args.models.split(",")

    _bench.header(
        "carpool low-load latency: one caller, sequential requests",
        {
            "cpus": pinned,
            "blas": models.blas_info(),
            "samples": f"{n} ({n_fixed} for fixed) x {repeats} repeats",
            "max_batch_size": MAX_BATCH,
        },
    )

    med: dict[tuple[str, str], list[float]] = {(m, v): [] for m in names for v in variants}
    allv: dict[tuple[str, str], list[float]] = {(m, v): [] for m in names for v in variants}
    for r in range(repeats):
        for m in names:
            fn = model_fns[m]
            for v in variants:
                gc.collect()
                if v == "model":
                    xs = time_direct(fn, row, n)
                elif v == "eager":
                    xs = asyncio.run(time_infer(carpool, fn, row, n, warm, policy="eager"))
                elif v == "submit":
                    xs = time_submit(carpool, fn, row, n, warm, policy="eager")
                else:
                    xs = asyncio.run(
                        time_infer(carpool, fn, row, n_fixed, 3, policy="fixed", max_wait_ms=5.0)
                    )
                med[(m, v)].append(_bench.median(xs))
                allv[(m, v)].extend(xs)
                ms = _bench.median(xs) * 1e3
                print(f"  repeat {r + 1}/{repeats}  {m:5s} {v:6s} median {ms:8.3f} ms", flush=True)
    print()
    report(names, variants, med, allv)
    return 0


def report(
    names: list[str],
    variants: list[str],
    med: dict[tuple[str, str], list[float]],
    allv: dict[tuple[str, str], list[float]],
) -> None:
    """The table (medians over repeats, p90 over all samples) and the eager target."""
    rows = []
    summary = []
    for m in names:
        base = _bench.median(med[(m, "model")])
        for v in variants:
            mm = _bench.median(med[(m, v)])
            p90 = percentile(allv[(m, v)], 90)
            over = (mm - base) * 1e3
            rows.append(
                [
                    m,
                    v,
                    f"{mm * 1e3:.3f}",
                    f"{p90 * 1e3:.3f}",
                    "" if v == "model" else f"{over:+.3f}",
                ]
            )
        eager = _bench.median(med[(m, "eager")])
        eager_over = (eager - base) * 1e3
        ok = _bench.verdict(eager_over, 0.5, higher_is_better=False)
        summary.append(
            f"  {m}: model {base * 1e3:.3f} ms, eager {eager * 1e3:.3f} ms, "
            f"eager overhead {eager_over:+.3f} ms (target <= +0.5 ms: {ok})"
        )
    print(_bench.table(["model", "variant", "median ms", "p90 ms", "vs model ms"], rows))
    print()
    print("\n".join(summary))


if __name__ == "__main__":
    sys.exit(main())
