"""``carpool serve --frontends N``: CPU per request of the main process and of the front ends
(``/proc``), req/s and mean batch for each N, REST binary and gRPC on a free model, open loop
on a 2 ms one; the main process's share caps a larger host (4, 8, 16 cores). Goals: issue 18.

    python -m benchmarks.server.frontends [--quick] [--frontends 1,2,4 --server-cpus 0-11 ...]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.harness import Figures, common, run
from benchmarks.harness import processes as _process
from benchmarks.harness import thread_cpu as _thread_cpu

MODEL = "identity"
SAME_REQUEST = ("--distinct", "1", "--seed", "0")
PROTOCOLS = {"binary": "REST binary", "grpc": "gRPC", "model2ms": "REST, 2 ms model, open loop"}
FIGURE = {"binary": "rest_binary", "grpc": "grpc", "model2ms": "rest_2ms_open_loop"}
SLOW = "double_2ms"  # grpc_models: 2 ms a batch, 32 rows at most: batching matters
PROJECTED_CORES = (4, 8, 16)
MAIN_GOAL_US = 15.0
BATCH_GOAL = 0.9


def start(frontends: int, cpus: frozenset[int] | None, grpc_port: int) -> _process.Server:
    port = _process.free_port()
    argv = [sys.executable, "-m", "carpool", "serve",
            f"benchmarks.harness.frontend_models:{MODEL}", f"benchmarks.harness.grpc_models:{SLOW}",
            "--port", str(port), "--grpc-port", str(grpc_port),
            "--frontends", str(frontends),
            "--access-log", "false", "--log-level", "warning"]  # fmt: skip
    return _process.Server(f"--frontends {frontends}", argv, port, cpus, _process.child_env())


@dataclass(frozen=True)
class Run:
    rps: float
    p50_ms: float
    mean_batch: float
    errors: int
    main_us: float  # the main process, every thread, per request
    frontends_us: float  # every front-end process (and the zygote) together, per request


def bench(server: _process.Server, protocol: str, grpc_port: int, args: Any) -> Run:
    target = f"grpc://127.0.0.1:{grpc_port}" if protocol == "grpc" else None
    flags = ["--model", MODEL] if protocol == "grpc" else ["--encoding", "binary"]
    model = SLOW if protocol == "model2ms" else MODEL
    flags += ["--client-processes", str(args.client_processes), *SAME_REQUEST]
    before = _thread_cpu.read(server.pid)
    done = _process.carpool_bench(
        server, model, [args.clients], warmup=0, duration=args.duration,
        cpus=args.client_cpus, flags=flags, target=target,
        rate=args.rate if protocol == "model2ms" else None,
    )  # fmt: skip
    after = _thread_cpu.read(server.pid)
    (step,) = done.report.steps
    answered = step.throughput_rps * step.duration_s or float("nan")
    main = others = 0.0
    for name, seconds in _thread_cpu.used(before, after).items():
        if "/" in name:  # a thread of a child process: a front end, the zygote, a tracker
            others += seconds
        else:
            main += seconds
    batch = step.server.batch_size_mean if step.server else float("nan")
    errors = sum(step.errors.values())
    p50 = step.latency.p50 if step.latency else float("nan")
    per = 1e6 / answered
    return Run(step.throughput_rps, p50, batch, errors, main * per, others * per)


def run_settings(args: Any) -> dict[tuple[str, int], list[Run]]:
    results: dict[tuple[str, int], list[Run]] = {}
    ports = {n: _process.free_port() for n in args.frontends}
    servers = {n: start(n, args.server_cpus, ports[n]) for n in args.frontends}
    try:
        _process.wait_all(servers.values())
        for n, server in servers.items():  # warm-up: every setting, every protocol
            for protocol in args.protocols:
                if not args.quick:
                    bench(server, protocol, ports[n], _short(args))
        for r in range(args.repeats):
            order = args.frontends if r % 2 == 0 else args.frontends[::-1]
            for protocol in args.protocols:
                for n in order:
                    one = bench(servers[n], protocol, ports[n], args)
                    results.setdefault((protocol, n), []).append(one)
                    errors = f"  ERRORS {one.errors}" if one.errors else ""
                    print(f"  repeat {r + 1}/{args.repeats}  {PROTOCOLS[protocol]:11s} "
                          f"--frontends {n:<2d} {one.rps:7.0f} req/s  batch {one.mean_batch:5.1f}"
                          f"  main {one.main_us:5.1f} us/req  front ends {one.frontends_us:6.1f}"
                          f" us/req{errors}")  # fmt: skip
    finally:
        for server in servers.values():
            server.stop()
    return results


def _short(args: Any) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), "duration": 1.0})


def _median(runs: Sequence[Run], field: str) -> float:
    return common.median(getattr(one, field) for one in runs)


def report(results: dict[tuple[str, int], list[Run]], args: Any) -> Figures:
    """Each protocol's table (medians), and its figures and goals."""
    figures = Figures()
    most = max(args.frontends)
    for protocol in args.protocols:
        load = f"{args.rate:g} req/s" if protocol == "model2ms" else f"{args.clients} clients"
        print(f"\n{PROTOCOLS[protocol]}, {load} (medians of {args.repeats}):")
        stem = FIGURE[protocol]
        rows = []
        for n in args.frontends:
            runs = results[(protocol, n)]
            main, fes = _median(runs, "main_us"), _median(runs, "frontends_us")
            share = fes / (main + fes) if main + fes else float("nan")
            projected = [_projection(main, fes, n, cores) for cores in PROJECTED_CORES]
            rows.append([f"--frontends {n}", common.fmt_num(_median(runs, "rps")),
                         f"{_median(runs, 'p50_ms'):.2f}", f"{_median(runs, 'mean_batch'):.1f}",
                         f"{main:.1f}", f"{fes:.1f}",
                         f"{share:.0%}", common.fmt_num(1e6 / main if main else float("nan")),
                         *(common.fmt_num(p) for p in projected)])  # fmt: skip
            at = f"frontends_{n}"
            figures.add(f"{stem}_req_per_s_{at}", _median(runs, "rps"), "req/s")
            figures.add(f"{stem}_p50_ms_{at}", _median(runs, "p50_ms"), "ms")
            figures.add(f"{stem}_mean_batch_{at}", _median(runs, "mean_batch"), "rows")
            if n == most and most > 1:
                figures.at_most(f"{stem}_main_us_{at}", main, MAIN_GOAL_US, "us")
                figures.add(f"{stem}_frontends_us_{at}", fes, "us")
                figures.at_least(f"{stem}_frontends_share_{at}", share, 0.5, "")
            else:
                figures.add(f"{stem}_main_us_{at}", main, "us")
                figures.add(f"{stem}_frontends_us_{at}", fes, "us")
            figures.add(f"{stem}_errors_{at}", sum(one.errors for one in runs), "requests")
        print(common.table(
            ["setting", "req/s", "p50 ms", "mean batch", "main us/req", "front ends us/req",
             "front ends' share", "main's ceiling req/s",
             *(f"{c} cores req/s" for c in PROJECTED_CORES)], rows))  # fmt: skip
        if 1 in args.frontends and 2 in args.frontends:
            one = _median(results[(protocol, 1)], "mean_batch")
            two = _median(results[(protocol, 2)], "mean_batch")
            ratio = two / one if one else float("nan")
            figures.at_least(f"{stem}_mean_batch_2_over_1", ratio, BATCH_GOAL)
    return figures


def _projection(main_us: float, frontends_us: float, frontends: int, cores: int) -> float:
    """req/s on ``cores`` cores: the main process on one, front ends on the rest; with one
    process (no front ends), that process is the whole server, on one core."""
    if frontends == 1 or not frontends_us:
        return 1e6 / main_us if main_us else float("nan")
    return min(1e6 / main_us, (cores - 1) * 1e6 / frontends_us)


def _show(cpus: frozenset[int] | None) -> str:
    return "any" if not cpus else ",".join(map(str, sorted(cpus)))


def parser() -> argparse.ArgumentParser:
    p = common.base_parser(__doc__, default_cpus="0,1", default_repeats=3)
    p.add_argument("--frontends", default="1,2", help="settings to compare (%(default)s)")
    p.add_argument("--server-cpus", default=None, help="the server's CPUs (lowest of --cpus)")
    p.add_argument("--client-cpus", default=None, help="the load's CPUs (highest of --cpus)")
    p.add_argument("--clients", type=int, default=64, help="closed-loop callers (64)")
    p.add_argument("--client-processes", type=int, default=1, help="load processes (1)")
    p.add_argument("--rate", type=float, default=2000, help="the 2 ms model's req/s (2000)")
    p.add_argument("--protocols", default=",".join(PROTOCOLS), help="which to run (%(default)s)")
    p.add_argument("--duration", type=float, default=None, help="measured s per run (3)")
    return p


def measure(args: argparse.Namespace) -> Figures:
    cores = _process.split_cpus(args.cpus)
    args.server_cpus = frozenset(common.parse_cpus(args.server_cpus) or ()) or cores.server
    args.client_cpus = frozenset(common.parse_cpus(args.client_cpus) or ()) or cores.client
    args.frontends = [int(n) for n in args.frontends.split(",")]
    args.protocols = [name for name in args.protocols.split(",") if name]
    unknown = set(args.protocols) - set(PROTOCOLS)
    if unknown:
        raise ValueError(
            f"--protocols {', '.join(sorted(unknown))}: choose from {', '.join(PROTOCOLS)}"
        )
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.duration = args.duration or (0.3 if args.quick else 3.0)
    missing = common.missing_modules(("aiohttp", "uvicorn", "grpc", "tritonclient", "numpy"))
    if missing:
        raise ModuleNotFoundError(f"{sys.executable} lacks {', '.join(missing)}")
    _process.pin_self(args.client_cpus)
    common.header(
        "carpool serve --frontends N: CPU per request by process, batches, projection",
        {"cpus": args.cpus, "server cpus": _show(args.server_cpus),
         "client cpus": _show(args.client_cpus),
         "clients": args.clients, "client processes": args.client_processes,
         "repeats": args.repeats, "frontends": ",".join(map(str, args.frontends))},
    )  # fmt: skip
    return report(run_settings(args), args)


if __name__ == "__main__":
    raise SystemExit(run(measure, parser()))
