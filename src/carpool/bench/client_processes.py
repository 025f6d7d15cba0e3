"""``--client-processes``: the load loops in spawned processes, each with its own event loop and
connection pool, so one client core does not cap the server being measured. Each process gets
its :class:`~carpool.bench.plan.Share` over a pipe and sends back its
:class:`~carpool.bench.loops.ShareTally`; live counts go through shared memory."""

from __future__ import annotations

import asyncio
import multiprocessing
from multiprocessing.connection import Connection
from typing import Any

from carpool.bench.loops import ShareTally, event_loop, run_share
from carpool.bench.plan import Plan, Share, Timing, split
from carpool.bench.targets.base import Client

__all__ = ["ClientProcesses"]

PUBLISH_S = 0.1  # how often a client process publishes its counts for the live display
SPAWN_LEAD_S = 0.3  # client processes get a step's plan this long before it starts
START_WITHIN_S = 60.0  # a spawned client imports numpy and aiohttp: seconds on a slow box
READY = "ready"


class ClientProcesses:
    """``processes`` spawned client processes, each with its own loop and connection pool;
    started once, given one share of every step. Use as a context manager."""

    lead_s = SPAWN_LEAD_S

    def __init__(self, client: Client, processes: int) -> None:
        context = multiprocessing.get_context("spawn")  # no inherited loop, threads or sockets
        self._counts: Any = context.Array("q", 2 * processes, lock=False)
        self._pipes: list[Connection] = []
        self._processes: list[Any] = []
        for slot in range(processes):
            parent, child = context.Pipe()
            process = context.Process(
                target=_client_process,
                args=(child, client, self._counts, slot),
                name=f"carpool-bench-client-{slot}",
                daemon=True,
            )
            self._pipes.append(parent)
            self._processes.append(process)

    def __enter__(self) -> ClientProcesses:
        for process in self._processes:
            process.start()
        for slot, pipe in enumerate(self._pipes):
            if not pipe.poll(START_WITHIN_S) or pipe.recv() != READY:
                self.__exit__(None, None, None)
                raise RuntimeError(f"client process {slot} did not start in {START_WITHIN_S:g}s")
        return self

    def __exit__(self, *exc_info: object) -> None:
        for pipe in self._pipes:
            try:
                pipe.send(None)
            except OSError:
                pass
        for process in self._processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join()

    async def run(self, plan: Plan, timing: Timing) -> list[ShareTally]:
        shares = split(plan, len(self._pipes))
        for k, pipe in enumerate(self._pipes):
            self._counts[2 * k] = self._counts[2 * k + 1] = 0
            pipe.send((shares[k], timing))
        replies = await asyncio.gather(*(asyncio.to_thread(p.recv) for p in self._pipes))
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        return list(replies)

    def counts(self) -> tuple[int, int]:
        values = list(self._counts)
        return sum(values[0::2]), sum(values[1::2])


# ----------------------------------------------------------------------------- the child side


def _client_process(conn: Connection, client: Client, counts: Any, slot: int) -> None:
    """A spawned client process: run each share it is sent until it gets ``None``."""
    try:
        with asyncio.Runner(loop_factory=event_loop()) as runner:
            runner.run(_touch(client))
            conn.send(READY)
            while (message := conn.recv()) is not None:
                share, timing = message
                conn.send(_child_step(runner, client, share, timing, counts, slot))
    except (KeyboardInterrupt, EOFError, BrokenPipeError):  # Ctrl-C, or the parent is gone
        pass


async def _touch(client: Client) -> None:
    """Imports done and a pool opened once, before any step's clock starts."""
    async with client.open(1):
        pass


def _child_step(
    runner: asyncio.Runner, client: Client, share: Share, timing: Timing, counts: Any, slot: int
) -> ShareTally | RuntimeError:
    tally = ShareTally()

    async def publish() -> None:
        while True:
            counts[2 * slot], counts[2 * slot + 1] = tally.done, tally.failed
            await asyncio.sleep(PUBLISH_S)

    async def step() -> None:
        async with asyncio.TaskGroup() as group:
            publisher = group.create_task(publish())
            async with client.open(share.connections) as send:
                await run_share(send, share, timing, tally)
            publisher.cancel()

    try:
        runner.run(step())
    except Exception as exc:  # the parent raises it; this process stays usable
        return RuntimeError(f"client process {slot}: {type(exc).__name__}: {exc}")
    counts[2 * slot], counts[2 * slot + 1] = tally.done, tally.failed
    return tally
