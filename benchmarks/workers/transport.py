"""Round trip of a batch through a process worker, no model work: 32x512 FP32 and minilm.

Beside them, in the same run: the pipe's floor (a header-sized ping-pong with a spawned
process) and the copies alone (the same encode/decode in one process, no pipe).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from benchmarks.harness import Figures, common, run
from carpool.bench.report.data import percentile
from carpool.ipc.transport import Arena, Channel, decode, lay_out
from carpool.runners.processes import ProcessReplicas

EMBEDDING = np.random.default_rng(0).standard_normal((32, 384)).astype(np.float32)


def echo(batch: Any) -> Any:
    """The batch back: the worker still decodes it and writes it to its output arena."""
    return batch


def embed(batch: dict[str, np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
    """A minilm-shaped answer (32x384 FP32) for a tokenized batch, computed ahead."""
    return EMBEDDING[: len(batch["input_ids"])]


def _pong(ends: tuple[Connection, Connection]) -> None:
    channel = Channel(*ends)
    while (message := channel.receive()) != "stop":
        channel.send(message)


def timed(fn: Callable[[], Any], calls: int) -> list[float]:
    """Per-call seconds of ``calls`` calls, after a few untimed ones."""
    for _ in range(20):
        fn()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def pipe_floor(calls: int) -> list[float]:
    """A small message to a spawned process and back over the pool's own channel."""
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = Channel.pair(ctx)
    child = ctx.Process(target=_pong, args=(theirs,), daemon=True)
    child.start()
    message = ("run", ("psm_0123456789", (0, "<f4", (32, 512), 0)), "psm_9876543210")

    def ping() -> None:
        ours.send(message)
        ours.receive()

    try:
        return timed(ping, calls)
    finally:
        ours.send("stop")
        child.join()
        ours.close()


def copies(batch: Any, output: Any, calls: int) -> list[float]:
    """Encode + decode the input and the output in one process, as the round trip does."""
    inputs, outputs = Arena(), Arena()

    def once() -> None:
        laid = lay_out(batch)
        inputs.fit(laid.nbytes)
        laid.write(inputs.buf)
        decode(laid.tree, inputs.buf)
        back = lay_out(output)
        outputs.fit(back.nbytes)
        back.write(outputs.buf)
        decode(back.tree, outputs.buf, copy=True)

    try:
        return timed(once, calls)
    finally:
        inputs.close()
        outputs.close()


def through_pool(spec: Callable[[Any], Any], batch: Any, calls: int) -> list[float]:
    with ProcessReplicas(spec, 1, name="transport") as pool:
        return timed(lambda: pool.call(batch), calls)


CASES = {  # figure prefix: the case's row in the table
    "pipe_floor": "pipe floor (header ping-pong)",
    "copies_dense": "copies 32x512 FP32, no pipe",
    "dense_round_trip": "32x512 FP32 round trip",
    "copies_minilm": "copies minilm, no pipe",
    "minilm_round_trip": "minilm round trip",
}


def parser() -> argparse.ArgumentParser:
    return common.base_parser(__doc__, default_cpus="none", default_repeats=3)


def measure(args: argparse.Namespace) -> Figures:
    """Each case's median and p90 microseconds (medians over repeats); goal: the 32x512
    FP32 round trip <= 100 us."""
    repeats = args.repeats or (1 if args.quick else 3)
    calls = 300 if args.quick else 3000
    pinned = common.pin(common.parse_cpus(args.cpus))
    common.header(
        "process worker transport",
        {"cpus": pinned, "load": f"{os.getloadavg()[0]:.1f}", "calls": calls, "repeats": repeats},
    )

    dense = np.random.default_rng(1).standard_normal((32, 512)).astype(np.float32)
    ids = np.random.default_rng(2).integers(0, 30522, (32, 64), dtype=np.int64)
    tokens = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    cases: dict[str, Callable[[], list[float]]] = {
        "pipe_floor": lambda: pipe_floor(calls),
        "copies_dense": lambda: copies(dense, dense, calls),
        "dense_round_trip": lambda: through_pool(echo, dense, calls),
        "copies_minilm": lambda: copies(tokens, EMBEDDING, calls),
        "minilm_round_trip": lambda: through_pool(embed, tokens, calls),
    }
    results: dict[str, tuple[float, float]] = {}
    for name, timings in cases.items():
        medians, p90s = [], []
        for _ in range(repeats):
            times = timings()
            medians.append(common.median(times) * 1e6)
            p90s.append(percentile(times, 90) * 1e6)
        results[name] = (common.median(medians), common.median(p90s))
    print(
        common.table(
            ["case", "median us", "p90 us"],
            [
                (CASES[n], common.fmt_num(m, 1), common.fmt_num(q, 1))
                for n, (m, q) in results.items()
            ],
        )
    )
    figures = Figures()
    for name, (med, p90) in results.items():
        if name == "dense_round_trip":
            figures.at_most(f"{name}_us", med, 100.0, "us")
        else:
            figures.add(f"{name}_us", med, "us")
        figures.add(f"{name}_p90_us", p90, "us")
    dense_above = results["dense_round_trip"][0] - results["pipe_floor"][0]
    figures.add("dense_round_trip_above_floor_us", dense_above, "us")
    return figures


if __name__ == "__main__":
    raise SystemExit(run(measure, parser()))
