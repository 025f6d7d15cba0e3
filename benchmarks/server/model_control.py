"""Model control under load: reloads of the demo model under 64 closed-loop clients (failed
requests, p99 against a steady window), and a 400 MB model's RSS and worker processes before
its load, loaded and after its unload (thread and process runners). Goals: issue 21.

    python -m benchmarks.server.model_control [--quick]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from benchmarks.harness import Figures, common, run
from benchmarks.harness import processes as _process

CLIENTS = 64
DEMO = "from carpool.backends.demo import demo_model\n\nmodel = demo_model()\n"
BIG = """\
import numpy as np
from carpool import Model, Tensor

WEIGHTS = np.ones(100_000_000, np.float32)  # 400 MB, every page touched


def add(x):
    return x + WEIGHTS[:4]


SPEC = [Tensor("INPUT0", "FP32", (4,))]
model = Model(add, inputs=SPEC, outputs=[Tensor("OUTPUT0", "FP32", (4,))])
"""


def write_repository(root: Path) -> Path:
    for name, code, toml in (
        ("demo", DEMO, ""),
        ("big", BIG, ""),
        ("bigproc", BIG, 'runner = "process"\n'),
    ):
        folder = root / name
        folder.mkdir(parents=True)
        (folder / "model.py").write_text(code)
        if toml:
            (folder / "carpool.toml").write_text(toml)
    return root


def post(server: _process.Server, path: str) -> None:
    request = urllib.request.Request(server.base + path, data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=120) as r:
        r.read()


class Reloader(threading.Thread):
    """Reloads ``model`` every ``every`` seconds until stopped; counts the reloads."""

    def __init__(self, server: _process.Server, model: str, every: float) -> None:
        super().__init__(daemon=True)
        self.server, self.model, self.every = server, model, every
        self.stop = threading.Event()
        self.reloads = 0

    def run(self) -> None:
        while not self.stop.wait(self.every):
            post(self.server, f"/v2/repository/models/{self.model}/load")
            self.reloads += 1


def rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def children(pid: int, workers_only: bool = False) -> list[int]:
    """``pid``'s live child processes; ``workers_only``: its model workers, not the resource
    tracker multiprocessing starts once, with the first worker, and keeps for good."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) != pid or fields[0] == "Z":
                continue
            if not workers_only or b"resource_tracker" not in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
    return found


def settle(pid: int) -> None:
    """Until the server's process count stops changing (workers starting or leaving)."""
    last, stable = -1, 0
    while stable < 5:
        now = len(children(pid))
        stable = stable + 1 if now == last else 0
        last = now
        time.sleep(0.1)


def reloads(
    server: _process.Server, args: argparse.Namespace, cores: _process.Cores, figures: Figures
) -> None:
    """Steady and reloading windows, alternating: their table, and their figures."""
    repeats = args.repeats or (1 if args.quick else 3)
    warmup, duration = (0.5, 1.5) if args.quick else (1.0, 5.0)
    rows: list[list[object]] = []
    ratios: list[float] = []
    windows: dict[str, list[dict[str, float]]] = {"steady": [], "reloading": []}
    failed, total_reloads = 0, 0
    for r in range(repeats):
        runs = {}
        for window in ("steady", "reloading") if r % 2 == 0 else ("reloading", "steady"):
            reloader = (
                Reloader(server, "demo", args.reload_every) if window == "reloading" else None
            )
            if reloader is not None:
                reloader.start()
            bench = _process.carpool_bench(
                server, "demo", [CLIENTS], warmup=warmup, duration=duration, cpus=cores.client
            )
            if reloader is not None:
                reloader.stop.set()
                reloader.join()
                total_reloads += reloader.reloads
            row = bench.rows()[0]
            runs[window] = row
            windows[window].append(row)
            failed += row["errors"] if window == "reloading" else 0
            n = reloader.reloads if reloader is not None else 0
            rows.append([r + 1, window, f"{row['throughput']:.0f}", f"{row['p50_ms']:.2f}",
                         f"{row['p99_ms']:.2f}", row["errors"], n])  # fmt: skip
            print(f"  repeat {r + 1}/{repeats} {window}: {row['throughput']:.0f} req/s, "
                  f"p99 {row['p99_ms']:.2f} ms, {row['errors']} failed, {n} reloads")  # fmt: skip
        ratios.append(runs["reloading"]["p99_ms"] / runs["steady"]["p99_ms"])
    print()
    heads = ["repeat", "window", "req/s", "p50 ms", "p99 ms", "failed", "reloads"]
    print(common.table(heads, rows))
    for window, done in windows.items():
        figures.add(f"req_per_s_{window}", common.median(r["throughput"] for r in done), "req/s")
        figures.add(f"p99_ms_{window}", common.median(r["p99_ms"] for r in done), "ms")
    figures.add("reloads", total_reloads)
    figures.at_most("failed_during_reloads", int(failed), 0, "requests")
    figures.at_most("p99_reloading_over_steady", common.median(ratios), 2.0)


def footprint(server: _process.Server) -> tuple[float, int]:
    """The server's RSS with its workers' (MB), and how many workers it has, once settled."""
    settle(server.pid)
    workers = children(server.pid, workers_only=True)
    return rss_mb([server.pid, *workers]), len(workers)


def memory(server: _process.Server, figures: Figures) -> None:
    """Each big model loaded and unloaded: their table, and their figures."""
    rows: list[list[object]] = []
    for model in ("big", "bigproc"):
        before, workers_before = footprint(server)
        post(server, f"/v2/repository/models/{model}/load")
        loaded, workers_loaded = footprint(server)
        post(server, f"/v2/repository/models/{model}/unload")
        after, workers_after = footprint(server)
        workers = f"{workers_before}/{workers_loaded}/{workers_after}"
        row = [f"{before:.0f}", f"{loaded:.0f}", f"{after:.0f}", f"{after / before:.3f}"]
        rows.append([model, *row, workers])
        figures.add(f"rss_before_mb_{model}", before, "MB")
        figures.add(f"rss_loaded_mb_{model}", loaded, "MB")
        figures.add(f"rss_after_unload_mb_{model}", after, "MB")
        figures.at_most(f"rss_after_over_before_{model}", after / before, 1.10)
        figures.add(f"workers_loaded_{model}", workers_loaded)
        figures.at_most(f"workers_after_unload_{model}", workers_after, workers_before, "processes")
    print()
    heads = ["model", "RSS before MB", "loaded MB", "after unload MB", "after/before",
             "workers before/loaded/after"]  # fmt: skip
    print(common.table(heads, rows))


def parser() -> argparse.ArgumentParser:
    p = common.base_parser(__doc__, default_cpus="0,1", default_repeats=3)
    p.add_argument("--reload-every", type=float, default=0.5, help="seconds between reloads")
    return p


def measure(args: argparse.Namespace) -> Figures:
    cores = _process.split_cpus(args.cpus)
    _process.pin_self(cores.client)
    title = "carpool model control: reloads under load, memory after unload"
    every = f"{args.reload_every} s"
    common.header(title, {"cpus": str(cores), "clients": CLIENTS, "reload every": every})
    figures = Figures()
    with tempfile.TemporaryDirectory(prefix="carpool-repo-") as folder:
        repository = write_repository(Path(folder))
        server = _process.carpool_serve(
            str(repository), "--model-control-mode", "explicit", "--load-model", "demo",
            cpus=cores.server, name="carpool serve (explicit)",
        )  # fmt: skip
        try:
            server.wait_ready()
            reloads(server, args, cores, figures)
            memory(server, figures)
        finally:
            server.stop()
    return figures


if __name__ == "__main__":
    raise SystemExit(run(measure, parser()))
