"""Adaptive batching against fixed and eager under open-loop load: p99, throughput, goodput.

Seeded Poisson, saturation, 2x and bursty loads per model (sleep accelerator, numpy MLP);
the issue's targets are goals: p99 <= 1.1x the best fixed/eager, 2x goodput >= 0.9x
capacity, immediate rejections. Method and results: docs/benchmarks/engine.md."""

from __future__ import annotations

import argparse
import gc
import math
import os
import time
from typing import Any

import numpy as np

from benchmarks.engine import _open_loop as A
from benchmarks.harness import Figures, models, run
from benchmarks.harness import common as _bench
from carpool.bench.arrivals import bursty_offsets, poisson_offsets

POISSON = (0.1, 0.3, 0.5, 0.7, 0.9)
SATURATION, OVERLOAD = 1.1, 2.0
BURSTY = "bursty"  # 2x / 0.3x capacity, alternating every second
BURSTY_MEAN = (2.0 + 0.3) / 2
EXTREME_WAITS = (5, 50)
MIN_SAMPLES = 2000  # a Poisson window holds at least this many requests: ~20 past the p99
SIZES = (1, 2, 4, 8, 16, 32, 48, 64)
MLP_DIMS = (512, 2048, 2048, 2048, 512)  # benchmarks/harness/http_models.py's DIMS
Load = float | str


def load_name(load: Load) -> str:
    if load == BURSTY:
        return "bursty 2x/0.3x"
    if load == OVERLOAD:
        return "overload 2x"
    return f"{'sat ' if load == SATURATION else ''}{100 * float(load):.0f}%"


class Results:
    """Cells by (model, load, setting label); every figure is a median over repeats."""

    def __init__(self) -> None:
        self.cells: dict[tuple[str, Load, str], list[A.Cell]] = {}

    def add(self, model: str, load: Load, label: str, cell: A.Cell) -> None:
        self.cells.setdefault((model, load, label), []).append(cell)

    def get(self, model: str, load: Load, label: str, metric: str) -> float:
        """``metric``: "p50" / "p99" (ms), or a Cell attribute."""
        cells = self.cells.get((model, load, label), [])
        if metric in ("p50", "p99"):
            return _bench.median(c.pct(float(metric[1:])) for c in cells)
        return _bench.median(getattr(c, metric) for c in cells)

    def best(
        self, model: str, load: Load, metric: str, *, fixed_only: bool = False
    ) -> tuple[str, float]:
        """The best eager/fixed setting in hindsight: the lowest p99, else the highest."""
        values = {
            label: self.get(model, load, label, metric)
            for (m, ld, label) in self.cells
            if m == model
            and ld == load
            and (label.startswith("fixed") or (label == "eager" and not fixed_only))
        }
        values = {label: v for label, v in values.items() if v == v}
        if not values:
            return "n/a", math.nan
        label = (min if metric == "p99" else max)(values, key=values.__getitem__)
        return label, values[label]


def arrivals(
    load: Load, capacity: float, warm: float, window: float, min_samples: int, seed: int
) -> tuple[np.ndarray, float, float]:
    """Offsets, window start, window end."""
    if load == BURSTY:
        end = warm + window
        return bursty_offsets(2 * capacity, 0.3 * capacity, 1.0, end, seed=seed), warm, end
    rate = float(load) * capacity
    window = max(window, min_samples / rate)
    return poisson_offsets(rate, warm + window, seed=seed), warm, warm + window


def load_slug(load: Load) -> str:
    """``load`` in a figure's name: ``50pct``, ``sat_110pct``, ``overload_2x``, ``bursty``."""
    if load in (BURSTY, OVERLOAD):
        return "bursty" if load == BURSTY else "overload_2x"
    return f"{'sat_' if load == SATURATION else ''}{100 * float(load):.0f}pct"


def parser() -> argparse.ArgumentParser:
    p = _bench.base_parser(__doc__, default_cpus="0,1", default_repeats=1)
    p.add_argument("--models", default="sleep,mlp", help="comma-separated: sleep,mlp")
    p.add_argument("--window", type=float, help="measured seconds per Poisson cell (2)")
    p.add_argument("--warm", type=float, help="seconds of load before the window (1)")
    p.add_argument("--client", choices=("loop", "thread"), default="loop")
    p.add_argument("--plot", metavar="PNG", help="save p99 and goodput vs load here")
    p.add_argument("--seed", type=int, default=1)
    return p


def measure(args: argparse.Namespace) -> Figures:

    pinned = _bench.pin(_bench.parse_cpus(args.cpus))
    carpool = _bench.import_carpool()
    args.repeats = args.repeats or 1
    args.window = args.window or (0.4 if args.quick else 2.0)
    args.warm = args.warm or (0.3 if args.quick else 1.0)
    args.min_samples = 0 if args.quick else MIN_SAMPLES
    loads: list[Load] = [0.5, OVERLOAD] if args.quick else [*POISSON, SATURATION, OVERLOAD, BURSTY]
    setups: dict[str, tuple[Any, np.ndarray]] = {}
    for name in args.models.split(","):
        if name == "sleep":
            setups[name] = (A.accelerator, models.make_rows(1, dim=8)[0])
        elif name == "mlp":
            setups[name] = (models.MLP(MLP_DIMS), models.make_rows(1)[0])
        else:
            raise ValueError(f"unknown model {name!r}: use sleep, mlp")

    _bench.header(
        "carpool adaptive batching: p99, throughput and goodput vs offered load",
        {
            "cpus": pinned,
            "blas": models.blas_info(),
            "client": args.client,
            "cell": f"{args.warm:g} s + {args.window:g} s (>= {args.min_samples} requests)",
            "repeats": args.repeats,
            "objective": f"{A.SLO_MS:g} ms",
            "loadavg": f"{os.getloadavg()[0]:.2f}",
        },
    )
    capacity = {name: measure_capacity(name, *setup, args.quick) for name, setup in setups.items()}
    print()
    results = run_grid(args, carpool, setups, capacity, loads)
    figures = Figures()
    for name in setups:
        figures.add(f"{name}_capacity_rows_per_s", capacity[name], "rows/s")
        figures.update(report(results, name, capacity[name], loads), prefix=f"{name}_")
    if not args.quick:
        for name, (model, row) in setups.items():
            cold_start(carpool, name, model, row, capacity[name], args)
        print()
    if args.plot:
        draw(results, list(setups), loads, capacity, args.plot)
    return figures


def measure_capacity(name: str, model: Any, row: np.ndarray, quick: bool) -> float:
    """max over b of b / t(b), t(b) the median of offline calls (printed)."""
    curve = A.cost_curve(model, row, SIZES, 3 if quick else 15)
    best = max(SIZES, key=lambda b: b / curve[b])
    shown = ", ".join(f"{b}: {curve[b] * 1e3:.2f}" for b in SIZES)
    print(f"  [{name}] offline t(b) ms  {shown}")
    print(f"  [{name}] capacity {best / curve[best]:,.0f} rows/s (b={best})")
    return best / curve[best]


def run_grid(
    args: Any,
    carpool: Any,
    setups: dict[str, tuple[Any, np.ndarray]],
    capacity: dict[str, float],
    loads: list[Load],
) -> Results:
    """Every (repeat, model, load, setting) cell; at one load every setting sees the same
    arrivals, in an order that rotates per repeat."""
    everything = A.settings(A.WAITS_MS)
    if args.quick:
        everything = [s for s in everything if s.label in ("eager", "fixed 5", "adaptive")]
    extreme = [s for s in everything if s.kind != "fixed" or float(s.label[6:]) in EXTREME_WAITS]
    results = Results()
    started = time.perf_counter()
    for r in range(args.repeats):
        for name, (model, row) in setups.items():
            cap = capacity[name]
            for load in loads:
                pool = everything if load in POISSON or args.quick else extreme
                pool = pool[r % len(pool) :] + pool[: r % len(pool)]
                if load == BURSTY:
                    timing = (1.0, 0.8 if args.quick else 4.0, 0)
                else:
                    timing = (args.warm, args.window, args.min_samples)
                offsets, lo, hi = arrivals(load, cap, *timing, seed=args.seed + r)
                for setting in pool:
                    gc.collect()
                    gc.freeze()  # as `carpool serve` does: full collections skip the setup
                    rec, before, after = A.drive(
                        carpool, model, row, setting, offsets, lo, hi, args.client
                    )
                    cell = A.Cell.of(rec, before, after, lo, hi)
                    results.add(name, load, setting.label, cell)
                    print(
                        f"  {r + 1}/{args.repeats} {name:5s} {load_name(load):14s}"
                        f" {setting.label:10s}"
                        f" p50 {cell.pct(50):7.1f}  p99 {cell.pct(99):7.1f} ms"
                        f"  tput {cell.throughput / cap:4.2f}  good {cell.goodput / cap:4.2f} cap"
                        f"  rej {cell.rejected:5d}  batch {cell.mean_batch:4.1f}"
                        f"  lag p99 {cell.lag_p99_s * 1e3:4.1f} ms"
                    )
    took = time.perf_counter() - started
    print(f"\n  grid: {took:.0f} s; loadavg now {os.getloadavg()[0]:.2f}\n")
    return results


def report(results: Results, name: str, cap: float, loads: list[Load]) -> Figures:
    """The two tables of one model and its targets; their figures, unprefixed."""
    figures = Figures()
    ratios = latency_table(results, name, cap, loads, figures)
    throughput_table(results, name, cap, loads, figures)
    targets(results, name, cap, loads, ratios, figures)
    return figures


def latency_table(
    results: Results, name: str, cap: float, loads: list[Load], figures: Figures
) -> list[tuple[float, Load]]:
    """p99 per load: eager, the best fixed/eager, adaptive; adaptive's p99 ratio per load."""
    get = results.get
    rows, ratios = [], []
    for load in loads:
        label, best = results.best(name, load, "p99")
        ratio = get(name, load, "adaptive", "p99") / best
        ratios.append((ratio, load))
        slug = load_slug(load)
        figures.add(f"p99_ms_{slug}_adaptive", get(name, load, "adaptive", "p99"), "ms")
        figures.add(f"p99_ms_{slug}_best_fixed_eager", best, "ms")
        figures.add(f"p99_adaptive_over_best_{slug}", ratio, "x")
        offered = (BURSTY_MEAN if load == BURSTY else float(load)) * cap
        rows.append(
            [
                load_name(load),
                _bench.fmt_num(offered),
                _bench.fmt_num(get(name, load, "eager", "p99"), 1),
                f"{label} {best:,.1f}",
                _bench.fmt_num(get(name, load, "adaptive", "p99"), 1),
                _bench.fmt_num(ratio, 2),
                _bench.fmt_num(get(name, load, "adaptive/5", "p99"), 1),
                _bench.fmt_num(get(name, load, "adaptive", "p50"), 1),
            ]
        )
    print(f"[{name}] p99 of served requests, ms (capacity {cap:,.0f} rows/s)")
    headers = ["load", "offered/s", "eager", "best fixed/eager", "adaptive", "ratio"]
    print(_bench.table([*headers, "adaptive/5", "adaptive p50"], rows))
    return ratios


def throughput_table(
    results: Results, name: str, cap: float, loads: list[Load], figures: Figures
) -> None:
    """Throughput against the best, and goodput as a share of capacity, per load."""
    get = results.get
    rows = []
    for load in loads:
        tput_label, tput_best = results.best(name, load, "throughput")
        good_label, good_best = results.best(name, load, "goodput")
        slug = load_slug(load)
        adaptive_tput = get(name, load, "adaptive", "throughput")
        figures.add(f"throughput_adaptive_over_best_{slug}", adaptive_tput / tput_best, "x")
        adaptive_good = get(name, load, "adaptive", "goodput")
        figures.add(f"goodput_over_capacity_{slug}_adaptive", adaptive_good / cap, "x")
        rows.append(
            [
                load_name(load),
                f"{_bench.fmt_num(get(name, load, 'adaptive', 'throughput') / tput_best, 3)}"
                f" ({tput_label})",
                _bench.fmt_num(get(name, load, "eager", "goodput") / cap, 3),
                f"{_bench.fmt_num(good_best / cap, 3)} ({good_label})",
                _bench.fmt_num(get(name, load, "adaptive", "goodput") / cap, 3),
                _bench.fmt_num(get(name, load, "adaptive/5", "goodput") / cap, 3),
                _bench.fmt_num(get(name, load, "adaptive", "rejected")),
                _bench.fmt_num(get(name, load, "adaptive", "reject_p99_ms"), 3),
                _bench.fmt_num(get(name, load, "adaptive", "expired")),
            ]
        )
    print(f"\n[{name}] throughput, and goodput (answers within {A.SLO_MS:g} ms / s) / capacity")
    headers = ["load", "tput adaptive/best", "goodput eager", "best fixed/eager", "adaptive"]
    print(_bench.table([*headers, "adaptive/5", "rejected", "reject p99 ms", "expired"], rows))


def targets(
    results: Results,
    name: str,
    cap: float,
    loads: list[Load],
    ratios: list[tuple[float, Load]],
    figures: Figures,
) -> None:
    """A PASS/MISS line per target of the headline setting, each a goal in ``figures``."""
    get = results.get
    print(f"\n[{name}] targets (headline: adaptive, max_wait_ms=50)")
    worst, at = max(ratios, key=lambda x: x[0] if x[0] == x[0] else -1.0)
    _target(
        "p99 <= 1.1x best fixed/eager at every load",
        worst <= 1.1,
        f"worst {worst:.2f}x, at {load_name(at)}",
    )
    figures.at_most("worst_p99_adaptive_over_best", worst, 1.1)
    if SATURATION in loads:
        label, best = results.best(name, SATURATION, "throughput")
        ratio = get(name, SATURATION, "adaptive", "throughput") / best
        _target(
            "throughput at saturation (110%) >= 0.97x best", ratio >= 0.97, f"{ratio:.3f}x {label}"
        )
        figures.at_least("saturation_throughput_adaptive_over_best", ratio, 0.97)
    good = get(name, OVERLOAD, "adaptive", "goodput") / cap
    _target("2x overload: goodput >= 0.9x capacity", good >= 0.9, f"{good:.3f}x")
    figures.at_least("overload_goodput_over_capacity", good, 0.9)
    late = get(name, OVERLOAD, "adaptive", "reject_p99_ms")
    _target("2x overload: rejections immediate (p99 < 1 ms)", late < 1.0, f"{late:.3f} ms")
    figures.at_most("overload_reject_p99_ms", late, 1.0, "ms")
    label, other = results.best(name, OVERLOAD, "goodput")
    _target(
        "2x overload: eager and fixed goodput < 0.1x capacity",
        other / cap < 0.1,
        f"best {other / cap:.3f}x, {label}",
    )
    figures.at_most("overload_goodput_over_capacity_best_fixed_eager", other / cap, 0.1)
    print()


def _target(what: str, ok: bool, measured: str) -> None:
    print(f"  {'PASS' if ok else 'MISS'}  {what} ({measured})")


def cold_start(carpool: Any, name: str, model: Any, row: np.ndarray, cap: float, args: Any) -> None:
    """adaptive without ``warmup=`` at 2x from the first request: what the first ones meet."""
    options = {"policy": "adaptive", "latency_slo_ms": A.SLO_MS, "max_wait_ms": A.SLO_MS}
    setting = A.Setting("adaptive cold", "adaptive", {**options, "warmup": None})
    offsets = poisson_offsets(OVERLOAD * cap, 1.0, seed=args.seed)
    gc.collect()
    rec, _, after = A.drive(
        carpool, model, row, setting, offsets, 0.0, 1.0, args.client, warm_start=False
    )
    parts = []
    for lo, hi in ((0.0, 0.02), (0.02, 0.1), (0.1, 1.0)):
        sent = (rec.offsets >= lo) & (rec.offsets < hi)
        in_time = sent & (rec.code == A.SERVED) & (rec.done - rec.offsets <= A.SLO_MS / 1e3)
        refused = sent & (rec.code == A.OVERLOADED)
        parts.append(
            f"{lo * 1e3:.0f}-{hi * 1e3:.0f} ms: {in_time.sum()}/{sent.sum()} in time,"
            f" {refused.sum()} refused"
        )
    print(f"[{name}] cold start (no warmup=, 2x; sent at) " + "; ".join(parts))
    print(f"[{name}]   learned after 1 s: {after.cost_curve}")


def draw(
    results: Results, names: list[str], loads: list[Load], capacity: dict[str, float], path: str
) -> None:
    xs = [float(load) for load in loads if load != BURSTY]

    def series(model: str, which: str) -> tuple[list[float], list[float]]:
        p99, good = [], []
        for load in xs:
            if which == "best fixed":
                p99.append(results.best(model, load, "p99", fixed_only=True)[1])
                good.append(results.best(model, load, "goodput", fixed_only=True)[1])
            else:
                p99.append(results.get(model, load, which, "p99"))
                good.append(results.get(model, load, which, "goodput"))
        return p99, [g / capacity[model] for g in good]

    A.plot(path, names, xs, series)
    print(f"  plot: {path}")


if __name__ == "__main__":
    raise SystemExit(run(measure, parser()))
