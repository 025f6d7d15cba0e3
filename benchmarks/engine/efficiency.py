"""Served throughput under load vs the offline peak of the same model.

256 callers feed a ``Batcher`` (sleep and numpy MLP models); its rows/s over
``batch_inference``'s on full batches, interleaved, medians. Goal: served/offline >= 0.97
with one worker; answers checked. Method and results: docs/benchmarks/engine.md."""

from __future__ import annotations

import argparse
import asyncio
import gc
from typing import Any

import numpy as np

from benchmarks.harness import Figures, models, run
from benchmarks.harness import common as _bench
from carpool.bench.callers import closed_requests

CALLERS = 256
TARGET = 0.97  # served/offline with one worker (issue 10)


async def served_run(
    carpool: Any, model: Any, rows: list[np.ndarray], batch: int, workers: int
) -> dict[str, float]:
    """rows/s with CALLERS concurrent callers; returns rate + mean batch size of the timed part."""
    per = len(rows) // CALLERS
    outs: list[Any] = [None] * (per * CALLERS)

    async with carpool.Batcher(model, max_batch_size=batch, max_wait_ms=5.0, workers=workers) as b:

        async def warm(i: int) -> None:
            await b.infer(rows[i])

        async def keep(i: int) -> None:
            outs[i] = await b.infer(rows[i])

        # warm-up: a few rounds through the full path (threads started, caches hot)
        await closed_requests(warm, callers=CALLERS, requests=max(2, per // 8) * CALLERS)
        before = _bench.batch_stats(b.stats())
        gc.collect()
        _, dt = await closed_requests(keep, callers=CALLERS, requests=per * CALLERS)
        after = _bench.batch_stats(b.stats())

    done = after["rows"] - before["rows"]
    nb = after["batches"] - before["batches"]
    mean = done / nb if nb and nb == nb else after["mean_batch_size"]
    return {"rps": per * CALLERS / dt, "mean_batch": mean, "outs": outs}  # type: ignore[dict-item]


def offline_run(carpool: Any, model: Any, rows: list[np.ndarray], batch: int) -> dict[str, Any]:
    carpool.batch_inference(model, rows[: batch * 4], batch_size=batch)  # warm-up
    gc.collect()
    t0 = _bench.now()
    outs = carpool.batch_inference(model, rows, batch_size=batch)
    dt = _bench.now() - t0
    return {"rps": len(rows) / dt, "outs": outs}


def same(served: list[Any], offline: list[Any], what: str) -> bool:
    """Whether the served outputs (first, a third in, last) equal the offline ones; prints
    which differs."""
    for i in (0, len(offline) // 3, len(offline) - 1):
        if served[i] is None or not np.allclose(
            np.asarray(served[i]), np.asarray(offline[i]), rtol=1e-4, atol=1e-4
        ):
            print(f"  {what}: served output {i} DIFFERS from the offline output")
            return False
    return True


Config = tuple[str, int, int]  # (model, max_batch_size, workers); workers 0 = offline


def parser() -> argparse.ArgumentParser:
    p = _bench.base_parser(__doc__, default_cpus="0,1")
    p.add_argument("--batch-sizes", default="32,64", help="comma-separated max_batch_size values")
    p.add_argument("--models", default="sleep,mlp", help="comma-separated: sleep,mlp")
    p.add_argument(
        "--workers",
        default="1,2",
        help="comma-separated worker counts served (2 runs the sleep model only)",
    )
    return p


def measure(args: argparse.Namespace) -> Figures:

    cpus = _bench.parse_cpus(args.cpus)
    pinned = _bench.pin(cpus)
    carpool = _bench.import_carpool()
    repeats = args.repeats or (1 if args.quick else 5)
    batch_sizes = [32] if args.quick else [int(x) for x in args.batch_sizes.split(",")]
    n_rows = CALLERS * (4 if args.quick else 32)
    rows = models.make_rows(n_rows)
    model_fns = {"sleep": models.sleep_model, "mlp": models.MLP()}
    configs: list[Config] = []
    served_workers = [int(w) for w in args.workers.split(",")]
    for m in args.models.split(","):
        for bs in batch_sizes:
            configs.append((m, bs, 0))
            configs.extend((m, bs, w) for w in served_workers if w == 1 or m == "sleep")

    _bench.header(
        "carpool efficiency: served rows/s vs offline peak (batch_inference)",
        {
            "cpus": pinned,
            "blas": models.blas_info(),
            "callers": CALLERS,
            "rows": n_rows,
            "repeats": repeats,
            "carpool": getattr(carpool, "__version__", "?"),
        },
    )
    res, equal = run_all(carpool, model_fns, rows, configs, repeats)
    print()
    figures = report(res, configs)
    figures.check("answers_equal", equal)
    return figures


def run_all(
    carpool: Any,
    model_fns: dict[str, Any],
    rows: list[np.ndarray],
    configs: list[Config],
    repeats: int,
) -> tuple[dict[Config, list[dict[str, Any]]], bool]:
    """Every configuration once per repeat, in order, and whether each served run's outputs
    equal the offline run's just before it."""
    res: dict[Config, list[dict[str, Any]]] = {c: [] for c in configs}
    equal = True
    for r in range(repeats):
        for m, bs, w in configs:
            fn = model_fns[m]
            if w == 0:
                out = offline_run(carpool, fn, rows, bs)
            else:
                out = asyncio.run(served_run(carpool, fn, rows, bs, w))
                offline_outs = res[(m, bs, 0)][-1]["outs"]
                equal &= same(out["outs"], offline_outs, f"{m} b={bs} w={w}")
            res[(m, bs, w)].append(out)
            kind = "offline" if w == 0 else f"served w={w}"
            rps = out["rps"]
            print(f"  repeat {r + 1}/{repeats}  {m:5s} b={bs:<3d} {kind:11s} {rps:>10,.0f} rows/s")
        for lst in res.values():  # keep only the latest outputs (memory)
            for d in lst[:-1]:
                d.pop("outs", None)
    return res, equal


def report(res: dict[Config, list[dict[str, Any]]], configs: list[Config]) -> Figures:
    """Medians over repeats, served/offline (of the medians, and paired), the target."""
    figures = Figures()
    rows_out = []
    headline: list[float] = []
    for m, bs, w in configs:
        if w == 0:
            continue
        off = _bench.median(x["rps"] for x in res[(m, bs, 0)])
        srv = _bench.median(x["rps"] for x in res[(m, bs, w)])
        mb = _bench.median(x["mean_batch"] for x in res[(m, bs, w)])
        ratio = srv / off
        # ratio of each served run to the offline run just before it (same repeat): robust
        # to slow drifts in machine speed, which a ratio of medians is not
        paired = _bench.median(
            s["rps"] / o["rps"] for o, s in zip(res[(m, bs, 0)], res[(m, bs, w)], strict=True)
        )
        if w == 1:
            headline.append(ratio)
        name = f"{m}_{bs}_w{w}"
        if f"{m}_{bs}_offline_rows_per_s" not in figures:
            figures.add(f"{m}_{bs}_offline_rows_per_s", off, "rows/s")
        figures.add(f"{name}_served_rows_per_s", srv, "rows/s")
        if w == 1:
            figures.at_least(f"{name}_served_over_offline", ratio, TARGET)
        else:
            figures.add(f"{name}_served_over_offline", ratio, "x")
        figures.add(f"{name}_served_over_offline_paired", paired, "x")
        figures.add(f"{name}_mean_batch", mb, "rows")
        rows_out.append(
            [m, bs, w, _bench.fmt_num(off), _bench.fmt_num(srv), f"{ratio:.3f}", f"{paired:.3f}",
             _bench.fmt_num(mb, 1), _bench.verdict(ratio, TARGET) if w == 1 else "(info)"]
        )  # fmt: skip
    headers = ["model", "max_batch", "workers", "offline rows/s", "served rows/s",
               "served/offline", "paired", "mean batch", f"target>={TARGET}"]  # fmt: skip
    print(_bench.table(headers, rows_out))
    if headline:
        lo, mid = min(headline), _bench.median(headline)
        print(f"\n  workers=1 served/offline: min {lo:.3f}, median {mid:.3f}")
        figures.at_least("served_over_offline_min", lo, TARGET)
        figures.add("served_over_offline_median", mid, "x")
    return figures


if __name__ == "__main__":
    raise SystemExit(run(measure, parser()))
