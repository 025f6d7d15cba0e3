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
repeats (default 3) of req/s and p50, and the instant server's CPU share of its core over
the run: well under 100% means the server had room, so req/s is the client's limit.

Why: a load generator slower than the server it measures reports its own limit as the
server's. Any server measured with ``carpool bench`` well below these rates (on the same
kind of core) was measured, not the client. Nothing is asserted; exits 0.

Measured (2-core shared VM, Python 3.11, aiohttp 3.14 on uvloop 0.23, 3 repeats): one
client process on one core peaks at ~14,000 req/s (64 clients; 4,900 at 1 client, 12,800
at 8, 11,600 at 256, where 256 connections cost the client more), with the instant server
at 10-20% of its core throughout. A second client process on the *same* core adds
nothing (13,000 at 64): ``--client-processes`` pays where it gets a core of its own.

    python benchmarks/bench_ceiling.py                # ~1.5 min
    python benchmarks/bench_ceiling.py --quick        # ~10 s smoke test
    python benchmarks/bench_ceiling.py --cpus none    # no pinning
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import _bench  # first: one BLAS thread for everything numpy in this process tree

CONCURRENCY = "1,8,64,256"
PROCESSES = (1, 2)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARPOOL_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_bench.SRC), env.get("PYTHONPATH")) if p)
    return env


def _pinned(cpus: set[int] | None) -> Any:
    def pin() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)

    return pin


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (nan where unavailable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def start_instant(cpus: set[int] | None) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "carpool.bench.instant", "--port", str(port)],
        env=_env(),
        stderr=subprocess.DEVNULL,
        preexec_fn=_pinned(cpus),
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(base + "/v2/health/ready", timeout=1) as response:
                if response.status == 200:
                    return process, base
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("the instant server did not start in 30 s")


def bench_run(
    url: str, concurrency: int, processes: int, args: Any, cpus: set[int] | None, server_pid: int
) -> dict[str, float]:
    """One ``carpool bench`` run; its step's req/s and p50, and the server's CPU share."""
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.json"
        command = [
            sys.executable, "-m", "carpool", "bench", url,
            "--concurrency", str(concurrency), "--client-processes", str(processes),
            "--warmup", str(args.warmup), "--duration", str(args.duration),
            "--json", str(report),
        ]  # fmt: skip
        cpu0 = _cpu_seconds(server_pid)
        done = subprocess.run(
            command,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=120,
            preexec_fn=_pinned(cpus),
        )
        cpu1 = _cpu_seconds(server_pid)
        if done.returncode != 0:
            raise RuntimeError(f"carpool bench failed ({done.returncode}): {done.stderr[-2000:]}")
        (step,) = json.loads(report.read_text())["steps"]
    return {
        "rps": step["throughput_rps"],
        "p50": step["latency"]["p50"] if step["latency"] else float("nan"),
        "errors": sum(step["errors"].values()),
        # the server's CPU over the run, as a share of the loaded seconds (it idles otherwise)
        "server_cpu": (cpu1 - cpu0) / (args.warmup + args.duration),
    }


def main() -> int:
    p = _bench.base_parser(__doc__, default_cpus="0,1", default_repeats=3)
    p.add_argument("--concurrency", default=None, help=f"client counts (default {CONCURRENCY})")
    p.add_argument("--duration", type=float, default=None, help="measured s per run (default 3)")
    p.add_argument("--warmup", type=float, default=None, help="warm-up s per run (default 1)")
    args = p.parse_args()
    quick = args.quick
    args.concurrency = args.concurrency or ("1,64" if quick else CONCURRENCY)
    args.duration = args.duration or (0.5 if quick else 3.0)
    args.warmup = args.warmup if args.warmup is not None else (0.2 if quick else 1.0)
    repeats = args.repeats or (1 if quick else 3)
    concurrencies = [int(c) for c in args.concurrency.split(",")]

    cpus = _bench.parse_cpus(args.cpus)
    ordered = sorted(cpus) if cpus else []
    server_cpus = {ordered[0]} if len(ordered) >= 2 else None
    client_cpus = {ordered[1]} if len(ordered) >= 2 else None
    _bench.header(
        "carpool bench ceiling: the load generator against an instant v2 server",
        {
            "cpus": f"server {ordered[0]}, client {ordered[1]}" if server_cpus else "not pinned",
            "run": f"{args.warmup:g} s warm-up + {args.duration:g} s x {repeats} repeats",
            "request": "1 x 256 FP32, v2 JSON",
        },
    )
    server, base = start_instant(server_cpus)
    url = base + "/v2/models/instant"
    results: dict[tuple[int, int], list[dict[str, float]]] = {}
    try:
        for repeat in range(repeats):
            for c in concurrencies:
                order = PROCESSES if repeat % 2 == 0 else PROCESSES[::-1]
                for n in order:
                    result = bench_run(url, c, n, args, client_cpus, server.pid)
                    results.setdefault((n, c), []).append(result)
                    print(
                        f"  repeat {repeat + 1}: {c:>3} clients, {n} process(es): "
                        f"{result['rps']:,.0f} req/s"
                    )
    except (Exception, KeyboardInterrupt) as exc:  # report, never fail the caller
        print(f"\nbench_ceiling: {type(exc).__name__}: {exc}", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=10)

    def med(n: int, c: int, key: str) -> float:
        return _bench.median(r[key] for r in results.get((n, c), []))

    print()
    print("carpool bench ceiling (closed loop, medians over repeats)")
    rows = []
    for c in concurrencies:
        row: list[Any] = [c]
        for n in PROCESSES:
            row += [_bench.fmt_num(med(n, c, "rps")), _bench.fmt_num(med(n, c, "p50"), 2)]
        row.append("/".join(f"{med(n, c, 'server_cpu'):.0%}" for n in PROCESSES))
        row.append(sum(r["errors"] for n in PROCESSES for r in results.get((n, c), [])))
        rows.append(row)
    headers = ["clients", "1 proc req/s", "1 proc p50 ms", "2 proc req/s", "2 proc p50 ms",
               "server CPU 1/2", "errors"]  # fmt: skip
    print(_bench.table(headers, rows))
    best = max(
        ((med(n, c, "rps"), n, c) for n in PROCESSES for c in concurrencies),
        key=lambda t: t[0] if t[0] == t[0] else -1.0,
        default=None,
    )
    if best is not None and best[0] == best[0]:
        rps, n, c = best
        where = " on one core" if client_cpus else ""
        print(f"\nceiling: {rps:,.0f} req/s ({c} clients, {n} client process(es){where})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
