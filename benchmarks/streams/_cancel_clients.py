"""``benchmarks.streams.cancellations``' clients: one plan of streams (seeded: each one's key,
length and where, if anywhere, its client gives up), run ``concurrent`` at a time through the
library, gRPC's ModelStreamInfer (grpc.aio, the call cancelled) or SSE (aiohttp, the response
closed); what each stream got, and when its client gave it up (``time.monotonic``)."""

from __future__ import annotations

import asyncio
import gc
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks.streams._models import expected, lengths


@dataclass(frozen=True)
class Planned:
    """A stream: its key and length; ``after``: how many outputs its client reads before it
    gives up (0: before the first), None: all of them; ``wait_s``: with ``after`` 0, how
    long after sending it gives up."""

    key: int
    length: int
    after: int | None
    wait_s: float


@dataclass
class Outcome:
    """What the streams of one protocol got: wrong ones, the given-up ones' times."""

    streams: int = 0
    early: int = 0  # given up before their first output (the server may never see them)
    completed: int = 0  # read to their end
    exact: int = 0  # read to their end, every output exactly as expected
    wrong: list[int] = field(default_factory=list)  # keys with an output not theirs
    errors: list[str] = field(default_factory=list)
    cancelled_at: dict[int, float] = field(default_factory=dict)  # key -> when given up
    finished_at: dict[int, float] = field(default_factory=dict)  # key -> its last output's arrival
    wall_s: float = 0.0


def plan(streams: int, first_key: int, step_s: float, seed: int) -> list[Planned]:
    """``streams`` streams, keys from ``first_key``; about half given up at a random point
    (before the first output, or after k < length outputs), seeded."""
    rng = random.Random(seed)
    planned = []
    for i, length in enumerate(lengths(streams, 16, 64, seed)):
        after = rng.randrange(length) if rng.random() < 0.5 else None
        planned.append(Planned(first_key + i, length, after, rng.uniform(0, 2 * step_s)))
    return planned


One = Callable[["Planned", "Outcome"], Awaitable[list[int]]]


async def run(planned: list[Planned], concurrent: int, one: One) -> Outcome:
    """Every planned stream through ``one``, ``concurrent`` at a time (closed loop)."""
    outcome = Outcome(streams=len(planned), early=sum(p.after == 0 for p in planned))
    queue: Iterator[Planned] = iter(planned)

    async def client() -> None:
        for p in queue:
            try:
                got = await one(p, outcome)
            except Exception as exc:  # counted: the run's checks fail on any
                outcome.errors.append(f"{p.key}: {type(exc).__name__}: {exc}")
                continue
            want = expected(p.key, p.length)
            if got != want[: len(got)]:
                outcome.wrong.append(p.key)
            elif p.after is None:
                outcome.completed += 1
                outcome.exact += got == want
                if got != want:
                    outcome.wrong.append(p.key)

    gc.freeze()  # the plan and the run's books: no full collection walks them mid-run
    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrent)))
    outcome.wall_s = time.perf_counter() - start
    return outcome


async def _give_up_early(p: Planned, outcome: Outcome, read: Awaitable[Any]) -> list[int]:
    """``read`` started, and cancelled ``p.wait_s`` later: before it read an output."""
    task = asyncio.ensure_future(read)
    await asyncio.sleep(p.wait_s)
    task.cancel()
    outcome.cancelled_at[p.key] = time.monotonic()
    await asyncio.gather(task, return_exceptions=True)
    return []


async def _read(p: Planned, outcome: Outcome, outputs: AsyncIterator[int]) -> list[int]:
    """Outputs as they come, until the end or ``p.after`` of them (the time noted)."""
    got: list[int] = []
    async for value in outputs:
        got.append(value)
        if p.after is not None and len(got) >= p.after:
            outcome.cancelled_at[p.key] = time.monotonic()
            break
        if len(got) == p.length:
            outcome.finished_at[p.key] = time.monotonic()
    return got


def library(batcher: Any) -> One:
    """A stream of ``batcher`` (a StepBatcher), left by ``break`` out of ``with stream`` (or
    cancelled before its first output is read)."""

    async def one(p: Planned, outcome: Outcome) -> list[int]:
        with batcher.stream((p.key, p.length)) as stream:
            if p.after == 0:
                await asyncio.sleep(p.wait_s)
                outcome.cancelled_at[p.key] = time.monotonic()
                stream.cancel()
                return []
            return await _read(p, outcome, stream)

    return one


def grpc_streams(stub: Any, model: str) -> One:
    """One ModelStreamInfer call a stream (its one request written, then done writing),
    given up by cancelling the call."""
    from tritonclient.grpc import service_pb2 as pb

    async def outputs(call: Any) -> AsyncIterator[int]:
        async for response in call:
            if response.error_message:
                raise RuntimeError(response.error_message)
            answer = response.infer_response
            if answer.raw_output_contents:
                yield int(np.frombuffer(answer.raw_output_contents[0], dtype=np.int64)[0])

    async def one(p: Planned, outcome: Outcome) -> list[int]:
        request = pb.ModelInferRequest(model_name=model, id=str(p.key))
        for name, value in (("key", p.key), ("length", p.length)):
            tensor = request.inputs.add(name=name, datatype="INT64", shape=[1, 1])
            tensor.contents.int64_contents.append(value)
        call = stub.ModelStreamInfer()
        try:
            await call.write(request)
            await call.done_writing()
            if p.after == 0:
                return await _give_up_early(p, outcome, call.read())
            got = await _read(p, outcome, outputs(call))  # to the call's end, its status
        except BaseException:
            call.cancel()
            raise
        if p.key in outcome.cancelled_at:
            call.cancel()
            outcome.cancelled_at[p.key] = time.monotonic()  # the cancel issued
        return got

    return one


def sse_streams(session: Any, model: str) -> One:
    """One ``generate_stream`` POST a stream (aiohttp), given up by closing the response."""
    import orjson

    path = f"/v2/models/{model}/generate_stream"

    async def events(response: Any) -> AsyncIterator[int]:
        async for line in response.content:
            if not line.startswith(b"data:"):
                continue
            event = orjson.loads(line[5:])
            if "error" in event:
                raise RuntimeError(event["error"])
            yield int(event["value"])

    async def post(p: Planned, outcome: Outcome) -> list[int]:
        async with session.post(path, json={"key": p.key, "length": p.length}) as response:
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}: {await response.text()}")
            got = await _read(p, outcome, events(response))
            if p.key in outcome.cancelled_at:
                response.close()  # given up: the connection closed, the server told
                outcome.cancelled_at[p.key] = time.monotonic()  # the close issued
            return got

    async def one(p: Planned, outcome: Outcome) -> list[int]:
        if p.after == 0:
            return await _give_up_early(p, outcome, post(p, outcome))
        return await post(p, outcome)

    return one
