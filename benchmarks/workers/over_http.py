"""A GIL-releasing model over HTTP: ``--runner process`` against ``--runner thread``.

What: ``carpool serve demo --workers 2`` (the numpy MLP, which releases the GIL in BLAS) as
two servers side by side, one running the model in its 2 worker threads, the other in 2
worker processes (``--runner process``: every batch crosses to a process through shared
memory and back). ``carpool bench`` drives each with 64 closed-loop clients and binary
tensors; the servers share the server CPU, the client runs on the other; each repeat runs
both, alternating, and the medians are compared.

Goal: process/thread throughput >= 0.95x: for a model that already uses its cores from
threads, process workers must cost almost nothing.
"""

from __future__ import annotations

import sys
from typing import Any

import _bench
import _process

CLIENTS = 64
RUNNERS = ("thread", "process")


def parse_args() -> Any:
    p = _bench.base_parser(__doc__, default_cpus="0,1", default_repeats=3)
    p.add_argument("--duration", type=float, default=None, help="measured s per run (3)")
    p.add_argument("--workers", type=int, default=2, help="model workers per server (2)")
    return p.parse_args()


def run(args: Any) -> None:
    cores = _process.split_cpus(args.cpus)
    repeats = args.repeats or (1 if args.quick else 3)
    duration = args.duration or (1.0 if args.quick else 3.0)
    warmup = 0.5 if args.quick else 1.0
    _bench.header(
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
    report(results)


def report(results: dict[str, list[dict[str, Any]]]) -> None:
    med = {
        runner: {
            key: _bench.median(r[key] for r in rows)
            for key in ("throughput", "p50_ms", "p99_ms", "mean_batch")
        }
        for runner, rows in results.items()
    }
    print()
    print(
        _bench.table(
            ["runner", "req/s", "p50 ms", "p99 ms", "mean batch", "errors"],
            [
                (
                    runner,
                    _bench.fmt_num(m["throughput"]),
                    f"{m['p50_ms']:.2f}",
                    f"{m['p99_ms']:.2f}",
                    f"{m['mean_batch']:.1f}",
                    sum(r["errors"] for r in results[runner]),
                )
                for runner, m in med.items()
            ],
        )
    )
    ratio = med["process"]["throughput"] / med["thread"]["throughput"]
    print()
    print(
        f"process/thread throughput = {ratio:.2f}x (goal >= 0.95x: {_bench.verdict(ratio, 0.95)})"
    )


def main() -> int:
    args = parse_args()
    return _bench.run_reported("process_http", lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
