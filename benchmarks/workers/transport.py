"""Round-trip cost of a batch through a process worker, with no model work.

What: ``ProcessReplicas.call`` on a model that returns its input (or a fixed output), so that
all that is timed is the transfer: the parent writes the batch into the worker's shared
memory and sends a header; the worker decodes views, writes the same-size output into its
output arena and answers; the parent copies the output out. Two batches:

``32x512 FP32``  one 64 KiB tensor in, the same back (goal: median <= 100 us)
``minilm``       a dict of int64 ``input_ids``/``attention_mask`` 32x64 in, FP32 32x384 out

Beside them, measured in the same run: ``pipe floor``, a header-sized message to a spawned
process and back over the same channel (two wake-ups: no transport can beat it), and
``copies``, the same encode/decode work in one process with no pipe (what the data costs).

Why: process workers are only worth having if the boundary costs almost nothing next to a
model call; this separates the boundary's cost from the machine's wake-up latency.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import _bench  # before numpy: sets single-thread BLAS env vars
import numpy as np

_bench.import_carpool()

from carpool.bench.report.data import percentile  # noqa: E402
from carpool.ipc.transport import Arena, Channel, decode, lay_out  # noqa: E402
from carpool.runners.processes import ProcessReplicas  # noqa: E402

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


def main() -> None:
    p = _bench.base_parser(__doc__, default_cpus="none", default_repeats=3)
    args = p.parse_args()
    repeats = args.repeats or (1 if args.quick else 3)
    calls = 300 if args.quick else 3000
    pinned = _bench.pin(_bench.parse_cpus(args.cpus))
    _bench.header(
        "process worker transport",
        {"cpus": pinned, "load": f"{os.getloadavg()[0]:.1f}", "calls": calls, "repeats": repeats},
    )

    dense = np.random.default_rng(1).standard_normal((32, 512)).astype(np.float32)
    ids = np.random.default_rng(2).integers(0, 30522, (32, 64), dtype=np.int64)
    tokens = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    cases: list[tuple[str, Callable[[], list[float]]]] = [
        ("pipe floor (header ping-pong)", lambda: pipe_floor(calls)),
        ("copies 32x512 FP32, no pipe", lambda: copies(dense, dense, calls)),
        ("32x512 FP32 round trip", lambda: through_pool(echo, dense, calls)),
        ("copies minilm, no pipe", lambda: copies(tokens, EMBEDDING, calls)),
        ("minilm round trip", lambda: through_pool(embed, tokens, calls)),
    ]
    results: dict[str, tuple[float, float]] = {}
    for name, run in cases:
        medians, p90s = [], []
        for _ in range(repeats):
            times = run()
            medians.append(_bench.median(times) * 1e6)
            p90s.append(percentile(times, 90) * 1e6)
        results[name] = (_bench.median(medians), _bench.median(p90s))
    print(
        _bench.table(
            ["case", "median us", "p90 us"],
            [(n, _bench.fmt_num(m, 1), _bench.fmt_num(q, 1)) for n, (m, q) in results.items()],
        )
    )
    dense_us = results["32x512 FP32 round trip"][0]
    floor_us = results["pipe floor (header ping-pong)"][0]
    print()
    print(
        f"32x512 FP32 round trip = {dense_us:.1f} us (goal <= 100 us: "
        f"{_bench.verdict(dense_us, 100.0, higher_is_better=False)}); "
        f"above the pipe floor: {dense_us - floor_us:.1f} us"
    )
    print(f"minilm round trip = {results['minilm round trip'][0]:.1f} us")


if __name__ == "__main__":
    main()
