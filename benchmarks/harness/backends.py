"""Helpers for ``benchmarks.engine.cpu_backends`` and its offline worker (``offline.py``),
so both see the same seeded weights and texts: the models' files and folders, the text
sets and the padding simulation. Pure Python and numpy, except :func:`write_mlp_onnx`
(needs ``onnx``).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

MLP_NAME = "mlp"
MLP_DIMS = (512, 2048, 2048, 512)
MLP_INPUT, MLP_OUTPUT = "INPUT0", "OUTPUT0"
MINILM_NAME = "minilm"
BUCKETS = (16, 32, 64, 128, 256)  # minilm_model's length buckets until it sorted by length

# Common English words, each ONE WordPiece token in all-MiniLM-L6-v2's vocabulary (checked
# by the benchmark: it reports the token counts it actually got), so a sentence of n words
# plus a full stop is n + 3 tokens with [CLS] and [SEP].
_WORDS = """
the a an of to in and for on with at by from about into over after under between through
model server request batch queue token cloud data network signal system people city river
market time year day week night morning water light sound music story book paper letter
house road car train plane ship bridge garden forest mountain field village window door
table chair kitchen school teacher student doctor driver farmer writer artist engineer runs
walks reads writes builds sends finds keeps opens closes moves shows brings holds turns starts
stops waits grows falls quick slow small large old new bright dark warm cold quiet loud early
late simple clear heavy green red blue yellow strong soft fast long short high low near far
every many some other first last next
"""
WORDS = _WORDS.split()


# ---------------------------------------------------------------------------------------
# Models on disk
# ---------------------------------------------------------------------------------------
def write_mlp_onnx(path: Path, dims: Sequence[int] = MLP_DIMS, seed: int = 0) -> Path:
    """An ONNX MLP (MatMul + Add, Relu between layers), float32, seeded weights, dynamic
    batch axis: INPUT0 [batch, dims[0]] -> OUTPUT0 [batch, dims[-1]]."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    current = MLP_INPUT
    layers = list(itertools.pairwise(dims))
    for i, (n_in, n_out) in enumerate(layers):
        w = (rng.standard_normal((n_in, n_out)) / math.sqrt(n_in)).astype(np.float32)
        b = (0.01 * rng.standard_normal(n_out)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        last = i == len(layers) - 1
        nodes.append(helper.make_node("MatMul", [current, f"w{i}"], [f"mm{i}"]))
        added = MLP_OUTPUT if last else f"add{i}"
        nodes.append(helper.make_node("Add", [f"mm{i}", f"b{i}"], [added]))
        if not last:
            nodes.append(helper.make_node("Relu", [added], [f"relu{i}"]))
            current = f"relu{i}"
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info(MLP_INPUT, TensorProto.FLOAT, ["batch", dims[0]])],
        [helper.make_tensor_value_info(MLP_OUTPUT, TensorProto.FLOAT, ["batch", dims[-1]])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # readable by any onnxruntime >= 1.10
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def write_mlp_repository(root: Path, onnx_file: Path) -> Path:
    """``root/mlp/model.onnx`` (a hard link or copy of ``onnx_file``) and a ``carpool.toml``
    that makes the onnxruntime session single-threaded."""
    folder = root / MLP_NAME
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "model.onnx"
    try:
        target.hardlink_to(onnx_file)
    except OSError:
        target.write_bytes(onnx_file.read_bytes())
    (folder / "carpool.toml").write_text("[onnx]\nintra_op_threads = 1\ninter_op_threads = 1\n")
    return root


def write_minilm_repository(root: Path) -> Path:
    """``root/minilm/model.py``: the built-in minilm (its default engine) on one thread."""
    folder = root / MINILM_NAME
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(
        "from carpool.backends.minilm import minilm_model\n\nmodel = minilm_model(threads=1)\n"
    )
    return root


# ---------------------------------------------------------------------------------------
# Text sets
# ---------------------------------------------------------------------------------------
def sentence(rng: random.Random, tokens: int) -> str:
    """A sentence of about ``tokens`` tokens, [CLS] and [SEP] included (at least 5)."""
    words = [rng.choice(WORDS) for _ in range(max(2, tokens - 3))]
    return " ".join(words).capitalize() + "."


def short_texts(n: int = 64, tokens: int = 12, seed: int = 1) -> list[str]:
    """``n`` distinct short sentences of ``tokens`` tokens each."""
    rng = random.Random(seed)
    return [sentence(rng, tokens) for _ in range(n)]


def write_strings(path: Path, texts: Sequence[str]) -> Path:
    """One text per line: ``carpool bench --strings`` sends them as BYTES elements, cycled."""
    path.write_text("".join(f"{t}\n" for t in texts))
    return path


def mixed_texts(n: int, lo: int = 5, hi: int = 250, seed: int = 2) -> list[str]:
    """``n`` sentences, lengths log-uniform over ``lo..hi`` tokens, in arrival order."""
    rng = random.Random(seed)
    return [
        sentence(rng, round(math.exp(rng.uniform(math.log(lo), math.log(hi))))) for _ in range(n)
    ]


# ---------------------------------------------------------------------------------------
# Padding simulation
# ---------------------------------------------------------------------------------------
def plan_batches(
    lengths: Sequence[int], batch: int, bucket: Callable[[int], int] | None = None
) -> list[list[int]]:
    """Indices of ``lengths`` (arrival order) cut into batches of at most ``batch``: in
    arrival order (``bucket=None``), or within each length bucket in arrival order."""
    if bucket is None:
        return [list(range(i, min(i + batch, len(lengths)))) for i in range(0, len(lengths), batch)]
    groups: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        groups.setdefault(bucket(n), []).append(i)
    plan = []
    for key in sorted(groups):
        members = groups[key]
        plan += [members[i : i + batch] for i in range(0, len(members), batch)]
    return plan


def padded_tokens(lengths: Sequence[int], plan: Sequence[Sequence[int]]) -> int:
    """Tokens the model computes on: each batch padded to its longest row."""
    return sum(len(b) * max(lengths[i] for i in b) for b in plan)


def pad_batch(ids: Sequence[Sequence[int]], pad_id: int = 0) -> dict[str, Any]:
    """``input_ids`` and ``attention_mask`` for token-id rows padded to the longest."""
    import numpy as np

    width = max(len(r) for r in ids)
    input_ids = np.full((len(ids), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(ids), width), dtype=np.int64)
    for k, row in enumerate(ids):
        input_ids[k, : len(row)] = row
        mask[k, : len(row)] = 1
    return {"input_ids": input_ids, "attention_mask": mask}
