"""Does gRPC batch like REST? The same concurrent calls over both, on one carpool serve: bursts
of 200 calls (mean batch, from the model's stats) and carpool bench's closed loop at 1 and 64
clients (req/s, mean batch). Goals (issue 18): gRPC's mean batch >= 0.7x REST's in bursts,
>= 0.8x at 64 clients, its req/s >= 0.7x there. See docs/benchmarks/protocols.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.harness import Figures, common, run
from benchmarks.harness import processes as _process

NEEDED = ("grpc", "tritonclient", "aiohttp", "numpy")
HERE = Path(__file__).resolve().parent
BURST = 200  # calls at once, as in issue 18
BURST_MODELS = ("double", "double_2ms")
DEMO = "demo"
CLIENTS = (1, 64)
PROTOCOLS = {"grpc": "gRPC", "rest": "REST binary"}
NAMES = {"grpc": "grpc", "rest": "rest_binary"}  # in figure names
GOALS = {"burst": 0.7, "batch64": 0.8, "rps64": 0.7}
MODELS = "benchmarks.harness.grpc_models"


def start(cores: _process.Cores, grpc_port: int) -> _process.Server:
    """``carpool serve demo MODELS:double MODELS:double_2ms``, gRPC on."""
    port = _process.free_port()
    argv = [sys.executable, "-m", "carpool", "serve", DEMO, f"{MODELS}:double",
            f"{MODELS}:double_2ms", "--port", str(port), "--grpc-port", str(grpc_port),
            "--access-log", "false", "--log-level", "warning"]  # fmt: skip
    return _process.Server("carpool serve", argv, port, cores.server, _process.child_env())


def counts(server: _process.Server, model: str) -> tuple[int, int]:
    """The model's (inference_count, execution_count) so far."""
    with urllib.request.urlopen(server.url(model) + "/stats", timeout=10) as r:
        (stats,) = json.load(r)["model_stats"]
    return int(stats["inference_count"]), int(stats["execution_count"])


def burst(
    server: _process.Server, grpc_port: int, protocol: str, model: str, cores: Any
) -> tuple[float, bool]:
    """One burst of ``BURST`` calls over ``protocol``: its mean batch (calls per model call),
    and whether the server counted every call."""
    address = (
        f"127.0.0.1:{grpc_port}" if protocol == "grpc" else server.base.removeprefix("http://")
    )
    calls0, batches0 = counts(server, model)
    args = [protocol, address, model, str(BURST), "1"]
    _process.run_json(HERE / "_grpc_burst.py", args, cores.client, timeout=120)
    calls1, batches1 = counts(server, model)
    calls, batches = calls1 - calls0 - 1, batches1 - batches0 - 1  # the warm-up call, alone
    if calls != BURST:
        print(f"  {model} over {protocol}: {calls} calls counted, {BURST} sent")
    return calls / max(batches, 1), calls == BURST


def closed_loop(
    server: _process.Server, grpc_port: int, protocol: str, args: argparse.Namespace, cores: Any
) -> dict[int, dict[str, float]]:
    """``carpool bench`` over ``protocol`` at each of ``CLIENTS``: req/s and mean batch."""
    if protocol == "grpc":
        target, flags = f"grpc://127.0.0.1:{grpc_port}", ["--model", DEMO]
    else:
        target, flags = None, ["--encoding", "binary"]
    done = _process.carpool_bench(
        server, DEMO, CLIENTS, warmup=args.warmup, duration=args.duration, cpus=cores.client,
        flags=[*flags, "--distinct", "1", "--seed", "0"], target=target,
    )  # fmt: skip
    return {
        row["clients"]: {"rps": row["throughput"], "batch": row["mean_batch"]}
        for row in done.rows()
    }


def measure(args: argparse.Namespace) -> Figures:
    missing = common.missing_modules(NEEDED)
    if missing:
        raise ModuleNotFoundError(f"needs {', '.join(missing)}: pip install -e '.[test]'")
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.warmup, args.duration = (0.3, 0.7) if args.quick else (1.0, 4.0)
    cores = _process.split_cpus(args.cpus)
    _process.pin_self(cores.client)
    common.header("gRPC batching against REST (issue 18, item 4)", {
        "cpus": str(cores), "repeats": args.repeats, "burst": BURST,
        "carpool": str(_process.SRC),
    })  # fmt: skip
    grpc_port = _process.free_port()
    server = start(cores, grpc_port)
    bursts: dict[tuple[str, str], list[float]] = {}
    loops: dict[tuple[str, int, str], list[float]] = {}
    counted = True
    try:
        server.wait_ready()
        for r in range(args.repeats):
            order = list(PROTOCOLS)[:: 1 if r % 2 == 0 else -1]
            for model in BURST_MODELS:
                for protocol in order:
                    mean, all_counted = burst(server, grpc_port, protocol, model, cores)
                    counted = counted and all_counted
                    bursts.setdefault((model, protocol), []).append(mean)
                print(f"  repeat {r + 1}/{args.repeats}  {BURST} calls to {model:10s}  "
                      + "  ".join(f"{PROTOCOLS[p]} mean batch {bursts[model, p][-1]:5.1f}"
                                  for p in PROTOCOLS))  # fmt: skip
            for protocol in order:
                for clients, found in closed_loop(server, grpc_port, protocol, args, cores).items():
                    for key, value in found.items():
                        loops.setdefault((protocol, clients, key), []).append(value)
            print(f"  repeat {r + 1}/{args.repeats}  carpool bench {DEMO}  " + "  ".join(
                f"{PROTOCOLS[p]} {c} clients {loops[p, c, 'rps'][-1]:6.0f} req/s batch "
                f"{loops[p, c, 'batch'][-1]:4.1f}"
                for p in PROTOCOLS for c in CLIENTS))  # fmt: skip
    finally:
        server.stop()
    figures = Figures()
    figures.check("bursts_all_counted", counted)
    figures.update(report(bursts, loops))
    return figures


def report(
    bursts: dict[tuple[str, str], list[float]], loops: dict[tuple[str, int, str], list[float]]
) -> Figures:
    """Both tables; per burst model and per client count, each protocol's mean batch (and
    req/s) and gRPC/REST's ratio, the goals' among them."""
    med = common.median
    figures = Figures()
    print()
    print(f"(a) {BURST} concurrent calls at once (model calls = {BURST} / mean batch)")
    rows = []
    for model in BURST_MODELS:
        g, r = med(bursts[model, "grpc"]), med(bursts[model, "rest"])
        goal = GOALS["burst"] if model == "double" else None
        rows.append([model, f"{BURST / g:.0f}", f"{g:.1f}", f"{BURST / r:.0f}", f"{r:.1f}",
                     f"{g / r:.2f}x", _verdict(g / r, goal)])  # fmt: skip
        figures.add(f"burst_{model}_grpc_mean_batch", g, "rows")
        figures.add(f"burst_{model}_rest_binary_mean_batch", r, "rows")
        _ratio(figures, f"burst_{model}_grpc_over_rest_binary_batch", g / r, goal)
    print(common.table(["model", "gRPC calls", "gRPC batch", "REST calls", "REST batch",
                        "batch gRPC/REST", "goal >= 0.7x"], rows))  # fmt: skip
    print()
    print(f"(b) carpool bench on {DEMO}, gRPC against REST binary")
    rows = []
    for clients in CLIENTS:
        rps = [med(loops[p, clients, "rps"]) for p in PROTOCOLS]
        batch = [med(loops[p, clients, "batch"]) for p in PROTOCOLS]
        big = clients == CLIENTS[-1]
        rows.append([str(clients), f"{rps[0]:.0f}", f"{rps[1]:.0f}", f"{_over(*rps):.2f}x",
                     _verdict(_over(*rps), GOALS["rps64"] if big else None),
                     f"{batch[0]:.1f}", f"{batch[1]:.1f}", f"{_over(*batch):.2f}x",
                     _verdict(_over(*batch), GOALS["batch64"] if big else None)])  # fmt: skip
        for p, value, mean in zip(PROTOCOLS, rps, batch, strict=True):
            figures.add(f"{NAMES[p]}_req_per_s_{clients}", value, "req/s")
            figures.add(f"{NAMES[p]}_mean_batch_{clients}", mean, "rows")
        _ratio(figures, f"grpc_over_rest_binary_req_per_s_{clients}", _over(*rps),
               GOALS["rps64"] if big else None)  # fmt: skip
        _ratio(figures, f"grpc_over_rest_binary_batch_{clients}", _over(*batch),
               GOALS["batch64"] if big else None)  # fmt: skip
    print(common.table(["clients", "gRPC req/s", "REST req/s", "gRPC/REST", "goal >= 0.7x",
                        "gRPC batch", "REST batch", "gRPC/REST", "goal >= 0.8x"],
                       rows))  # fmt: skip
    return figures


def _ratio(figures: Figures, name: str, value: float, goal: float | None) -> None:
    if goal is None:
        figures.add(name, value, "x")
    else:
        figures.at_least(name, value, goal)


def _over(value: float, other: float) -> float:
    """``value / other``; nan when ``other`` is 0 (a quick run's window with no answer)."""
    return value / other if other else float("nan")


def _verdict(value: float, goal: float | None) -> str:
    return "-" if goal is None else common.verdict(value, goal)


def parser() -> argparse.ArgumentParser:
    return common.base_parser(__doc__, default_cpus="0,1", default_repeats=3)


if __name__ == "__main__":
    raise SystemExit(run(measure, parser()))
