"""The ``demo`` model's latency-throughput curve for max_wait_ms 0, 2, 5 and 10, measured
with ``carpool bench`` itself.

What: for each window W, ``carpool serve demo --policy fixed --max-wait-ms W``; all four
servers pinned to one core (default CPU 0, started once, idle while another is loaded),
each loaded by ``carpool bench --encoding binary --json`` pinned to the other core (CPU 1),
closed loop at 1, 4, 16, 64 and 256 clients. Every repeat runs the four servers one after
another, in an order that rotates per repeat; each window's report (one file per W, the
medians over repeats of each step's req/s, latency percentiles and mean batch) is written
as JSON, then ``carpool bench --compare`` prints them side by side (req/s and p99 ratios
against max_wait_ms=0) and draws them on one plot.

Why: in a closed loop with fewer callers than max_batch_size a fixed window only adds
latency; with more, it fills batches. The curve shows where the crossover lies.

    python benchmarks/bench_demo_curve.py                      # ~5 min; docs/bench/*
    python benchmarks/bench_demo_curve.py --quick              # smoke: waits 0, 5; temp folder
    python benchmarks/bench_demo_curve.py --cpus none          # no pinning
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import _bench
import _process

from carpool.bench.report.data import Latency, Report, Step

WAITS = (0, 2, 5, 10)
QUICK_WAITS = (0, 5)  # --quick: a smoke test of the code paths


def median_report(reports: list[Report]) -> Report:
    """One report whose steps hold the medians over ``reports`` (runs of the same steps) of
    req/s, each latency figure and the mean batch; counts are summed."""
    first = reports[0]
    if len(reports) == 1:
        return first
    steps = [_median_step([r.steps[i] for r in reports]) for i in range(len(first.steps))]
    settings = {**first.settings, "repeats": len(reports)}
    return dataclasses.replace(first, steps=steps, settings=settings)


def _median_step(steps: list[Step]) -> Step:
    def med(values: Any) -> float:
        return float(_bench.median(list(values)))

    latencies = [s.latency for s in steps if s.latency is not None]
    latency = None
    if latencies:
        latency = Latency(
            count=sum(lat.count for lat in latencies),
            **{
                f: med(getattr(lat, f) for lat in latencies)
                for f in ("mean", "p50", "p90", "p99", "max")
            },
        )
    server = steps[0].server
    if server is not None and all(s.server is not None for s in steps):
        mean_batch = med(s.server.batch_size_mean for s in steps if s.server is not None)
        server = dataclasses.replace(server, batch_size_mean=mean_batch)
    return dataclasses.replace(
        steps[0],
        requests=sum(s.requests for s in steps),
        ok=sum(s.ok for s in steps),
        throughput_rps=med(s.throughput_rps for s in steps),
        latency=latency,
        server=server,
    )


def measure(args: Any, cores: _process.Cores, waits: tuple[int, ...]) -> dict[int, list[Report]]:
    servers = {
        w: _process.carpool_serve(
            "demo", "--policy", "fixed", "--max-wait-ms", str(w), cpus=cores.server
        )
        for w in waits
    }
    runs: dict[int, list[Report]] = {w: [] for w in waits}
    try:
        _process.wait_all(servers.values())
        for r in range(args.repeats):
            for w in waits[r % len(waits) :] + waits[: r % len(waits)]:
                run = _process.carpool_bench(
                    servers[w],
                    "demo",
                    args.concurrency,
                    warmup=args.warmup,
                    duration=args.duration,
                    cpus=cores.client,
                    flags=("--encoding", "binary", "--label", f"wait {w} ms"),
                )
                runs[w].append(run.report)
                steps = "  ".join(
                    f"{s.load.value:g}: {s.throughput_rps:,.0f}" for s in run.report.steps
                )
                print(f"  repeat {r + 1}/{args.repeats}  wait {w:2d} ms  req/s by clients  {steps}")
    finally:
        for server in servers.values():
            server.stop()
    return runs


def main() -> int:
    parser = _bench.base_parser(__doc__, default_cpus="0,1", default_repeats=3)
    parser.add_argument("--out", default=None, help="report folder (default docs/bench)")
    parser.add_argument("--plot", default=None, help="PNG (default docs/bench-demo-max-wait.png)")
    parser.add_argument("--concurrency", default=None, help="client counts (default 1,4,16,64,256)")
    parser.add_argument("--duration", type=float, default=None, help="measured s per step (3)")
    parser.add_argument("--warmup", type=float, default=None, help="warm-up s per step (1)")
    args = parser.parse_args()
    quick = args.quick
    args.concurrency = [
        int(c) for c in (args.concurrency or ("16" if quick else "1,4,16,64,256")).split(",")
    ]
    args.duration = args.duration or (0.5 if quick else 3.0)
    args.warmup = args.warmup if args.warmup is not None else (0.2 if quick else 1.0)
    args.repeats = args.repeats or (1 if quick else 3)
    scratch = tempfile.TemporaryDirectory(prefix="carpool-demo-curve-") if quick else None
    default_out = Path(scratch.name) if scratch else _process.REPO / "docs" / "bench"
    out = Path(args.out) if args.out else default_out
    plot = args.plot or str(
        out / "demo-max-wait.png" if scratch else _process.REPO / "docs" / "bench-demo-max-wait.png"
    )
    out.mkdir(parents=True, exist_ok=True)

    cores = _process.split_cpus(args.cpus)
    _process.pin_self(cores.client)  # the orchestrator mostly waits: keep it off the servers'
    _bench.header(
        "demo model: latency against throughput by max_wait_ms (policy fixed), carpool bench",
        {"cpus": str(cores), "repeats": args.repeats, "clients": args.concurrency,
         "step": f"{args.warmup:g} s warm-up + {args.duration:g} s"},
    )  # fmt: skip
    try:
        waits = QUICK_WAITS if quick else WAITS
        runs = measure(args, cores, waits)
        reports = []
        for w in waits:
            path = out / f"demo-wait-{w}ms.json"
            median_report(runs[w]).save(path)
            reports.append(str(path))
        print()
        compare = [sys.executable, "-m", "carpool", "bench", "--compare", *reports, "--plot", plot]
        subprocess.run(
            compare, cwd=_process.REPO, env=_process.child_env(COLUMNS="200"), check=True
        )
    except (Exception, KeyboardInterrupt) as exc:  # report, never fail the caller
        print(f"\nbench_demo_curve: {type(exc).__name__}: {exc}", flush=True)
    finally:
        if scratch is not None:
            scratch.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
