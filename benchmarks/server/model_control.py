"""Model control under load: reloads that lose nothing, unloads that give memory back.

What, in one run, against ``carpool serve REPO --model-control-mode explicit`` pinned to the
server's core (CPU 0), ``carpool bench`` pinned to the client's (CPU 1):

  * **reload under load**: 64 closed-loop clients on the demo model (``demo/model.py`` in a
    repository written for the run: the built-in numpy MLP, 256 floats in). Each repeat
    measures a steady window, then a window of the same length during which the model is
    reloaded (``POST /v2/repository/models/demo/load``) every ``--reload-every`` seconds;
    the two alternate in order per repeat. Reported: req/s, p50, p99, failed requests and
    reloads per window; the p99 ratio (reload window / steady window) is the median over
    repeats of ratios taken within one repeat.
  * **unload gives memory back**: a model holding 400 MB of weights (``big``, thread
    runner) is loaded and unloaded: the server's RSS before the load, loaded, and after the
    unload; then the same weights with ``--runner process`` (``bigproc``): its worker
    processes are counted before and after the unload, and the RSS summed over the server
    and its workers (not multiprocessing's resource tracker, which the first worker starts and
    which stays).

Goals (issue 21): 0 failed requests during reloads; the reload window's p99 within 2x the
steady one; RSS after an unload within 10 % of RSS before the load, with the process
runner's processes gone. Prints ``met``/``MISSED``; exits 0.

    python benchmarks/model_control.py                # ~1 min
    python benchmarks/model_control.py --quick        # a smoke run, ~15 s
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import _bench
import _process

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


def reloads(server: _process.Server, args: object, cores: _process.Cores) -> dict[str, object]:
    quick = getattr(args, "quick", False)
    repeats = getattr(args, "repeats", None) or (1 if quick else 3)
    warmup, duration = (0.5, 1.5) if quick else (1.0, 5.0)
    every = getattr(args, "reload_every", 0.5)
    rows, ratios, failed, total_reloads = [], [], 0, 0
    for r in range(repeats):
        runs = {}
        for window in ("steady", "reloading") if r % 2 == 0 else ("reloading", "steady"):
            reloader = Reloader(server, "demo", every) if window == "reloading" else None
            if reloader is not None:
                reloader.start()
            run = _process.carpool_bench(
                server, "demo", [CLIENTS], warmup=warmup, duration=duration, cpus=cores.client
            )
            if reloader is not None:
                reloader.stop.set()
                reloader.join()
                total_reloads += reloader.reloads
            row = run.rows()[0]
            runs[window] = row
            failed += row["errors"] if window == "reloading" else 0
            n = reloader.reloads if reloader is not None else 0
            rows.append([r + 1, window, f"{row['throughput']:.0f}", f"{row['p50_ms']:.2f}",
                         f"{row['p99_ms']:.2f}", row["errors"], n])  # fmt: skip
            print(f"  repeat {r + 1}/{repeats} {window}: {row['throughput']:.0f} req/s, "
                  f"p99 {row['p99_ms']:.2f} ms, {row['errors']} failed, {n} reloads")  # fmt: skip
        ratios.append(runs["reloading"]["p99_ms"] / runs["steady"]["p99_ms"])
    print()
    heads = ["repeat", "window", "req/s", "p50 ms", "p99 ms", "failed", "reloads"]
    print(_bench.table(heads, rows))
    return {"ratio": _bench.median(ratios), "failed": failed, "reloads": total_reloads}


def footprint(server: _process.Server) -> tuple[float, int]:
    """The server's RSS with its workers' (MB), and how many workers it has, once settled."""
    settle(server.pid)
    workers = children(server.pid, workers_only=True)
    return rss_mb([server.pid, *workers]), len(workers)


def memory(server: _process.Server) -> list[list[object]]:
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
    return rows


def main() -> int:
    p = _bench.base_parser(__doc__, default_cpus="0,1", default_repeats=3)
    p.add_argument("--reload-every", type=float, default=0.5, help="seconds between reloads")
    args = p.parse_args()
    cores = _process.split_cpus(args.cpus)
    _process.pin_self(cores.client)
    title = "carpool model control: reloads under load, memory after unload"
    every = f"{args.reload_every} s"
    _bench.header(title, {"cpus": str(cores), "clients": CLIENTS, "reload every": every})

    def body() -> None:
        with tempfile.TemporaryDirectory(prefix="carpool-repo-") as folder:
            repository = write_repository(Path(folder))
            server = _process.carpool_serve(
                str(repository), "--model-control-mode", "explicit", "--load-model", "demo",
                cpus=cores.server, name="carpool serve (explicit)",
            )  # fmt: skip
            try:
                server.wait_ready()
                found = reloads(server, args, cores)
                rows = memory(server)
            finally:
                server.stop()
        print()
        heads = ["model", "RSS before MB", "loaded MB", "after unload MB", "after/before",
                 "workers before/loaded/after"]  # fmt: skip
        print(_bench.table(heads, rows))
        print()
        ratio = found["ratio"]
        print(f"failed requests during {found['reloads']} reloads: {found['failed']} "
              f"(goal 0: {_bench.verdict(-float(found['failed']), 0)})")  # fmt: skip
        print(f"p99 reloading / steady: {ratio:.2f}x (goal <= 2x: "
              f"{_bench.verdict(float(ratio), 2.0, higher_is_better=False)})")  # type: ignore[arg-type]  # fmt: skip
        for row in rows:
            share = float(str(row[4]))
            print(f"RSS after unload / before load, {row[0]}: {share:.3f} (goal <= 1.10: "
                  f"{_bench.verdict(share, 1.10, higher_is_better=False)})")  # fmt: skip

    return _bench.run_reported("model_control", body)


if __name__ == "__main__":
    sys.exit(main())
