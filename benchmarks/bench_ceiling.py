"""The ceiling of ``carpool bench`` itself: its load generator against a server that answers
at once.

What: ``python -m carpool.bench.instant`` (HTTP/1.1 keep-alive on a raw asyncio.Protocol over
uvloop, the same canned v2 response to every inference, no model, bodies skipped unparsed)
pinned to one core (default CPU 0), and ``carpool bench URL --concurrency C`` pinned to the
other (CPU 1), closed loop, with 1 and with 2 client processes (``--client-processes``;
both then share that one core). Requests are the demo model's: one row of 256 FP32 as v2
JSON, pre-encoded. Each (processes, concurrency) is its own ``carpool bench`` run of
``--warmup`` + ``--duration`` seconds; runs are interleaved (for each repeat, for each
concurrency, the two process counts in alternating order) and the table shows medians over
repeats (default 3) of req/s and p50, the ratio of 2 processes to 1 (median over the pairs
run back to back), and the instant server's CPU share of its core over the run: well under
100% means the server had room, so req/s is the client's limit.

Why: a load generator slower than the server it measures reports its own limit as the
server's. Any server measured with ``carpool bench`` well below these rates (on the same
kind of core) was measured, not the client. Nothing is asserted; exits 0.

Measured (2-core shared VM, Python 3.11, aiohttp 3.14 on uvloop 0.23, 3 repeats): one
client process on one core peaks at ~14,000 req/s (64 clients; 4,900 at 1 client, 12,800
at 8, 11,600 at 256, where 256 connections cost the client more), with the instant server
at 10-20% of its core throughout. A second client process on the *same* core adds
nothing (13,000 at 64): ``--client-processes`` pays where it gets a core of its own.

    python benchmarks/bench_ceiling.py                # ~1.5 min
    python benchmarks/bench_ceiling.py --quick        # ~10 s smoke test (64 clients)
    python benchmarks/bench_ceiling.py --cpus none    # no pinning
"""

from __future__ import annotations

import sys
from typing import Any

import _bench  # first: one BLAS thread for everything numpy in this process tree
import _process

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


def main() -> int:
    p = _bench.base_parser(__doc__, default_cpus="0,1", default_repeats=3)
    p.add_argument("--concurrency", default=None, help=f"client counts (default {CONCURRENCY})")
    p.add_argument("--duration", type=float, default=None, help="measured s per run (default 3)")
    p.add_argument("--warmup", type=float, default=None, help="warm-up s per run (default 1)")
    args = p.parse_args()
    quick = args.quick
    args.concurrency = args.concurrency or ("64" if quick else CONCURRENCY)
    args.duration = args.duration or (0.5 if quick else 3.0)
    args.warmup = args.warmup if args.warmup is not None else (0.2 if quick else 1.0)
    repeats = args.repeats or (1 if quick else 3)
    concurrencies = [int(c) for c in args.concurrency.split(",")]

    cores = _process.split_cpus(args.cpus)
    _process.pin_self(cores.client)  # the orchestrator mostly waits: keep it off the server's
    _bench.header(
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
    except (Exception, KeyboardInterrupt) as exc:  # report, never fail the caller
        print(f"\nbench_ceiling: {type(exc).__name__}: {exc}", flush=True)
    finally:
        server.stop()
    report(results, concurrencies, cores)
    return 0


def report(
    results: dict[tuple[int, int], list[dict[str, Any]]],
    concurrencies: list[int],
    cores: _process.Cores,
) -> None:
    def med(n: int, c: int, key: str) -> float:
        return _bench.median(r[key] for r in results.get((n, c), []))

    def paired(c: int) -> float:  # 2 processes / 1, over the runs of the same repeat
        pairs = zip(results.get((2, c), []), results.get((1, c), []), strict=False)
        return _bench.median(a["throughput"] / b["throughput"] for a, b in pairs if b["throughput"])

    print()
    print("carpool bench ceiling (closed loop, medians over repeats)")
    rows = []
    for c in concurrencies:
        row: list[Any] = [c]
        for n in PROCESSES:
            row += [
                _bench.fmt_num(med(n, c, "throughput")),
                _bench.fmt_num(med(n, c, "p50_ms"), 2),
            ]
        row.append(f"{paired(c):.2f}x")
        row.append("/".join(f"{med(n, c, 'server_cpu'):.0%}" for n in PROCESSES))
        row.append(sum(r["errors"] for n in PROCESSES for r in results.get((n, c), [])))
        rows.append(row)
    headers = ["clients", "1 proc req/s", "1 proc p50 ms", "2 proc req/s", "2 proc p50 ms",
               "2/1 req/s", "server CPU 1/2", "errors"]  # fmt: skip
    print(_bench.table(headers, rows))
    best = max(
        ((med(n, c, "throughput"), n, c) for n in PROCESSES for c in concurrencies),
        key=lambda t: t[0] if t[0] == t[0] else -1.0,
        default=None,
    )
    if best is not None and best[0] == best[0]:
        rps, n, c = best
        where = " on one core" if cores.client else ""
        print(f"\nceiling: {rps:,.0f} req/s ({c} clients, {n} client process(es){where})")


if __name__ == "__main__":
    sys.exit(main())
