"""Staging and re-forming vs forming a batch only when a worker is free (issue 32, item 6).

The same ``Batcher`` staged, free-only and staged without re-forming: (a) an urgent
request's wait behind 64 low-priority callers, (b) served/offline, (c) 64 clients' rows/s
and latency. Answers checked. Method and results: docs/benchmarks/engine.md."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from benchmarks.engine import efficiency
from benchmarks.harness import Figures, models, run
from benchmarks.harness import common as _bench
from carpool.bench.report.data import percentile
from carpool.engine import scheduler
from carpool.policies import base as policy_base

BATCH = 32
CLIENTS = 64
VARIANTS = ("staged", "free only")
NO_REFORM = "staged, no re-forming"  # (a) only: what re-forming itself buys
URGENT_GAP_S = 0.010  # mean gap between urgent requests
GIL_FIXED, GIL_PER_ROW = 60_000, 1_500  # Python loop iterations: about 2 ms + 50 us a row


def gil_model(batch: Any) -> Any:
    """A model that holds the GIL: a pure-Python loop, about as long as ``sleep_model``."""
    x = 0
    for i in range(GIL_FIXED + GIL_PER_ROW * len(batch)):
        x += i
    return batch


@contextlib.contextmanager
def variant(name: str) -> Iterator[None]:
    """The engine as ``name`` has it: staging (and so re-forming) on, or off."""
    saved = policy_base._STAGED_PER_WORKER, scheduler._REFORM
    policy_base._STAGED_PER_WORKER = 0 if name == "free only" else 1
    scheduler._REFORM = name != NO_REFORM
    try:
        yield
    finally:
        policy_base._STAGED_PER_WORKER, scheduler._REFORM = saved


class Marked:
    """``model`` that notes, for each urgent row (first value < 0, second its number), how
    many rows had begun a model call before its own batch did."""

    def __init__(self, model: Callable[[Any], Any]) -> None:
        self.model = model
        self.started = 0  # rows whose model call has begun
        self.before: dict[int, int] = {}

    def __call__(self, batch: np.ndarray) -> Any:
        for i in np.flatnonzero(batch[:, 0] < 0):
            self.before[int(batch[i, 1])] = self.started
        self.started += len(batch)
        return self.model(batch)


async def priority_run(carpool: Any, seconds: float) -> dict[str, float]:
    """(a): the urgent requests' waits and the low-priority rows that ran before them."""
    model = Marked(models.sleep_model)
    rows = models.make_rows(CLIENTS * 4)
    waits: list[float] = []
    ahead: list[int] = []
    rng = random.Random(7)
    async with carpool.Batcher(model, max_batch_size=BATCH, max_wait_ms=5.0) as b:
        stop = False

        async def caller(i: int) -> None:
            k = i
            while not stop:
                await b.infer(rows[k % len(rows)], priority=1)
                k += CLIENTS

        async def urgent() -> None:
            await asyncio.sleep(0.3)  # warm-up: the stream is running
            n = 0
            t_end = _bench.now() + seconds
            while _bench.now() < t_end:
                await asyncio.sleep(rng.uniform(0, 2 * URGENT_GAP_S))
                row = np.zeros(models.IN_DIM, np.float32)
                row[0], row[1] = -1.0, n
                at_arrival = model.started
                t0 = _bench.now()
                await b.infer(row, priority=0)
                waits.append(_bench.now() - t0)
                ahead.append(model.before[n] - at_arrival)
                n += 1

        callers = [asyncio.ensure_future(caller(i)) for i in range(CLIENTS)]
        await urgent()
        stop = True
        await asyncio.gather(*callers)
    return {
        "p50": percentile(waits, 50) * 1e3,
        "p99": percentile(waits, 99) * 1e3,
        "ahead_mean": float(np.mean(ahead)),
        "ahead_max": float(max(ahead)),
        "overtaken": 100.0 * sum(1 for n in ahead if n) / len(ahead),
        "urgent": float(len(waits)),
    }


async def clients_run(carpool: Any, model: Any, seconds: float) -> dict[str, float]:
    """(c): CLIENTS closed-loop callers; rows/s and latency of the requests sent in the
    window (after a warm-up of 0.3 s)."""
    rows = models.make_rows(CLIENTS * 4)
    latencies: list[float] = []
    async with carpool.Batcher(model, max_batch_size=BATCH, max_wait_ms=5.0) as b:
        opened = _bench.now() + 0.3
        closes = opened + seconds

        async def caller(i: int) -> None:
            k = i
            while (t0 := _bench.now()) < closes:
                await b.infer(rows[k % len(rows)])
                if t0 >= opened:
                    latencies.append(_bench.now() - t0)
                k += CLIENTS

        gc.collect()
        await asyncio.gather(*(caller(i) for i in range(CLIENTS)))
    return {
        "rps": len(latencies) / seconds,
        "p50": percentile(latencies, 50) * 1e3,
        "p99": percentile(latencies, 99) * 1e3,
    }


Results = dict[tuple[str, str, str], list[dict[str, Any]]]  # (measure, model, variant)


def run_all(carpool: Any, repeats: int, quick: bool) -> tuple[Results, bool]:
    """Every measure, model and variant once per repeat, and whether every served run's
    outputs equal the offline run's."""
    seconds = 0.5 if quick else 2.0
    n_rows = 256 * (4 if quick else 32)
    rows = models.make_rows(n_rows)
    fns = {"sleep": models.sleep_model, "mlp": models.MLP(), "gil": gil_model}
    res: Results = {}
    equal = True

    def put(key: tuple[str, str, str], out: dict[str, Any], line: str) -> None:
        res.setdefault(key, []).append(out)
        print(f"  repeat {r + 1}/{repeats}  {key[0]:9s} {key[1]:5s} {key[2]:21s} {line}")

    for r in range(repeats):
        order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]  # neither always goes first
        for v in (*order, NO_REFORM):
            with variant(v):
                out = asyncio.run(priority_run(carpool, seconds))
            put(("priority", "sleep", v), out, f"urgent p99 {out['p99']:.2f} ms")
        for m, fn in fns.items():
            off = efficiency.offline_run(carpool, fn, rows, BATCH)
            put(("offline", m, "-"), off, f"{off['rps']:>10,.0f} rows/s")
            for v in order:
                with variant(v):
                    out = asyncio.run(efficiency.served_run(carpool, fn, rows, BATCH, 1))
                equal &= efficiency.same(out["outs"], off["outs"], f"{m} {v}")
                put(("served", m, v), out, f"{out['rps']:>10,.0f} rows/s")
            for lst in res.values():  # keep no outputs (memory)
                for d in lst:
                    d.pop("outs", None)
        for m, fn in fns.items():
            for v in order:
                with variant(v):
                    out = asyncio.run(clients_run(carpool, fn, seconds))
                put(("clients", m, v), out, f"{out['rps']:>10,.0f} rows/s p99 {out['p99']:.2f}")
    return res, equal


def med(res: Results, key: tuple[str, str, str], field: str) -> float:
    return _bench.median(x[field] for x in res[key])


SLUGS = {"staged": "staged", "free only": "free_only", NO_REFORM: "no_reform"}  # figure names


def report(res: Results) -> Figures:
    """The three tables, and their numbers as figures."""
    figures = Figures()
    s, f = VARIANTS
    print("\n(a) priority: an urgent request's wait behind 64 low-priority callers (sleep)")
    rows = []
    for v in (*VARIANTS, NO_REFORM):
        key = ("priority", "sleep", v)
        slug = SLUGS[v]
        figures.add(f"urgent_wait_p50_ms_{slug}", med(res, key, "p50"), "ms")
        figures.add(f"urgent_wait_p99_ms_{slug}", med(res, key, "p99"), "ms")
        figures.add(f"low_rows_ahead_mean_{slug}", med(res, key, "ahead_mean"), "rows")
        figures.add(f"low_rows_ahead_max_{slug}", med(res, key, "ahead_max"), "rows")
        figures.add(f"urgent_overtaken_pct_{slug}", med(res, key, "overtaken"), "%")
        rows.append(
            [v, f"{med(res, key, 'p50'):.2f}", f"{med(res, key, 'p99'):.2f}",
             f"{med(res, key, 'ahead_mean'):.2f}", f"{med(res, key, 'ahead_max'):.0f}",
             f"{med(res, key, 'overtaken'):.1f}", f"{med(res, key, 'urgent'):.0f}"]
        )  # fmt: skip
    heads = ["engine", "wait p50 ms", "wait p99 ms", "low rows ahead", "max", "% with any",
             "requests"]  # fmt: skip
    print(_bench.table(heads, rows))
    p99 = [med(res, ("priority", "sleep", v), "p99") for v in VARIANTS]
    print(f"  urgent wait p99, {s} / {f}: {p99[0] / p99[1]:.3f}")
    figures.add("urgent_wait_p99_staged_over_free_only", p99[0] / p99[1], "x")

    print("\n(b) served/offline (P1b), 256 callers, one worker")
    rows = []
    for m in ("sleep", "mlp", "gil"):
        off = med(res, ("offline", m, "-"), "rps")
        srv = [med(res, ("served", m, v), "rps") for v in VARIANTS]
        paired = _bench.median(
            a["rps"] / b["rps"]
            for a, b in zip(res[("served", m, s)], res[("served", m, f)], strict=True)
        )
        figures.add(f"{m}_offline_rows_per_s", off, "rows/s")
        figures.add(f"{m}_staged_over_offline", srv[0] / off, "x")
        figures.add(f"{m}_free_only_over_offline", srv[1] / off, "x")
        figures.add(f"{m}_staged_over_free_only_paired", paired, "x")
        rows.append(
            [m, _bench.fmt_num(off), _bench.fmt_num(srv[0]), _bench.fmt_num(srv[1]),
             f"{srv[0] / off:.3f}", f"{srv[1] / off:.3f}", f"{paired:.3f}"]
        )  # fmt: skip
    heads = ["model", "offline rows/s", f"{s} rows/s", f"{f} rows/s",
             f"{s}/offline", f"{f}/offline", f"{s}/{f} (paired)"]  # fmt: skip
    print(_bench.table(heads, rows))

    print(f"\n(c) {CLIENTS} clients, closed loop")
    rows = []
    for m in ("sleep", "mlp", "gil"):
        rps = [med(res, ("clients", m, v), "rps") for v in VARIANTS]
        p99 = [med(res, ("clients", m, v), "p99") for v in VARIANTS]
        p50 = [med(res, ("clients", m, v), "p50") for v in VARIANTS]
        for v, rps_v, p50_v, p99_v in zip(VARIANTS, rps, p50, p99, strict=True):
            slug = SLUGS[v]
            figures.add(f"{m}_{CLIENTS}_clients_rows_per_s_{slug}", rps_v, "rows/s")
            figures.add(f"{m}_{CLIENTS}_clients_p50_ms_{slug}", p50_v, "ms")
            figures.add(f"{m}_{CLIENTS}_clients_p99_ms_{slug}", p99_v, "ms")
        figures.add(f"{m}_{CLIENTS}_clients_staged_over_free_only", rps[0] / rps[1], "x")
        figures.add(f"{m}_{CLIENTS}_clients_p99_staged_over_free_only", p99[0] / p99[1], "x")
        rows.append(
            [m, _bench.fmt_num(rps[0]), _bench.fmt_num(rps[1]), f"{rps[0] / rps[1]:.3f}",
             f"{p50[0]:.2f}", f"{p50[1]:.2f}", f"{p99[0]:.2f}", f"{p99[1]:.2f}",
             f"{p99[0] / p99[1]:.3f}"]
        )  # fmt: skip
    heads = ["model", f"{s} rows/s", f"{f} rows/s", "ratio", f"{s} p50 ms", f"{f} p50 ms",
             f"{s} p99 ms", f"{f} p99 ms", "p99 ratio"]  # fmt: skip
    print(_bench.table(heads, rows))
    print(f"\n  ratios are {s} / {f}: above 1 in rows/s, below 1 in latency favour staging")
    return figures


def parser() -> argparse.ArgumentParser:
    return _bench.base_parser(__doc__, default_cpus="0,1", default_repeats=3)


def measure(args: argparse.Namespace) -> Figures:
    pinned = _bench.pin(_bench.parse_cpus(args.cpus))
    carpool = _bench.import_carpool()
    repeats = args.repeats or (1 if args.quick else 3)
    _bench.header(
        "carpool staging + re-forming vs a batch formed only when a worker is free",
        {
            "cpus": pinned,
            "blas": models.blas_info(),
            "max_batch": BATCH,
            "repeats": repeats,
            "carpool": getattr(carpool, "__version__", "?"),
        },
    )
    res, equal = run_all(carpool, repeats, args.quick)
    figures = report(res)
    figures.check("answers_equal", equal)
    return figures


if __name__ == "__main__":
    raise SystemExit(run(measure, parser()))
