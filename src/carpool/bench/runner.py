"""The load generator: send a step's requests on time, time them, tally the outcomes.

Two loops. Closed (``concurrency``): N callers, each sending its next request when the last is
answered. Open (``rate``, ``trace``): requests leave at scheduled offsets whether or not
earlier ones were answered, and latency runs from the *scheduled* time, so a client that
falls behind cannot hide queueing (no coordinated omission). Both run in this process, or
split over ``--client-processes`` spawned processes whose raw latencies are merged.

Requests go out through a :class:`~carpool.bench.targets.Client`; nothing here knows HTTP
or batchers, and nothing prints.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from typing import Any, Protocol

import numpy as np

from carpool.bench.report import Load, ServerSide, Step, summarize
from carpool.bench.targets import Client, Send

__all__ = [
    "ClientProcesses",
    "InProcess",
    "Plan",
    "Probe",
    "Share",
    "Tally",
    "Timing",
    "event_loop",
    "measure",
    "run_share",
    "split",
    "step_of",
]

clock = time.monotonic  # one clock for every process on the machine (CLOCK_MONOTONIC)
LATE_S = 0.005  # an open-loop send this far behind its schedule counts as late
PUBLISH_S = 0.1  # how often a client process publishes its counts for the live display
SPAWN_LEAD_S = 0.3  # client processes get a step's plan this long before it starts
START_WITHIN_S = 60.0  # a spawned client imports numpy and aiohttp: seconds on a slow box
READY = "ready"


@dataclass(frozen=True, slots=True)
class Plan:
    """One step: its load, warm-up, and when its measured window ends.

    Closed loop: ``requests`` measured requests, or else ``duration_s`` of window.
    Open loop: ``offsets``, the measured send times in seconds from the window's start
    (``warmup_offsets`` from the step's start, never recorded). ``connections`` bounds
    the keep-alive pool of all processes together.
    """

    load: Load
    warmup_s: float
    duration_s: float | None = None
    requests: int | None = None
    offsets: np.ndarray[Any, Any] | None = None
    warmup_offsets: np.ndarray[Any, Any] | None = None
    connections: int = 1

    @property
    def closed(self) -> bool:
        return self.load.mode == "concurrency"


@dataclass(frozen=True, slots=True)
class Share:
    """One client process's part of a step: callers or send times, and which requests it
    sends (``first``, ``first + stride``, ...), so processes cycle through different bodies."""

    concurrency: int = 0
    requests: int | None = None
    offsets: np.ndarray[Any, Any] | None = None
    warmup_offsets: np.ndarray[Any, Any] | None = None
    first: int = 0
    stride: int = 1
    connections: int = 1


@dataclass(frozen=True, slots=True)
class Timing:
    """Monotonic times: the step starts (warm-up), its window opens, and, for a closed loop
    run by duration, closes (otherwise the window lasts until the last request is answered)."""

    start: float
    window: float
    end: float | None

    @classmethod
    def of(cls, plan: Plan, *, lead_s: float = 0.0) -> Timing:
        start = clock() + lead_s
        window = start + plan.warmup_s
        end = None
        if plan.closed and plan.requests is None and plan.duration_s is not None:
            end = window + plan.duration_s
        return cls(start, window, end)


@dataclass(slots=True)
class Tally:
    """The measured requests of one share: successful latencies (s), errors by kind.
    ``done``/``failed`` are read live by the display."""

    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    done: int = 0
    failed: int = 0
    last_done: float = 0.0  # monotonic time of the last measured answer
    late: int = 0  # open loop: sends more than LATE_S behind schedule
    lag_max_s: float = 0.0

    def record(self, kind: str | None, latency_s: float, now: float) -> None:
        if kind is None:
            self.latencies.append(latency_s)
        else:
            self.errors[kind] += 1
            self.failed += 1
        self.done += 1
        self.last_done = now


def split(plan: Plan, processes: int) -> list[Share]:
    """``plan`` dealt over ``processes``: callers and requests divided, send times dealt
    round-robin (the union of the shares is the plan's own schedule)."""
    n = processes
    if not plan.closed:
        assert plan.offsets is not None
        warm = plan.warmup_offsets if plan.warmup_offsets is not None else np.empty(0)
        per = max(1, math.ceil(plan.connections / n))
        return [
            Share(
                offsets=plan.offsets[k::n],
                warmup_offsets=warm[k::n],
                first=k,
                stride=n,
                connections=per,
            )
            for k in range(n)
        ]
    total = int(plan.load.value)
    callers = [total // n + (k < total % n) for k in range(n)]
    active = sum(1 for c in callers if c)
    requests: list[int | None] = [None] * n
    if plan.requests is not None:
        share, extra = divmod(plan.requests, active)
        rank = 0
        for k, c in enumerate(callers):
            requests[k] = (share + (rank < extra)) if c else 0
            rank += bool(c)
    return [
        Share(
            concurrency=callers[k],
            requests=requests[k],
            first=k,
            stride=n,
            connections=max(1, callers[k]),
        )
        for k in range(n)
    ]


async def _sleep_until(when: float) -> None:
    delay = when - clock()
    if delay > 0:
        await asyncio.sleep(delay)


async def _closed_loop(send: Send, share: Share, timing: Timing, tally: Tally) -> None:
    window, end = timing.window, timing.end
    remaining = share.requests if share.requests is not None else -1
    stride = share.stride
    index = share.first

    async def caller() -> None:
        nonlocal remaining, index
        while True:
            sent = clock()
            measured = sent >= window
            if measured:
                if end is not None:
                    if sent >= end:
                        return
                elif remaining == 0:
                    return
                else:
                    remaining -= 1
            i = index
            index += stride
            kind = await send(i)
            if measured:
                now = clock()
                if end is None or now <= end:
                    tally.record(kind, now - sent, now)

    await _sleep_until(timing.start)
    async with asyncio.TaskGroup() as group:
        for _ in range(share.concurrency):
            group.create_task(caller())


async def _open_loop(send: Send, share: Share, timing: Timing, tally: Tally) -> None:
    async def one(i: int, scheduled: float) -> None:
        kind = await send(i)
        now = clock()
        tally.record(kind, now - scheduled, now)

    async def unrecorded(i: int) -> None:
        await send(i)

    assert share.offsets is not None
    warm = share.warmup_offsets if share.warmup_offsets is not None else np.empty(0)
    index, stride = share.first, share.stride
    async with asyncio.TaskGroup() as group:
        for offset in warm.tolist():
            await _sleep_until(timing.start + offset)
            group.create_task(unrecorded(index))
            index += stride
        for offset in share.offsets.tolist():
            scheduled = timing.window + offset
            lag = clock() - scheduled
            if lag < 0:
                await asyncio.sleep(-lag)
            elif lag > LATE_S:  # behind: send at once; its latency includes the delay
                tally.late += 1
                tally.lag_max_s = max(tally.lag_max_s, lag)
            group.create_task(one(index, scheduled))
            index += stride


async def run_share(send: Send, share: Share, timing: Timing, tally: Tally) -> None:
    """Run one share of a step to its end: every measured request answered or failed."""
    if share.offsets is None:
        await _closed_loop(send, share, timing, tally)
    else:
        await _open_loop(send, share, timing, tally)


class Generator(Protocol):
    """Where a step's requests are generated: this process, or client processes."""

    lead_s: float

    async def run(self, plan: Plan, timing: Timing) -> list[Tally]: ...

    def counts(self) -> tuple[int, int]: ...  # measured answers so far, and failures


class InProcess:
    """The whole step on the running event loop."""

    lead_s = 0.0

    def __init__(self, client: Client) -> None:
        self._client = client
        self._tally = Tally()

    async def run(self, plan: Plan, timing: Timing) -> list[Tally]:
        (share,) = split(plan, 1)
        self._tally = tally = Tally()
        async with self._client.open(share.connections) as send:
            await run_share(send, share, timing, tally)
        return [tally]

    def counts(self) -> tuple[int, int]:
        return self._tally.done, self._tally.failed


def event_loop() -> Callable[[], asyncio.AbstractEventLoop]:
    """uvloop's loop when installed (the client's per-request cost roughly halves)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop
    return uvloop.new_event_loop


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
) -> Tally | RuntimeError:
    tally = Tally()

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

    async def run(self, plan: Plan, timing: Timing) -> list[Tally]:
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


class Probe(Protocol):
    """The server side of a target, read before and after a step's window."""

    async def snapshot(self) -> Any: ...

    def server_side(self, before: Any, after: Any, latency_sum_s: float) -> ServerSide | None: ...


async def measure(
    plan: Plan, timing: Timing, generator: Generator, probe: Probe, *, slo_ms: float | None
) -> tuple[Step, list[Tally]]:
    """Run one step; read the server side as the window opens and as it closes."""
    marks: dict[str, Any] = {}

    async def observe() -> None:
        await _sleep_until(timing.window)
        marks["before"] = await probe.snapshot()
        if timing.end is not None:
            await _sleep_until(timing.end)
            marks["after"] = await probe.snapshot()

    async with asyncio.TaskGroup() as group:
        group.create_task(observe())
        tallies = await generator.run(plan, timing)
    if "after" not in marks:
        marks["after"] = await probe.snapshot()
    step = step_of(plan, timing, tallies, slo_ms=slo_ms)
    latency_sum = math.fsum(math.fsum(t.latencies) for t in tallies)
    server = probe.server_side(marks["before"], marks["after"], latency_sum)
    return (step if server is None else replace(step, server=server)), tallies


def step_of(plan: Plan, timing: Timing, tallies: Sequence[Tally], *, slo_ms: float | None) -> Step:
    """The :class:`Step` the tallies of all client processes make together."""
    latencies = np.concatenate([np.asarray(t.latencies, dtype=np.float64) for t in tallies])
    errors: Counter[str] = Counter()
    for tally in tallies:
        errors.update(tally.errors)
    ok = int(latencies.size)
    if timing.end is not None:
        window = timing.end - timing.window
    else:
        last = max((t.last_done for t in tallies if t.done), default=timing.window)
        window = last - timing.window
        if not plan.closed and plan.duration_s is not None:
            window = max(window, plan.duration_s)  # a schedule spans its duration at least
    window = max(window, 1e-9)
    goodput = None
    if slo_ms is not None:
        goodput = float(np.count_nonzero(latencies <= slo_ms / 1000.0)) / window
    return Step(
        load=plan.load,
        duration_s=window,
        requests=ok + sum(errors.values()),
        ok=ok,
        errors=dict(sorted(errors.items())),
        throughput_rps=ok / window,
        latency=summarize(latencies),
        goodput_rps=goodput,
    )
