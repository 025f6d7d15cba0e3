"""Where a server's time goes under http_bench.py's load: py-spy, summarised per request.

Starts the servers as ``http_bench.py`` does (pinned to CPU 0), drives one of them with the
same load generator (pinned to CPU 1) at one concurrency and encoding, and records the
server process with ``py-spy record --format raw`` (py-spy pinned to the client's core)
during the measured window. Prints, per request served in that window:

  * CPU-time by thread (the event loop vs the model worker thread);
  * the functions with the most *self* time (the leaf frame of each sample);
  * the functions with the most *inclusive* time, from carpool, uvicorn, the plain app
    and asyncio (what the request path costs, with its callees).

Samples of idle threads are not recorded, so a thread's µs/request is time it was running
(or runnable); one core is shared by all threads of the server. py-spy pauses the process
for each sample unless ``--nonblocking``: at the default 1000 Hz that costs a few percent.

    python benchmarks/http_profile.py --server carpool --concurrency 64
    python benchmarks/http_profile.py --server carpool --concurrency 1 --encoding binary
    python benchmarks/http_profile.py --server plain --concurrency 1
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _bench  # first: one BLAS thread
import http_bench

INTERESTING = ("carpool/", "uvicorn/", "http_models", "asyncio/", "concurrent/", "threading")
# Leaf frames where a thread waits in C: a worker thread blocked on its work queue, the event
# loop inside uvloop's C loop (epoll, and also uvloop's own socket I/O and httptools' C
# parser, which have no Python frame). py-spy does not always see these as idle.
WAITING = (
    "_worker (concurrent/futures/thread.py)",
    "Runner.run (asyncio/runners.py)",
    "wait (threading.py)",
    "select (selectors.py)",
)


def _frames(stack: str) -> list[str]:
    return stack.split(";")


def summarise(raw: Path, rate: int, requests: int, top: int) -> str:
    per_thread: collections.Counter[str] = collections.Counter()
    waiting: collections.Counter[str] = collections.Counter()
    self_time: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = _frames(stack)
        thread, frames = frames[0], frames[1:]
        total += count
        name = thread.removeprefix("thread ")  # "(tid): name", from py-spy --threads
        if frames and frames[-1] in WAITING:
            waiting[name] += count
            continue
        per_thread[name] += count
        if frames:
            self_time[frames[-1]] += count
        for f in set(frames):
            if any(key in f for key in INTERESTING):
                inclusive[f] += count

    def us(samples: int) -> str:
        return f"{samples / rate / max(requests, 1) * 1e6:9.1f}"

    busy = sum(per_thread.values())
    out = [
        f"samples: {total} at {rate} Hz; requests in the window: {requests}; "
        f"{us(busy).strip()} µs/request in Python or the model, "
        f"{us(total - busy).strip()} µs/request waiting or in uvloop/httptools C code",
        "",
    ]
    out.append("by thread (µs/request): running Python/numpy | waiting or in C (leaf in WAITING)")
    for name in sorted(set(per_thread) | set(waiting)):
        out.append(f"  {us(per_thread[name])} | {us(waiting[name])}  {name}")
    out.append("")
    out.append(f"top {top} self time (µs/request, leaf frame)")
    for name, n in self_time.most_common(top):
        out.append(f"  {us(n)}  {name}")
    out.append("")
    out.append(f"top {top} inclusive (µs/request; carpool, uvicorn, asyncio, plain app frames)")
    for name, n in inclusive.most_common(top):
        out.append(f"  {us(n)}  {name}")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--server", choices=("carpool", "plain"), default="carpool")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--encoding", choices=http_bench.ENCODINGS, default="json")
    p.add_argument("--duration", type=float, default=8.0, help="profiled seconds (default 8)")
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--rate", type=int, default=1000, help="py-spy samples/s (default 1000)")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--nonblocking", action="store_true", help="py-spy --nonblocking")
    p.add_argument("--native", action="store_true", help="py-spy --native")
    p.add_argument(
        "--all-threads",
        action="store_true",
        help="sample running threads, not only the one holding the GIL (py-spy "
        "then under-counts numpy calls that released the GIL)",
    )
    p.add_argument("--cpus", default="0,1", help="server CPU, client CPU (default '0,1')")
    p.add_argument("--keep", default=None, help="also write the raw py-spy output here")
    args = p.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]

    pyspy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    server_cpus, client_cpus, pinning = http_bench._cpu_split(args.cpus)
    _bench.pin(client_cpus)
    servers: dict[str, http_bench.Server] = {}
    client = None
    try:
        servers = http_bench.start_servers(server_cpus, 1, only=(args.server,))
        srv = servers[args.server]
        client = http_bench.Client(client_cpus)
        client.ask(cmd="hello")
        raw = Path(tempfile.mkdtemp()) / "profile.txt"
        cmd = [
            pyspy,
            "record",
            "--pid",
            str(srv.proc.pid),
            "--rate",
            str(args.rate),
            "--duration",
            str(round(args.duration)),
            "--format",
            "raw",
            "--threads",
            "--nolineno",
            "--output",
            str(raw),
            *(["--native"] if args.native else []),
        ]
        if not args.all_threads:
            cmd.append("--gil")
        if args.nonblocking:
            cmd.append("--nonblocking")

        def pin_pyspy() -> None:
            if client_cpus:
                os.sched_setaffinity(0, client_cpus)

        # The client runs warm-up + window in one step; py-spy starts as the window does.
        import threading

        result: dict[str, Any] = {}

        def drive() -> None:
            result.update(
                client.ask(
                    cmd="step",
                    base=srv.base,
                    encoding=args.encoding,  # type: ignore[union-attr]
                    concurrency=args.concurrency,
                    warmup=args.warmup,
                    duration=args.duration + 0.5,
                    metrics=args.server == "carpool",
                    server_pid=srv.proc.pid,
                )
            )

        t = threading.Thread(target=drive)
        t.start()
        time.sleep(args.warmup + 0.25)
        spy = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=pin_pyspy)
        t.join()
        if spy.returncode != 0 or not raw.exists():
            print("py-spy failed:", spy.stderr[-2000:])
            return 0
        if args.keep:
            shutil.copy(raw, args.keep)
        requests = int(result["throughput"] * args.duration)
        print(
            f"== py-spy on {args.server} ({pinning}), {args.encoding}, "
            f"{args.concurrency} clients =="
        )
        print(
            f"   {result['throughput']:.0f} req/s, p50 {result['p50_ms']:.2f} ms, "
            f"p99 {result['p99_ms']:.2f} ms, server CPU {result['server_cpu']:.0%}"
            + (f", mean batch {result['mean_batch']:.1f}" if args.server == "carpool" else "")
            + (f", errors {result['errors']}" if result["errors"] else "")
        )
        print()
        print(summarise(raw, args.rate, requests, args.top))
    finally:
        if client is not None:
            client.close()
        for s in servers.values():
            s.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
