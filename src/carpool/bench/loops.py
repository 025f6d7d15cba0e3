"""The load loops: send a step's requests on time, time them, tally the outcomes. Closed
(``concurrency``): each of N callers sends when its last request is answered. Open (``rate``,
``trace``): latency runs from the *scheduled* time, so a client that falls behind cannot hide
queueing (no coordinated omission). Nothing here knows HTTP or prints."""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from carpool.bench.plan import Plan, Share, Timing, clock, split
from carpool.bench.report.data import ServerSide, Step, summarize, summarize_streams
from carpool.bench.targets.base import Client, Send, Streamed

__all__ = [
    "InProcess",
    "LoadGenerator",
    "Probe",
    "ShareTally",
    "event_loop",
    "measure",
    "run_share",
    "sleep_until",
    "step_of",
]

LATE_S = 0.005  # an open-loop send this far behind its schedule counts as late


@dataclass(slots=True)
class ShareTally:
    """The measured requests of one share: successful latencies (s), errors by kind.
    ``done``/``failed`` are read live by the display."""

    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    done: int = 0
    failed: int = 0
    last_done: float = 0.0  # monotonic time of the last measured answer
    late: int = 0  # open loop: sends more than LATE_S behind schedule
    # closed loop, timed window: successful answers that arrived inside it, whenever sent
    answered: int = 0
    lag_max_s: float = 0.0
    # streams (--stream): how many ended well, their outputs, first-output and gap times (s)
    streams: int = 0
    outputs: int = 0
    first_s: list[float] = field(default_factory=list)
    gaps_s: list[float] = field(default_factory=list)

    def record(self, kind: str | Streamed | None, latency_s: float, now: float) -> None:
        if isinstance(kind, Streamed):
            self.latencies.append(latency_s)
            self.streams += 1
            self.outputs += kind.outputs
            if kind.first_s is not None:
                self.first_s.append(kind.first_s)
            self.gaps_s.extend(kind.gaps_s)
        elif kind is None:
            self.latencies.append(latency_s)
        else:
            self.errors[kind] += 1
            self.failed += 1
        self.done += 1
        self.last_done = now


async def sleep_until(when: float) -> None:
    """Sleep until ``when`` on :data:`~carpool.bench.plan.clock` (at once if it has passed)."""
    delay = when - clock()
    if delay > 0:
        await asyncio.sleep(delay)


async def _closed_loop(send: Send, share: Share, timing: Timing, tally: ShareTally) -> None:
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
            now = clock()
            in_window = now >= window and (end is None or now <= end)
            if in_window and not isinstance(kind, str):
                tally.answered += 1
            if measured and in_window:
                tally.record(kind, now - sent, now)

    await sleep_until(timing.start)
    async with asyncio.TaskGroup() as group:
        for _ in range(share.concurrency):
            group.create_task(caller())


async def _open_loop(send: Send, share: Share, timing: Timing, tally: ShareTally) -> None:
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
            await sleep_until(timing.start + offset)
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


async def run_share(send: Send, share: Share, timing: Timing, tally: ShareTally) -> None:
    """Run one share of a step to its end: every measured request answered or failed."""
    if share.offsets is None:
        await _closed_loop(send, share, timing, tally)
    else:
        await _open_loop(send, share, timing, tally)


# ----------------------------------------------------------------------------- generators


class LoadGenerator(Protocol):
    """Where a step's requests are sent from: this process, or client processes."""

    lead_s: float  # how long before a step's start its plan must be handed over

    async def run(self, plan: Plan, timing: Timing) -> list[ShareTally]: ...

    def counts(self) -> tuple[int, int]: ...  # measured answers so far, and failures


class InProcess:
    """The whole step on the running event loop."""

    lead_s = 0.0

    def __init__(self, client: Client) -> None:
        self._client = client
        self._tally = ShareTally()

    async def run(self, plan: Plan, timing: Timing) -> list[ShareTally]:
        (share,) = split(plan, 1)
        self._tally = tally = ShareTally()
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


# ----------------------------------------------------------------------------- a step


class Probe(Protocol):
    """The server side of a target, read before and after a step's window."""

    async def snapshot(self) -> Any: ...

    def server_side(self, before: Any, after: Any, latency_sum_s: float) -> ServerSide | None: ...


async def measure(
    plan: Plan, timing: Timing, generator: LoadGenerator, probe: Probe, *, slo_ms: float | None
) -> tuple[Step, list[ShareTally]]:
    """Run one step; read the server side as the window opens and as it closes."""
    marks: dict[str, Any] = {}

    async def observe() -> None:
        await sleep_until(timing.window)
        marks["before"] = await probe.snapshot()
        if timing.end is not None:
            await sleep_until(timing.end)
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


def step_of(
    plan: Plan, timing: Timing, tallies: Sequence[ShareTally], *, slo_ms: float | None
) -> Step:
    """The :class:`Step` the tallies of all client processes make together."""
    latencies = np.concatenate([np.asarray(t.latencies, dtype=np.float64) for t in tallies])
    errors: Counter[str] = Counter()
    for tally in tallies:
        errors.update(tally.errors)
    ok = int(latencies.size)
    window = _window(plan, timing, tallies)
    # A timed closed-loop window also answers the requests its callers had in flight as it
    # opened: counting only those sent inside it would understate throughput by
    # concurrency / window requests (5 % at 64 callers, 150 ms and 3 s).
    answered = sum(t.answered for t in tallies) if plan.closed and timing.end else ok
    goodput = None
    if slo_ms is not None:
        goodput = float(np.count_nonzero(latencies <= slo_ms / 1000.0)) / window
    streams = None
    if any(t.streams for t in tallies):
        streams = summarize_streams(
            sum(t.streams for t in tallies),
            sum(t.outputs for t in tallies),
            [s for t in tallies for s in t.first_s],
            [s for t in tallies for s in t.gaps_s],
            window,
        )
    return Step(
        load=plan.load,
        duration_s=window,
        requests=ok + sum(errors.values()),
        ok=ok,
        errors=dict(sorted(errors.items())),
        throughput_rps=answered / window,
        latency=summarize(latencies),
        goodput_rps=goodput,
        streams=streams,
    )


def _window(plan: Plan, timing: Timing, tallies: Sequence[ShareTally]) -> float:
    """The measured window's length in seconds: to its end, or to the last answer."""
    if timing.end is not None:
        window = timing.end - timing.window
    else:
        last = max((t.last_done for t in tallies if t.done), default=timing.window)
        window = last - timing.window
        if not plan.closed and plan.duration_s is not None:
            window = max(window, plan.duration_s)  # a schedule spans its duration at least
    return max(window, 1e-9)
