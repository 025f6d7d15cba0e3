"""What carpool serve's front end costs: server CPU microseconds per answer over REST JSON,
REST binary, gRPC and /v1/embeddings, by thread, against references doing the least the same
answer needs (orjson+numpy ASGI, bare ASGI, bare grpc.aio) on models that cost nothing.
Goals (issue 18): <= 1.5x, 3x, 1.5x the reference. See docs/benchmarks/protocols.md.
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import Figures, common, run
from benchmarks.harness import frontend_check as _frontend_check
from benchmarks.harness import processes as _process
from benchmarks.harness import thread_cpu as _thread_cpu
from benchmarks.harness.frontend_refs import vectors

NEEDED = ("aiohttp", "orjson", "uvicorn", "grpc", "tritonclient", "numpy")
MODELS, REFS = "benchmarks.harness.frontend_models", "benchmarks.harness.frontend_refs"
CLIENTS = (1, 64)
MODEL, EMBED = "identity", "embed"
SAME_REQUEST = ("--distinct", "1", "--seed", "0")  # the one request the references answer


@dataclass(frozen=True)
class Protocol:
    """One way in: its label and name in figures, the reference it is held to, and the goal
    (None: none)."""

    name: str
    figure: str
    label: str
    reference: str
    goal: float | None


PROTOCOLS = (
    Protocol("json", "rest_json", "REST JSON", "orjson", 1.5),
    Protocol("binary", "rest_binary", "REST binary", "bare", 3.0),
    Protocol("grpc", "grpc", "gRPC (raw tensors)", "grpc", 1.5),
    Protocol("openai", "embeddings", "/v1/embeddings", "orjson", None),
)
REFERENCES = {"bare": "bare ASGI", "orjson": "orjson+numpy ASGI", "grpc": "bare grpc.aio"}


# ------------------------------------------------------------------------------ servers


def start_carpool(cores: _process.Cores, grpc_port: int) -> _process.Server:
    """``carpool serve`` of both models, gRPC on ``grpc_port``."""
    port = _process.free_port()
    argv = [sys.executable, "-m", "carpool", "serve", f"{MODELS}:{MODEL}",
            f"{MODELS}:{EMBED}", "--port", str(port), "--grpc-port", str(grpc_port),
            "--access-log", "false", "--log-level", "warning"]  # fmt: skip
    return _process.Server("carpool serve", argv, port, cores.server, _process.child_env())


def start_references(
    cores: _process.Cores, fixture: Path, grpc_port: int
) -> dict[str, _process.Server]:
    """The two ASGI references under uvicorn and the gRPC one, started (not yet ready)."""
    servers: dict[str, _process.Server] = {}
    for name in ("bare", "orjson"):
        port = _process.free_port()
        argv = [sys.executable, "-m", "uvicorn", "--factory", f"{REFS}:{name}_app",
                "--port", str(port), *_process.UVICORN_FLAGS]  # fmt: skip
        env = _process.child_env(FRONTEND_FIXTURE=str(fixture))
        servers[name] = _process.Server(REFERENCES[name], argv, port, cores.server, env)
    argv = [sys.executable, "-m", REFS, str(grpc_port), str(fixture)]
    servers["grpc"] = _process.Server(
        REFERENCES["grpc"], argv, grpc_port, cores.server, _process.child_env()
    )
    return servers


# ------------------------------------------------------------------------------ runs


@dataclass(frozen=True)
class Run:
    """One bench run against one server: answers per second, and CPU per answer."""

    rps: float
    errors: int
    us_per_request: float
    threads: dict[str, float]  # name -> CPU us per request


def bench(
    server: _process.Server,
    protocol: str,
    grpc_port: int,
    clients: int,
    duration: float,
    cores: _process.Cores,
) -> Run:
    """One ``carpool bench`` run (no warm-up of its own); the server's threads read
    before and after it. ``grpc_port``: the server's gRPC port."""
    targets = {
        "json": (None, ["--encoding", "json"]),
        "binary": (None, ["--encoding", "binary"]),
        "grpc": (f"grpc://127.0.0.1:{grpc_port}", ["--model", MODEL]),
        "openai": (server.base + "/v1/embeddings", ["--model", EMBED, "--encoding", "float"]),
    }
    target, flags = targets[protocol]
    before = _thread_cpu.read(server.pid)
    done = _process.carpool_bench(
        server, MODEL, [clients], warmup=0, duration=duration, cpus=cores.client,
        flags=[*flags, *SAME_REQUEST], target=target,
    )  # fmt: skip
    after = _thread_cpu.read(server.pid)
    (step,) = done.report.steps
    answered = step.throughput_rps * step.duration_s
    used = _thread_cpu.used(before, after) if answered else {}  # no answer: nothing per answer
    threads = {name: seconds * 1e6 / answered for name, seconds in used.items()}
    total = sum(threads.values()) if answered else float("nan")
    return Run(step.throughput_rps, sum(step.errors.values()), total, threads)


def warm_up(
    servers: dict[str, _process.Server], ports: dict[str, int], args: Any, cores: Any
) -> None:
    """A short 64-client run of every protocol on carpool and on its reference."""
    for protocol in args.protocols:
        for name in ("carpool", protocol.reference):
            bench(servers[name], protocol.name, ports[name], CLIENTS[-1], args.warmup, cores)


def load(
    servers: dict[str, _process.Server], ports: dict[str, int], args: Any, cores: Any
) -> dict[tuple[str, int], list[dict[str, Run]]]:
    """Every repeat: each protocol and client count, carpool and its reference in turn."""
    results: dict[tuple[str, int], list[dict[str, Run]]] = {}
    for r in range(args.repeats):
        for protocol in args.protocols:
            for clients in CLIENTS:
                order = ["carpool", protocol.reference][:: 1 if r % 2 == 0 else -1]
                pair = {
                    name: bench(
                        servers[name], protocol.name, ports[name], clients, args.duration, cores
                    )
                    for name in order
                }
                results.setdefault((protocol.name, clients), []).append(pair)
                print(f"  repeat {r + 1}/{args.repeats}  {protocol.label:18s} {clients:2d} "
                      f"clients  " + "  ".join(
                          f"{REFERENCES.get(n, n)} {r.rps:6.0f} req/s {r.us_per_request:5.0f}"
                          f" us/req" + (f" ERRORS {r.errors}" if r.errors else "")
                          for n, r in pair.items()))  # fmt: skip
    return results


# ------------------------------------------------------------------------------ checks


def check(
    servers: dict[str, _process.Server], ports: dict[str, int], sent: Any, args: Any
) -> Figures:
    """Each reference's answer to each protocol's request against carpool's; prints one
    line each. A check per protocol."""
    text = json.loads(sent.embeddings)["input"].encode()
    figures = Figures()
    for protocol in args.protocols:
        expected = vectors(np.array([[text]], object)) if protocol.name == "openai" else sent.data
        got = {
            name: _frontend_check.answer(
                protocol.name, servers[name].base, ports[name], MODEL, sent
            )
            for name in ("carpool", protocol.reference)
        }
        verdict = _frontend_check.compare(
            protocol.name, got[protocol.reference], got["carpool"], expected
        )
        print(f"check {protocol.label} vs {REFERENCES[protocol.reference]}: {verdict}")
        figures.check(f"{protocol.figure}_answers_equal", verdict == "ok")
    return figures


# ------------------------------------------------------------------------------ report


def report(results: dict[tuple[str, int], list[dict[str, Run]]], args: Any) -> Figures:
    """The table (carpool's top threads by median CPU per request) and a line per goal; per
    protocol and client count: req/s and CPU us per request, carpool's and the reference's,
    and their ratio (a goal's where there is one)."""
    med = common.median
    figures = Figures()
    rows, verdicts = [], []
    for protocol in args.protocols:
        ref = protocol.reference
        for clients in CLIENTS:
            pairs = results[(protocol.name, clients)]
            carpool = [p["carpool"] for p in pairs]
            names = {name for r in carpool for name in r.threads}
            threads = {name: med(r.threads.get(name, 0.0) for r in carpool) for name in names}
            busiest = dict(sorted(threads.items(), key=lambda kv: -kv[1]))
            ratio = med(
                p["carpool"].us_per_request / p[ref].us_per_request
                if p[ref].us_per_request
                else float("nan")  # a window with no answer, or under one clock tick
                for p in pairs
            )
            goal = "(information)"
            if protocol.goal is not None:
                goal = f"<= {protocol.goal:g}x: {common.verdict(ratio, protocol.goal, False)}"
                verdicts.append(f"{protocol.label} <= {protocol.goal:g}x {REFERENCES[ref]}, "
                                f"{clients} client{'s' * (clients > 1)}: {ratio:.2f}x "
                                f"[{common.verdict(ratio, protocol.goal, False)}]")  # fmt: skip
            _figures(figures, protocol, clients, pairs, ratio)
            rows.append([
                protocol.label, REFERENCES[ref], clients,
                common.fmt_num(med(r.rps for r in carpool)),
                common.fmt_num(med(p[ref].rps for p in pairs)),
                common.fmt_num(med(r.us_per_request for r in carpool)),
                common.fmt_num(med(p[ref].us_per_request for p in pairs)),
                f"{ratio:.2f}x", goal, sum(r.errors for p in pairs for r in p.values()),
                _thread_cpu.top(busiest, 3, 1.0),
            ])  # fmt: skip
    warm = f"a {args.warmup:g}s warm-up run" if args.warmup else "no warm-up run"
    print(f"\nserver CPU us per request, carpool serve against its reference (medians over "
          f"{args.repeats} repeats; {args.duration:g}s windows after {warm}; closed loop, one "
          "request repeated; req/s and us/req: carpool's, then the reference's)")  # fmt: skip
    headers = ["protocol", "reference", "clients", "req/s", "ref req/s", "us/req",
               "ref us/req", "carpool/ref", "goal", "errors",
               "carpool's top threads, us/req"]  # fmt: skip
    print(common.table(headers, rows, left=2))
    print()
    for line in verdicts:
        print(f"  goal: {line}")
    return figures


def _figures(
    figures: Figures, protocol: Protocol, clients: int, pairs: list[dict[str, Run]], ratio: float
) -> None:
    """One protocol's figures at one client count."""
    med = common.median
    name, ref = f"{protocol.figure}_{{}}_{clients}", protocol.reference
    figures.add(name.format("req_per_s"), med(p["carpool"].rps for p in pairs), "req/s")
    figures.add(name.format("ref_req_per_s"), med(p[ref].rps for p in pairs), "req/s")
    us = med(p["carpool"].us_per_request for p in pairs)
    figures.add(name.format("us_per_request"), us, "us")
    figures.add(name.format("ref_us_per_request"), med(p[ref].us_per_request for p in pairs), "us")
    if protocol.goal is None:
        figures.add(name.format("over_ref"), ratio, "x")
    else:
        figures.at_most(name.format("over_ref"), ratio, protocol.goal)
    errors = sum(r.errors for p in pairs for r in p.values())
    figures.add(name.format("errors"), int(errors))


# ------------------------------------------------------------------------------ main


def measure(args: argparse.Namespace) -> Figures:
    settle(args)
    missing = common.missing_modules(NEEDED)
    if missing:
        raise ModuleNotFoundError(f"{sys.executable} lacks {', '.join(missing)}")
    cores = _process.split_cpus(args.cpus)
    _process.pin_self(cores.client)  # the orchestrator mostly waits: keep it off the servers'
    common.header(
        "carpool serve's front end: server CPU per request against bare references",
        {"cpus": str(cores), "repeats": args.repeats, "clients": ",".join(map(str, CLIENTS))},
    )
    ports = {"carpool": _process.free_port(), "grpc": _process.free_port(), "bare": 0, "orjson": 0}
    servers = {"carpool": start_carpool(cores, ports["carpool"])}
    with tempfile.TemporaryDirectory(prefix="carpool-frontend-") as tmp:
        try:
            servers["carpool"].wait_ready()
            base = servers["carpool"].base
            sent = _frontend_check.requests(base, MODEL, EMBED)
            fixture = Path(tmp) / "recording.pickle"
            recording = _frontend_check.record(base, ports["carpool"], MODEL, sent)
            fixture.write_bytes(pickle.dumps(recording))
            servers.update(start_references(cores, fixture, ports["grpc"]))
            _process.wait_all(s for n, s in servers.items() if n != "grpc")
            wait_grpc(servers["grpc"], ports["grpc"])
            figures = check(servers, ports, sent, args)
            if figures.failed_checks():
                print("frontend_cpu: a reference does not answer as carpool does; not timed")
                return figures
            if not args.quick:
                warm_up(servers, ports, args, cores)
            figures.update(report(load(servers, ports, args, cores), args))
        finally:
            for server in servers.values():
                server.stop()
    return figures


def wait_grpc(server: _process.Server, port: int, timeout: float = _process.READY_S) -> None:
    """Until the gRPC reference accepts a connection; ``RuntimeError`` if it exits."""
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise RuntimeError(f"{server.name} not ready:\n{server.tail()}") from None


def parser() -> argparse.ArgumentParser:
    p = common.base_parser(__doc__, default_cpus="0,1", default_repeats=3)
    p.add_argument("--duration", type=float, default=None, help="measured s per run (3)")
    p.add_argument(
        "--protocols",
        default=",".join(p.name for p in PROTOCOLS),
        help="which to measure, comma-separated (all: %(default)s)",
    )
    return p


def settle(args: argparse.Namespace) -> None:
    """``--protocols`` parsed, and the defaults that depend on ``--quick``."""
    wanted = args.protocols.split(",")
    unknown = set(wanted) - {p.name for p in PROTOCOLS}
    if unknown:
        raise ValueError(f"--protocols: unknown {sorted(unknown)}; choose from the default")
    args.protocols = tuple(p for p in PROTOCOLS if p.name in wanted)
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.duration = args.duration or (0.3 if args.quick else 3.0)
    args.warmup = 0.0 if args.quick else 1.0


if __name__ == "__main__":
    raise SystemExit(run(measure, parser()))
