"""Latency at low load: one caller at a time, the model direct vs through a batcher.

Per model (sleep, numpy MLP, minilm) the latency of a direct call, ``infer`` (eager),
``submit`` and ``fixed``. Goal: eager <= the direct call + 0.5 ms (minilm: + 1 ms).
Method and results: docs/benchmarks/engine.md."""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.harness import Figures, models, run, texts
from benchmarks.harness import common as _bench
from carpool.backends.minilm import ENGINE_ENV, ENGINES, check_engine
from carpool.bench.callers import closed_requests
from carpool.bench.report.data import percentile

MAX_BATCH = 32
# The eager target per model: the batcher's cost over a direct call, ms.
TARGETS_MS = {"sleep": 0.5, "mlp": 0.5, "minilm": 1.0}


@dataclass
class Subject:
    """One model as each variant calls it, doing the same work per request."""

    direct: Callable[[], Any]  # the unbatched call
    batcher: Callable[..., Any]  # a carpool.Batcher from its options
    infer: Callable[[Any], Awaitable[Any]]  # one request through a running batcher
    submit: Callable[[Any], Future[Any]]  # the same, from a thread
    about: str = ""  # for the header


def array_subject(carpool: Any, model: Any, row: np.ndarray) -> Subject:
    """``sleep`` and ``mlp``: a float row, ``carpool.Batcher(model)``."""
    batch = np.stack([row])
    return Subject(
        direct=lambda: model(batch),
        batcher=lambda **kw: carpool.Batcher(model, max_batch_size=MAX_BATCH, **kw),
        infer=lambda b: b.infer(row),
        submit=lambda b: b.submit(row),
    )


def minilm_subject(engine: str | None) -> Subject:
    """``minilm``: one short text, tokenized per request by the model's preprocess."""
    from carpool.backends.minilm import minilm_model

    engine = check_engine(engine or os.environ.get(ENGINE_ENV) or None, where=ENGINE_ENV)
    model = minilm_model(threads=1, engine=engine)
    text = texts.texts("short", 1)[0]
    inputs = {"TEXT": np.array([[text.encode()]], dtype=object)}
    preprocess = model.preprocess
    assert preprocess is not None
    call = model.batched_fn()
    tokens = preprocess(inputs)["attention_mask"].shape[1]

    def one_row(b: Any) -> Future[Any]:
        return b.submit({k: v[0] for k, v in preprocess(inputs).items()})

    return Subject(
        direct=lambda: call(preprocess(inputs)),
        batcher=model.batcher,
        infer=lambda b: b.infer_many(preprocess(inputs)),
        submit=one_row,
        about=f"engine {engine}, {len(text.split())} words, {tokens} tokens",
    )


def time_direct(subject: Subject, n: int) -> list[float]:
    subject.direct()
    out = []
    for _ in range(n):
        t0 = _bench.now()
        subject.direct()
        out.append(_bench.now() - t0)
    return out


async def time_infer(subject: Subject, n: int, warm: int, **kw: Any) -> list[float]:
    """Latencies of ``n`` requests from one caller, each sent when the last is answered."""
    async with subject.batcher(**kw) as b:

        async def send(i: int) -> None:
            await subject.infer(b)

        await closed_requests(send, callers=1, requests=warm)
        tally, _ = await closed_requests(send, callers=1, requests=n)
    return tally.latencies


def time_submit(subject: Subject, n: int, warm: int, **kw: Any) -> list[float]:
    out = []
    with subject.batcher(**kw) as b:
        for _ in range(warm):
            subject.submit(b).result()
        for _ in range(n):
            t0 = _bench.now()
            subject.submit(b).result()
            out.append(_bench.now() - t0)
    return out


def parser() -> argparse.ArgumentParser:
    p = _bench.base_parser(__doc__, default_cpus="0")
    p.add_argument("--models", default="sleep,mlp", help="of sleep, mlp, minilm")
    p.add_argument(
        "--minilm-engine",
        choices=ENGINES,
        default=None,
        help="minilm's engine (default: the model's own)",
    )
    return p


def measure(args: argparse.Namespace) -> Figures:
    names = args.models.split(",")
    unknown = sorted(set(names) - set(TARGETS_MS))
    if unknown:
        raise ValueError(f"unknown models {unknown}; known: {', '.join(TARGETS_MS)}")

    cpus = _bench.parse_cpus(args.cpus)
    pinned = _bench.pin(cpus)
    carpool = _bench.import_carpool()
    repeats = args.repeats or (1 if args.quick else 5)
    n = 40 if args.quick else 300
    n_fixed = 20 if args.quick else 100
    warm = 5 if args.quick else 30
    row = models.make_rows(1)[0]
    makers: dict[str, Callable[[], Subject]] = {
        "sleep": lambda: array_subject(carpool, models.sleep_model, row),
        "mlp": lambda: array_subject(carpool, models.MLP(), row),
        "minilm": lambda: minilm_subject(args.minilm_engine),
    }
    subjects = {m: makers[m]() for m in names}
    variants = ["model", "eager", "submit", "fixed"]
    width = max(5, *(len(m) for m in names))

    _bench.header(
        "carpool low-load latency: one caller, sequential requests",
        {
            "cpus": pinned,
            "blas": models.blas_info(),
            "samples": f"{n} ({n_fixed} for fixed) x {repeats} repeats",
            "max_batch_size": MAX_BATCH,
            **{m: f"({s.about})" for m, s in subjects.items() if s.about},
        },
    )

    med: dict[tuple[str, str], list[float]] = {(m, v): [] for m in names for v in variants}
    allv: dict[tuple[str, str], list[float]] = {(m, v): [] for m in names for v in variants}
    for r in range(repeats):
        for m in names:
            for v in variants:
                gc.collect()
                xs = latencies(subjects[m], v, n, n_fixed, warm)
                med[(m, v)].append(_bench.median(xs))
                allv[(m, v)].extend(xs)
                ms = _bench.median(xs) * 1e3
                print(
                    f"  repeat {r + 1}/{repeats}  {m:{width}s} {v:6s} median {ms:8.3f} ms",
                    flush=True,
                )
    print()
    return report(names, variants, med, allv)


def latencies(subject: Subject, variant: str, n: int, n_fixed: int, warm: int) -> list[float]:
    """One variant's latencies, s."""
    if variant == "model":
        return time_direct(subject, n)
    if variant == "eager":
        return asyncio.run(time_infer(subject, n, warm, policy="eager"))
    if variant == "submit":
        return time_submit(subject, n, warm, policy="eager")
    return asyncio.run(time_infer(subject, n_fixed, 3, policy="fixed", max_wait_ms=5.0))


def report(
    names: list[str],
    variants: list[str],
    med: dict[tuple[str, str], list[float]],
    allv: dict[tuple[str, str], list[float]],
) -> Figures:
    """The table (medians over repeats, p90 over all samples) and the eager target."""
    figures = Figures()
    rows = []
    summary = []
    for m in names:
        base = _bench.median(med[(m, "model")])
        for v in variants:
            mm = _bench.median(med[(m, v)])
            p90 = percentile(allv[(m, v)], 90)
            over = (mm - base) * 1e3
            figures.add(f"{m}_{v}_median_ms", mm * 1e3, "ms")
            figures.add(f"{m}_{v}_p90_ms", p90 * 1e3, "ms")
            rows.append(
                [
                    m,
                    v,
                    f"{mm * 1e3:.3f}",
                    f"{p90 * 1e3:.3f}",
                    "" if v == "model" else f"{over:+.3f}",
                ]
            )
        eager = _bench.median(med[(m, "eager")])
        eager_over = (eager - base) * 1e3
        target = TARGETS_MS[m]
        figures.at_most(f"{m}_eager_over_model_ms", eager_over, target, "ms")
        ok = _bench.verdict(eager_over, target, higher_is_better=False)
        summary.append(
            f"  {m}: model {base * 1e3:.3f} ms, eager {eager * 1e3:.3f} ms, "
            f"eager overhead {eager_over:+.3f} ms (target <= +{target:g} ms: {ok})"
        )
    print(_bench.table(["model", "variant", "median ms", "p90 ms", "vs model ms"], rows))
    print()
    print("\n".join(summary))
    return figures


if __name__ == "__main__":
    raise SystemExit(run(measure, parser()))
