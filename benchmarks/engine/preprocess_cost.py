"""What moving minilm's tokenizer into the process workers could buy: its cost per request
against the model's per row (batch 32), for texts of 12, 64 and 200 tokens, in process.

The figure ``preprocess_share_N_tokens`` is the most of a request's CPU that tokenizing
in the workers frees. Results: docs/benchmarks/engine.md."""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.harness import Figures, backends, run
from benchmarks.harness import common as _bench

BATCH = 32
TOKENS = (12, 64, 200)


def per_call_us(fn: Callable[[], Any], calls: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def parser() -> argparse.ArgumentParser:
    return _bench.base_parser(__doc__, default_cpus="0", default_repeats=5)


def measure(args: argparse.Namespace) -> Figures:
    _bench.pin(_bench.parse_cpus(args.cpus))
    import torch

    from carpool.backends.minilm import minilm_model

    torch.set_num_threads(1)
    model = minilm_model()
    repeats = args.repeats or (1 if args.quick else 5)
    calls = 20 if args.quick else 200
    _bench.header("minilm: tokenizing per request vs the model per row", {"repeats": repeats})
    figures = Figures()
    rows = []
    for tokens in TOKENS:
        text = backends.sentence(random.Random(tokens), tokens)
        request = {"TEXT": np.array([[text.encode()]], object)}
        batch = model.preprocess({"TEXT": np.array([[text.encode()]] * BATCH, object)})
        pre, run = [], []
        for _ in range(repeats):
            pre.append(per_call_us(lambda r=request: model.preprocess(r), calls))
            run.append(per_call_us(lambda b=batch: model.fn(b), max(calls // 20, 2)) / BATCH)
        p, m = _bench.median(pre), _bench.median(run)
        rows.append((tokens, f"{p:,.0f}", f"{m:,.0f}", f"{p / (p + m):.3f}"))
        figures.add(f"preprocess_us_{tokens}_tokens", p, "us/request")
        figures.add(f"model_us_per_row_{tokens}_tokens", m, "us/row")
        figures.add(f"preprocess_share_{tokens}_tokens", p / (p + m), "share")
    print(
        _bench.table(
            ["tokens", "preprocess us/request", "model us/row (batch 32)", "preprocess share"],
            rows,
        )
    )
    print("\npreprocess share = the most of a request's CPU that tokenizing in the workers frees")
    return figures


if __name__ == "__main__":
    raise SystemExit(run(measure, parser()))
