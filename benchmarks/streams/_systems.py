"""The systems compared, each serving the same jobs ``(key, length)`` of the same model:
the model called one sequence at a time, static batching (a batch formed once, held until
its longest member ends: a loop of our own, and Ray Serve's ``@serve.batch`` over an async
generator), and carpool's StepBatcher; closed-loop clients that each read a stream to its
end, then open the next."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

from benchmarks.harness import common
from benchmarks.streams._models import SPREAD, Synthetic, held_batch

Job = tuple[int, int]
Opener = Callable[[Job], AsyncIterator[int]]


def jobs(lengths: list[int]) -> Iterator[Job]:
    """Endless jobs, their lengths in a seeded order, each key new."""
    keys = itertools.count()
    return ((next(keys), n) for n in itertools.cycle(lengths))


def serial_outputs_per_s(model: Synthetic, source: Iterator[Job], seconds: float) -> float:
    """One sequence at a time, the model called directly, for ``seconds``."""
    made = 0
    t0 = time.perf_counter()
    end = t0 + seconds
    while time.perf_counter() < end:
        (state,) = model.start([next(source)])
        while time.perf_counter() < end:
            (output,) = model.step([state])
            made += 1
            if model.finished(state, output):
                break
    return made / (time.perf_counter() - t0)


@dataclass
class Loop:
    """What a closed loop saw: outputs/s in its window, and whether every stream that ended
    gave exactly its outputs."""

    outputs_per_s: float
    streams: int
    exact: bool


async def closed_loop(
    open_stream: Opener,
    clients: int,
    source: Iterator[Job],
    warmup: float,
    window: float,
    halt: Callable[[], None] | None = None,
) -> Loop:
    """``clients`` tasks, each reading a stream to its end, then opening the next; the
    outputs that arrived in the ``window`` seconds after ``warmup``. Then ``halt()`` ends
    the streams under way and the clients finish (without ``halt``: they are cancelled)."""
    made = ended = 0
    wrong: list[Job] = []
    running = True

    async def client() -> None:
        nonlocal made, ended
        while running:
            key, length = job = next(source)
            got = 0
            async for output in open_stream(job):
                got += 1
                made += 1
                if output != key * SPREAD + got:
                    wrong.append(job)
            if got != length and running:
                wrong.append(job)
            ended += 1

    tasks = [asyncio.create_task(client()) for _ in range(clients)]
    await asyncio.sleep(warmup)
    before, t0 = made, time.perf_counter()
    await asyncio.sleep(window)
    after, t1 = made, time.perf_counter()
    running = False
    if halt is not None:
        halt()
    else:
        for task in tasks:
            task.cancel()
    await asyncio.gather(*tasks, return_exceptions=halt is None)
    return Loop((after - before) / (t1 - t0), ended, not wrong)


class StaticLoop:
    """Static batching at its best: whenever the model is free, the jobs waiting then (up to
    ``max_batch``) form a batch that steps until its longest member ends; a member that
    ended is no longer stepped. What Ray's queue does, but forming the next batch only
    once the model is free (Ray forms it at once, of whoever came, while one runs)."""

    def __init__(self, model: Synthetic, max_batch: int) -> None:
        self.model, self.max_batch = model, max_batch
        self.halted = False
        self._waiting: list[tuple[Job, asyncio.Queue[int | None]]] = []
        self._arrived = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def open(self, job: Job) -> AsyncIterator[int]:
        if self._task is None:
            self._task = asyncio.create_task(self._serve())
        outbox: asyncio.Queue[int | None] = asyncio.Queue()
        self._waiting.append((job, outbox))
        self._arrived.set()
        while (output := await outbox.get()) is not None:
            yield output

    def halt(self) -> None:
        self.halted = True
        self._arrived.set()

    async def _serve(self) -> None:
        model = self.model
        while not self.halted:
            await self._arrived.wait()
            self._arrived.clear()
            while self._waiting and not self.halted:
                batch = self._waiting[: self.max_batch]
                del self._waiting[: self.max_batch]
                states = model.start([job for job, _ in batch])
                live = list(range(len(batch)))
                while live and not self.halted:
                    outputs = await asyncio.to_thread(model.step, [states[i] for i in live])
                    still = []
                    for i, output in zip(live, outputs, strict=True):
                        batch[i][1].put_nowait(output)
                        if model.finished(states[i], output):
                            batch[i][1].put_nowait(None)
                        else:
                            still.append(i)
                    live = still
                for i in live:
                    batch[i][1].put_nowait(None)
        for _, outbox in self._waiting:
            outbox.put_nowait(None)


class RayStatic:
    """Ray Serve's ``@serve.batch`` over an async generator: up to ``max_batch`` jobs form a
    batch that steps (in a thread, off the event loop) until its longest member ends; a
    member that ended gets ``StopIteration`` and is no longer stepped (generous to it).
    ``halt()`` ends every batch at its next step (Ray's queue ends cleanly, unlike when
    its callers are cancelled)."""

    def __init__(self, model: Synthetic, max_batch: int, wait_s: float) -> None:
        self.halted = False
        self.open = _ray_generator(model, max_batch, wait_s, self)

    def halt(self) -> None:
        self.halted = True


def _ray_generator(model: Synthetic, max_batch: int, wait_s: float, owner: RayStatic) -> Opener:

    @common.ray_serve_batch(max_batch, wait_s)
    async def generate(batch: list[Job]) -> AsyncIterator[list[object]]:
        rows = held_batch(model, batch)  # each step in a thread, off the event loop
        while not owner.halted and (row := await asyncio.to_thread(next, rows, None)):
            yield [StopIteration if output is None else output for output in row]

    return generate  # type: ignore[no-any-return]
