"""Streams given up at random points (seeded): before any output, after some (``break`` in
``with stream:``), by dropping the stream, or by cancelling the task that reads it; every
slot must come free and every stream's outputs must be exactly its own, in order."""

from __future__ import annotations

import asyncio
import gc
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from benchmarks.streams._models import Synthetic, expected, lengths
from carpool.steps.batcher import StepBatcher

WAYS = ("read_all", "cancel_at_once", "break_after", "drop_after", "cancel_task")


@dataclass
class Outcome:
    exact: bool
    slots_freed: bool
    counts_add_up: bool
    ways: Counter[str] = field(default_factory=Counter)


def cancellations(streams: int, concurrent: int, max_sequences: int, seed: int) -> Outcome:
    """``streams`` streams, ``concurrent`` at a time, each given up one of WAYS (seeded)."""
    rng = random.Random(seed)
    sizes = lengths(streams, 16, 512, seed)
    model = Synthetic(0.0, 0.0)
    ways: Counter[str] = Counter()
    wrong: list[int] = []

    async def one(batcher: StepBatcher[Any, int], key: int) -> None:
        length = sizes[key]
        want = expected(key, length)
        way = rng.choice(WAYS)
        after = rng.randrange(length + 2)  # past the end too: then it reads all
        ways[way] += 1
        got: list[int] = []
        if way == "cancel_at_once":
            batcher.stream((key, length)).cancel()
            return
        if way == "cancel_task":
            stream = batcher.stream((key, length))

            async def read() -> None:
                async for output in stream:
                    got.append(output)

            task = asyncio.create_task(read())
            for _ in range(after):
                await asyncio.sleep(0)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            del stream
        elif way == "drop_after":
            stream = batcher.stream((key, length))
            async for output in stream:
                got.append(output)
                if len(got) >= after:
                    break
            del stream  # no cancel(): its finalizer frees the slot
        else:
            with batcher.stream((key, length)) as stream:
                async for output in stream:
                    got.append(output)
                    if way == "break_after" and len(got) >= after:
                        break
        full = way == "read_all" or (way != "cancel_task" and after > length)
        if got != want[: len(got)] or (full and got != want):
            wrong.append(key)

    async def main() -> Outcome:
        async with StepBatcher[Any, int](model, max_sequences=max_sequences) as batcher:
            for first in range(0, streams, concurrent):
                keys = range(first, min(first + concurrent, streams))
                await asyncio.gather(*(one(batcher, key) for key in keys))
            gc.collect()
            for _ in range(1000):  # the lane frees a cancelled slot at its next step
                if not (batcher.active or batcher.waiting):
                    break
                await asyncio.sleep(0.01)
            freed = batcher.active == 0 and batcher.waiting == 0
            stats = batcher.stats()
        added = stats.completed + stats.cancelled == stats.submitted == streams
        return Outcome(not wrong, freed, added and stats.failed == 0, ways)

    return asyncio.run(main())
