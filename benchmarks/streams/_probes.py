"""Single-purpose measurements of carpool's StepBatcher: a lone stream's first output
against the model called directly, carpool's own cost per sequence per step (a model that
costs nothing), and the pace of active streams while a burst of long prompts starts."""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from dataclasses import dataclass
from typing import Any

from benchmarks.streams._models import Prompted, Synthetic, lengths
from benchmarks.streams._systems import jobs
from carpool.bench.report.data import percentile
from carpool.steps.batcher import StepBatcher

__all__ = ["Burst", "Overhead", "burst", "first_output_ms", "own_cost"]


async def first_output_ms(
    batcher: StepBatcher[Any, int], model: Synthetic, rounds: int
) -> tuple[float, float]:
    """Median ms from opening a one-output stream to its output: (carpool, the model called
    directly), alternating, with the batcher idle each time."""
    served, direct = [], []
    for key in range(rounds):
        t = time.perf_counter()
        states = model.start([(key, 1)])
        model.step(states)
        direct.append(time.perf_counter() - t)
        await asyncio.sleep(0.002)  # the lane is back to waiting
        t = time.perf_counter()
        with batcher.stream((key, 1)) as stream:
            await anext(aiter(stream))
            served.append(time.perf_counter() - t)
            await stream.collect()
    return statistics.median(served) * 1000, statistics.median(direct) * 1000


@dataclass
class Overhead:
    us_per_sequence_step: float
    cpu_us_per_sequence_step: float  # the process's CPU time, not the wall's: no neighbours
    sequence_steps: int
    wall_s: float
    model_s: float


def own_cost(clients: int, max_sequences: int, sequences: int, seed: int) -> Overhead:
    """``sequences`` streams of a model that costs nothing, through ``clients`` closed-loop
    clients: (wall time - model time) / sequence-steps, in microseconds; and the same of the
    process's CPU time (what the box's other processes took is not in it)."""
    model = Synthetic(0.0, 0.0)
    source = jobs(lengths(sequences, 64, 512, seed))
    total = sum(lengths(sequences, 64, 512, seed))

    async def main() -> tuple[float, float]:
        async with StepBatcher[Any, int](model, max_sequences=max_sequences) as batcher:
            left = sequences

            async def client() -> None:
                nonlocal left
                while left > 0:
                    left -= 1
                    async for _ in batcher.stream(next(source)):
                        pass

            t, cpu = time.perf_counter(), time.process_time()
            await asyncio.gather(*(client() for _ in range(clients)))
            wall, cpu = time.perf_counter() - t, time.process_time() - cpu
        stats = batcher.stats()  # closed: the last step is counted
        assert stats.outputs == total, (stats.outputs, total)
        return wall, cpu

    wall, cpu = asyncio.run(main())
    own = model.model_seconds
    return Overhead((wall - own) / total * 1e6, (cpu - own) / total * 1e6, total, wall, own)


@dataclass
class Burst:
    p99_before_ms: float
    p99_during_ms: float
    during_s: float

    @property
    def ratio(self) -> float:
        return self.p99_during_ms / self.p99_before_ms


def burst(
    model: Prompted,
    *,
    max_sequences: int,
    step_tokens: int | None,
    active: int,
    arrivals: int,
    prompt: int,
    before_s: float,
) -> Burst:
    """``active`` long streams run for ``before_s``; then ``arrivals`` sequences with
    ``prompt``-token starts come at once. The p99 gap between the active streams' outputs
    before, and while the arrivals start (until the last one's first output)."""

    async def main() -> Burst:
        async with StepBatcher[Any, int](
            model, max_sequences=max_sequences, step_tokens=step_tokens
        ) as b:
            times: list[list[float]] = [[] for _ in range(active)]

            async def read(i: int) -> None:
                async for _ in b.stream((i, 1000, 0)):
                    times[i].append(time.perf_counter())

            readers = [asyncio.create_task(read(i)) for i in range(active)]
            await asyncio.sleep(0.2)  # all aboard and stepping
            t_before = time.perf_counter()
            await asyncio.sleep(before_s)
            t_burst = time.perf_counter()
            news = [b.stream((active + i, 4, prompt)) for i in range(arrivals)]
            for stream in news:
                await anext(aiter(stream))
            t_done = time.perf_counter()
            for stream in news:
                stream.cancel()
            for task in readers:
                task.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
        before, during = [], []
        for ts in times:
            for a, z in itertools.pairwise(ts):
                if t_before <= a and z < t_burst:
                    before.append(z - a)
                elif t_burst <= z <= t_done:
                    during.append(z - a)
        return Burst(percentile(before, 99) * 1000, percentile(during, 99) * 1000, t_done - t_burst)

    return asyncio.run(main())
