"""A GIL-releasing model over HTTP: carpool serve --runner process against --runner thread.

carpool serve demo --workers 2 (numpy MLP) twice side by side on the server CPU, each
driven by carpool bench (64 clients, binary tensors) from the client CPU, repeats
alternating. Goal: process/thread throughput >= 0.95x.
"""

from __future__ import annotations

import argparse
from typing import Any

from benchmarks.harness import Figures, common, run
from benchmarks.harness import processes as _process

CLIENTS = 64
RUNNERS = ("thread", "process")


def parser() -> argparse.ArgumentParser:
    p = common.base_parser(__doc__, default_cpus="0,1", default_repeats=3)
    p.add_argument("--duration", type=float, default=None, help="measured s per run (3)")
    p.add_argument("--workers", type=int, default=2, help="model workers per server (2)")
    return p


def measure(args: argparse.Namespace) -> Figures:
    """Each runner's medians (req/s, p50, p99, mean batch) and errors over the repeats, and
    process/thread throughput."""
    cores = _process.split_cpus(args.cpus)
    repeats = args.repeats or (1 if args.quick else 3)
    duration = args.duration or (1.0 if args.quick else 3.0)
    warmup = 0.5 if args.quick else 1.0
    common.header(
        "demo MLP over HTTP: process workers vs thread workers",
        {
            "cores": cores,
            "workers": args.workers,
            "clients": CLIENTS,
            "duration": duration,
            "repeats": repeats,
        },
    )
    servers = {
        runner: _process.carpool_serve(
            "demo",
            "--workers",
            str(args.workers),
            "--runner",
            runner,
            cpus=cores.server,
            name=runner,
        )
        for runner in RUNNERS
    }
    results: dict[str, list[dict[str, Any]]] = {runner: [] for runner in RUNNERS}
    try:
        _process.wait_all(servers.values())
        for repeat in range(repeats):
            for runner in RUNNERS:
                bench = _process.carpool_bench(
                    servers[runner],
                    "demo",
                    [CLIENTS],
                    warmup=warmup,
                    duration=duration,
                    cpus=cores.client,
                    flags=("--encoding", "binary"),
                )
                (row,) = bench.rows()
                results[runner].append(row)
                print(
                    f"  repeat {repeat + 1}/{repeats}  {runner:<7}  "
                    f"{row['throughput']:8,.0f} req/s  p50 {row['p50_ms']:6.2f} ms  "
                    f"p99 {row['p99_ms']:6.2f} ms  mean batch {row['mean_batch']:5.1f}  "
                    f"errors {row['errors']}"
                )
    finally:
        for server in servers.values():
            server.stop()
    return report(results)


def report(results: dict[str, list[dict[str, Any]]]) -> Figures:
    med = {
        runner: {
            key: common.median(r[key] for r in rows)
            for key in ("throughput", "p50_ms", "p99_ms", "mean_batch")
        }
        for runner, rows in results.items()
    }
    print()
    print(
        common.table(
            ["runner", "req/s", "p50 ms", "p99 ms", "mean batch", "errors"],
            [
                (
                    runner,
                    common.fmt_num(m["throughput"]),
                    f"{m['p50_ms']:.2f}",
                    f"{m['p99_ms']:.2f}",
                    f"{m['mean_batch']:.1f}",
                    sum(r["errors"] for r in results[runner]),
                )
                for runner, m in med.items()
            ],
        )
    )
    figures = Figures()
    for runner, m in med.items():
        figures.add(f"{runner}_req_per_s_{CLIENTS}", m["throughput"], "req/s")
        figures.add(f"{runner}_p50_ms_{CLIENTS}", m["p50_ms"], "ms")
        figures.add(f"{runner}_p99_ms_{CLIENTS}", m["p99_ms"], "ms")
        figures.add(f"{runner}_mean_batch_{CLIENTS}", m["mean_batch"], "rows")
        figures.add(f"{runner}_errors", int(sum(r["errors"] for r in results[runner])))
    ratio = med["process"]["throughput"] / med["thread"]["throughput"]
    figures.at_least(f"process_over_thread_{CLIENTS}", ratio, 0.95)
    return figures


if __name__ == "__main__":
    raise SystemExit(run(measure, parser()))
