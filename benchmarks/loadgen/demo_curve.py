"""The ``demo`` model's latency-throughput curve for max_wait_ms 0, 2, 5 and 10 (policy fixed),
measured with ``carpool bench`` at 1 to 256 closed-loop clients: one median report per window
(docs/bench/demo-wait-*.json), compared side by side and drawn by ``carpool bench --compare``
(docs/bench-demo-max-wait.png). It shows where a fixed window starts filling batches rather
than only adding latency (docs/benchmarks/loadgen.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.harness import Figures, common, run
from benchmarks.harness import processes as _process
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
        return float(common.median(list(values)))

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


def measure_all(
    args: Any, cores: _process.Cores, waits: tuple[int, ...]
) -> dict[int, list[Report]]:
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
                bench = _process.carpool_bench(
                    servers[w],
                    "demo",
                    args.concurrency,
                    warmup=args.warmup,
                    duration=args.duration,
                    cpus=cores.client,
                    flags=("--encoding", "binary", "--label", f"wait {w} ms"),
                )
                runs[w].append(bench.report)
                steps = "  ".join(
                    f"{s.load.value:g}: {s.throughput_rps:,.0f}" for s in bench.report.steps
                )
                print(f"  repeat {r + 1}/{args.repeats}  wait {w:2d} ms  req/s by clients  {steps}")
    finally:
        for server in servers.values():
            server.stop()
    return runs


def measure(args: argparse.Namespace) -> Figures:
    quick = args.quick
    args.concurrency = [
        int(c) for c in (args.concurrency or ("16" if quick else "1,4,16,64,256")).split(",")
    ]
    args.duration = args.duration or (0.5 if quick else 3.0)
    args.warmup = args.warmup if args.warmup is not None else (0.2 if quick else 1.0)
    args.repeats = args.repeats or (1 if quick else 3)
    docs = _process.REPO / "docs"
    with tempfile.TemporaryDirectory(prefix="carpool-demo-curve-") as scratch:
        out = Path(args.out) if args.out else (Path(scratch) if quick else docs / "bench")
        default_plot = out / "demo-max-wait.png" if quick else docs / "bench-demo-max-wait.png"
        plot = args.plot or str(default_plot)
        out.mkdir(parents=True, exist_ok=True)
        return curve(args, out, plot, QUICK_WAITS if quick else WAITS)


def curve(args: argparse.Namespace, out: Path, plot: str, waits: tuple[int, ...]) -> Figures:
    """Measure, write one median report per window in ``out``, compare them and draw
    ``plot``; the figures: each window's req/s, p99 and mean batch at each client count."""
    cores = _process.split_cpus(args.cpus)
    _process.pin_self(cores.client)  # the orchestrator mostly waits: keep it off the servers'
    common.header(
        "demo model: latency against throughput by max_wait_ms (policy fixed), carpool bench",
        {"cpus": str(cores), "repeats": args.repeats, "clients": args.concurrency,
         "step": f"{args.warmup:g} s warm-up + {args.duration:g} s"},
    )  # fmt: skip
    runs = measure_all(args, cores, waits)
    figures = Figures()
    reports = []
    for w in waits:
        path = out / f"demo-wait-{w}ms.json"
        report = median_report(runs[w])
        report.save(path)
        reports.append(str(path))
        for step in report.steps:
            c = int(step.load.value)
            p99 = step.latency.p99 if step.latency else float("nan")
            batch = step.server.batch_size_mean if step.server else float("nan")
            figures.add(f"req_per_s_wait_{w}ms_{c}", float(step.throughput_rps), "req/s")
            figures.add(f"p99_ms_wait_{w}ms_{c}", float(p99), "ms")
            figures.add(f"mean_batch_wait_{w}ms_{c}", float(batch), "rows")
    print()
    compare = [sys.executable, "-m", "carpool", "bench", "--compare", *reports, "--plot", plot]
    subprocess.run(compare, cwd=_process.REPO, env=_process.child_env(COLUMNS="200"), check=True)
    return figures


def parser() -> argparse.ArgumentParser:
    p = common.base_parser(__doc__, default_cpus="0,1", default_repeats=3)
    p.add_argument("--out", default=None, help="report folder (default docs/bench)")
    p.add_argument("--plot", default=None, help="PNG (default docs/bench-demo-max-wait.png)")
    p.add_argument("--concurrency", default=None, help="client counts (default 1,4,16,64,256)")
    p.add_argument("--duration", type=float, default=None, help="measured s per step (3)")
    p.add_argument("--warmup", type=float, default=None, help="warm-up s per step (1)")
    return p


if __name__ == "__main__":
    raise SystemExit(run(measure, parser()))
