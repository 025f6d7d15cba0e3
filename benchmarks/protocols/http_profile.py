"""Where a server's time goes under http_batching's load: py-spy records its carpool or plain
server through one carpool bench run, summarised as microseconds per request by thread, by
self time and by inclusive time. Needs py-spy. See docs/benchmarks/protocols.md.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import Figures, run
from benchmarks.harness import processes as _process
from benchmarks.protocols import http_batching

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


def summarise(raw: Path, rate: int, requests: int, top: int) -> tuple[str, Figures]:
    """The report's text, and its figures: samples, µs/request running and waiting."""
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
    figures = Figures()
    figures.add("samples", total)
    figures.add("requests_profiled", requests)
    figures.add("us_per_request_running", float(us(busy)), "us")
    figures.add("us_per_request_waiting", float(us(total - busy)), "us")
    return "\n".join(out), figures


def wait_loaded(pid: int, timeout: float = 30.0) -> None:
    """Until the server's CPU time starts rising (``carpool bench`` has started its load:
    an idle server uses none); at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last = _process.cpu_seconds(pid)
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = _process.cpu_seconds(pid)
        if now - last >= 0.02:  # 20 ms of CPU in 50 ms: loaded
            return
        last = now


def pyspy_command(args: Any, pid: int, raw: Path) -> list[str]:
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    cmd = [pyspy, "record", "--pid", str(pid), "--rate", str(args.rate),
           "--duration", str(max(1, round(args.duration))), "--format", "raw", "--threads",
           "--nolineno", "--output", str(raw)]  # fmt: skip
    if args.native:
        cmd.append("--native")
    if not args.all_threads:
        cmd.append("--gil")
    if args.nonblocking:
        cmd.append("--nonblocking")
    return cmd


def profile(args: Any, server: _process.Server, cores: _process.Cores, raw: Path) -> Any:
    """Load the server in a thread; record it with py-spy after the warm-up. The run."""
    result: dict[str, Any] = {}

    def drive() -> None:
        try:
            result["run"] = _process.carpool_bench(
                server,
                http_batching.MODEL,
                [args.concurrency],
                warmup=args.warmup,
                duration=args.duration + 0.5,  # outlasts py-spy's window
                cpus=cores.client,
                flags=("--encoding", args.encoding),
            )
        except Exception as exc:  # reported by the caller
            result["error"] = exc

    load = threading.Thread(target=drive)
    load.start()
    wait_loaded(server.pid)
    time.sleep(args.warmup)
    spy = subprocess.run(
        pyspy_command(args, server.pid, raw),
        capture_output=True,
        text=True,
        preexec_fn=_process.pin_child(cores.client),
    )
    load.join()
    if "error" in result:
        raise result["error"]
    if spy.returncode != 0 or not raw.exists():
        raise RuntimeError(f"py-spy failed: {spy.stderr[-2000:]}")
    return result["run"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--server", choices=("carpool", "plain"), default="carpool")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--encoding", choices=http_batching.ENCODINGS, default="json")
    p.add_argument("--duration", type=float, default=None, help="profiled seconds (default 8)")
    p.add_argument("--warmup", type=float, default=None, help="seconds before (default 2)")
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
    p.add_argument(
        "--cpus", default="0,1", help="server CPU, client CPU; 'none' to not pin (default '0,1')"
    )
    p.add_argument("--keep", default=None, help="also write the raw py-spy output here")
    p.add_argument("--quick", action="store_true", help="a short smoke run (1 s profiled)")
    return p


def measure(args: argparse.Namespace) -> Figures:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    args.duration = args.duration or (1.0 if args.quick else 8.0)
    args.warmup = args.warmup if args.warmup is not None else (0.3 if args.quick else 2.0)
    args.top = 5 if args.quick else args.top
    if not shutil.which("py-spy") and not Path(sys.executable).with_name("py-spy").exists():
        raise FileNotFoundError("py-spy not found; install it: python -m pip install py-spy")
    cores = _process.split_cpus(args.cpus)
    _process.pin_self(cores.client)
    servers: dict[str, _process.Server] = {}
    try:
        servers = http_batching.start_servers(cores, 1, only=(args.server,))
        with tempfile.TemporaryDirectory() as folder:
            raw = Path(folder) / "profile.txt"
            bench = profile(args, servers[args.server], cores, raw)
            if args.keep:
                shutil.copy(raw, args.keep)
            (row,) = bench.rows()
            print(f"== py-spy on {args.server} ({cores}), {args.encoding}, "
                  f"{args.concurrency} clients ==")  # fmt: skip
            print(f"   {http_batching.progress(row, args.server)}")
            print()
            text, found = summarise(
                raw, args.rate, int(row["throughput"] * args.duration), args.top
            )
            print(text)
    finally:
        for server in servers.values():
            server.stop()
    figures = Figures()
    figures.add("req_per_s", row["throughput"], "req/s")
    figures.add("errors", int(row["errors"]))
    figures.update(found)
    return figures


if __name__ == "__main__":
    raise SystemExit(run(measure, parser()))
