"""The ceiling of ``carpool bench`` itself: req/s of its load generator, with 1 and 2 client
processes on one core, against ``python -m carpool.bench.instant``, a server that answers at
once; and that server's CPU share (well under 100%: the client was the limit). A server
measured well below these rates was measured, not the client (docs/benchmarks/loadgen.md).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from benchmarks.harness import Figures, common, run
from benchmarks.harness import processes as _process

CONCURRENCY = "1,8,64,256"
PROCESSES = (1, 2)


def start_instant(cpus: frozenset[int] | None) -> _process.Server:
    port = _process.free_port()
    argv = [sys.executable, "-m", "carpool.bench.instant", "--port", str(port)]
    server = _process.Server("carpool.bench.instant", argv, port, cpus)
    try:
        server.wait_ready(30)
    except BaseException:
        server.stop()
        raise
    return server


def bench_run(
    server: _process.Server, concurrency: int, processes: int, args: Any, cores: _process.Cores
) -> dict[str, Any]:
    """One ``carpool bench`` run: its step's req/s and p50, and the server's CPU share."""
    run = _process.carpool_bench(
        server,
        "instant",
        [concurrency],
        warmup=args.warmup,
        duration=args.duration,
        cpus=cores.client,
        flags=("--client-processes", str(processes)),
    )
    (row,) = run.rows()
    return row


def measure(args: argparse.Namespace) -> Figures:
    quick = args.quick
    args.concurrency = args.concurrency or ("64" if quick else CONCURRENCY)
    args.duration = args.duration or (0.5 if quick else 3.0)
    args.warmup = args.warmup if args.warmup is not None else (0.2 if quick else 1.0)
    repeats = args.repeats or (1 if quick else 3)
    concurrencies = [int(c) for c in args.concurrency.split(",")]

    cores = _process.split_cpus(args.cpus)
    _process.pin_self(cores.client)  # the orchestrator mostly waits: keep it off the server's
    common.header(
        "carpool bench ceiling: the load generator against an instant v2 server",
        {
            "cpus": str(cores),
            "run": f"{args.warmup:g} s warm-up + {args.duration:g} s x {repeats} repeats",
            "request": "1 x 256 FP32, v2 JSON",
        },
    )
    server = start_instant(cores.server)
    results: dict[tuple[int, int], list[dict[str, float]]] = {}
    try:
        for repeat in range(repeats):
            for c in concurrencies:
                order = PROCESSES if repeat % 2 == 0 else PROCESSES[::-1]
                for n in order:
                    result = bench_run(server, c, n, args, cores)
                    results.setdefault((n, c), []).append(result)
                    print(
                        f"  repeat {repeat + 1}: {c:>3} clients, {n} process(es): "
                        f"{result['throughput']:,.0f} req/s"
                    )
    finally:
        server.stop()
    return report(results, concurrencies, cores)


def parser() -> argparse.ArgumentParser:
    p = common.base_parser(__doc__, default_cpus="0,1", default_repeats=3)
    p.add_argument("--concurrency", default=None, help=f"client counts (default {CONCURRENCY})")
    p.add_argument("--duration", type=float, default=None, help="measured s per run (default 3)")
    p.add_argument("--warmup", type=float, default=None, help="warm-up s per run (default 1)")
    return p


def report(
    results: dict[tuple[int, int], list[dict[str, Any]]],
    concurrencies: list[int],
    cores: _process.Cores,
) -> Figures:
    """Print the table and the ceiling; the figures: per processes and clients, req/s, p50
    and the server's CPU share; per clients, 2 processes / 1; the ceiling."""

    def med(n: int, c: int, key: str) -> float:
        return common.median(r[key] for r in results.get((n, c), []))

    def paired(c: int) -> float:  # 2 processes / 1, over the runs of the same repeat
        pairs = zip(results.get((2, c), []), results.get((1, c), []), strict=False)
        return common.median(a["throughput"] / b["throughput"] for a, b in pairs if b["throughput"])

    print()
    print("carpool bench ceiling (closed loop, medians over repeats)")
    rows = []
    for c in concurrencies:
        row: list[Any] = [c]
        for n in PROCESSES:
            row += [
                common.fmt_num(med(n, c, "throughput")),
                common.fmt_num(med(n, c, "p50_ms"), 2),
            ]
        row.append(f"{paired(c):.2f}x")
        row.append("/".join(f"{med(n, c, 'server_cpu'):.0%}" for n in PROCESSES))
        row.append(sum(r["errors"] for n in PROCESSES for r in results.get((n, c), [])))
        rows.append(row)
    headers = ["clients", "1 proc req/s", "1 proc p50 ms", "2 proc req/s", "2 proc p50 ms",
               "2/1 req/s", "server CPU 1/2", "errors"]  # fmt: skip
    print(common.table(headers, rows))
    figures = Figures()
    for c in concurrencies:
        for n in PROCESSES:
            figures.add(f"req_per_s_{n}_proc_{c}", float(med(n, c, "throughput")), "req/s")
            figures.add(f"p50_ms_{n}_proc_{c}", float(med(n, c, "p50_ms")), "ms")
            figures.add(f"server_cpu_{n}_proc_{c}", float(med(n, c, "server_cpu")), "core")
        figures.add(f"two_over_one_proc_{c}", float(paired(c)), "x")
        errors = sum(r["errors"] for n in PROCESSES for r in results.get((n, c), []))
        figures.add(f"errors_{c}", errors)
    rps, n, c = max(
        ((med(n, c, "throughput"), n, c) for n in PROCESSES for c in concurrencies),
        key=lambda t: t[0] if t[0] == t[0] else -1.0,
    )
    where = " on one core" if cores.client else ""
    print(f"\nceiling: {rps:,.0f} req/s ({c} clients, {n} client process(es){where})")
    figures.add("ceiling_req_per_s", float(rps), "req/s")
    figures.add("ceiling_clients", c, "clients")
    figures.add("ceiling_processes", n, "processes")
    return figures


if __name__ == "__main__":
    raise SystemExit(run(measure, parser()))
