"""The ``demo`` model's latency-throughput curve for max_wait_ms 0, 2, 5 and 10, measured
with ``carpool bench`` itself.

What: for each window, ``carpool serve demo --policy fixed --max-wait-ms W`` pinned to one
core (default CPU 0), and ``carpool bench`` on the other (CPU 1), closed loop at 1, 4, 16,
64 and 256 clients; each run's report is written as JSON, then ``carpool bench --compare``
prints them side by side (ratios against max_wait_ms=0) and draws them on one plot.

    python benchmarks/bench_demo_curve.py                      # ~2 min; docs/bench/*
    python benchmarks/bench_demo_curve.py --quick --out /tmp/x # smoke test
    python benchmarks/bench_demo_curve.py --cpus none          # no pinning
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WAITS = (0, 2, 5, 10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pinned(command: list[str], cpu: str | None) -> list[str]:
    return command if cpu is None else ["taskset", "-c", cpu, *command]


def _wait_ready(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"carpool serve exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=1) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("carpool serve was not ready within 60 s")


def run_one(wait: int, args: argparse.Namespace, out: Path) -> Path:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server_cpu, client_cpu = (None, None) if args.cpus == "none" else args.cpus.split(",")
    serve = [sys.executable, "-m", "carpool", "serve", "demo", "--port", str(port),
             "--policy", "fixed", "--max-wait-ms", str(wait), "--access-log", "false",
             "--log-level", "warning"]  # fmt: skip
    server = subprocess.Popen(_pinned(serve, server_cpu), cwd=ROOT)
    report = out / f"demo-wait-{wait}ms.json"
    try:
        _wait_ready(url, server)
        bench = [sys.executable, "-m", "carpool", "bench", f"{url}/v2/models/demo",
                 "--concurrency", args.concurrency, "--duration", str(args.duration),
                 "--warmup", str(args.warmup), "--json", str(report),
                 "--label", f"wait {wait} ms", "--encoding", "binary"]  # fmt: skip
        subprocess.run(_pinned(bench, client_cpu), cwd=ROOT, check=True)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "bench"), help="report folder")
    parser.add_argument("--plot", default=str(ROOT / "docs" / "bench-demo-max-wait.png"))
    parser.add_argument("--cpus", default="0,1", help="SERVER,CLIENT cores, or 'none'")
    parser.add_argument("--concurrency", default="1,4,16,64,256")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--quick", action="store_true", help="tiny run: a smoke test")
    args = parser.parse_args()
    if args.quick:
        args.concurrency, args.duration, args.warmup = "1,16", 0.5, 0.2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.cpus != "none" and len(os.sched_getaffinity(0)) < 2:
        args.cpus = "none"
    reports = [run_one(wait, args, out) for wait in WAITS]
    compare = [sys.executable, "-m", "carpool", "bench", "--compare", *map(str, reports),
               "--plot", args.plot]  # fmt: skip
    subprocess.run(compare, cwd=ROOT, check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
