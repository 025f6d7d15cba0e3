"""What each step of a run sends, and when: its :class:`Plan`, each client process's
:class:`Share` and its :class:`Timing`. Pure: drawn from checked options before anything is
sent, so the load loops plan nothing per request."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from carpool.bench.arrivals import count_offsets, poisson_offsets
from carpool.bench.options import DURATION_S, Options
from carpool.bench.report.data import Load
from carpool.bench.targets.base import BenchError

__all__ = ["Plan", "Share", "Timing", "clock", "plans", "split"]

clock = time.monotonic  # one clock for every process on the machine (CLOCK_MONOTONIC)

Offsets = np.ndarray[Any, Any]


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
    offsets: Offsets | None = None
    warmup_offsets: Offsets | None = None
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
    offsets: Offsets | None = None
    warmup_offsets: Offsets | None = None
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


# ----------------------------------------------------------------------------- plans


def plans(options: Options, *, trace: Offsets | None = None) -> list[Plan]:
    """Each step's plan; open-loop send times drawn here, before anything is sent.

    ``trace``: the ``--trace`` file's send times as read (a trace run needs them; the
    caller reads the file, as this module does no I/O). :class:`BenchError` for a trace
    with nothing to replay.
    """
    if options.mode == "concurrency":
        count = options.requests
        by_time = None if count is not None else _duration(options)
        return [
            Plan(Load("concurrency", c), options.warmup_s, by_time, count, connections=int(c))
            for c in options.values
        ]
    if options.mode == "rate":
        return [_rate_plan(options, rate) for rate in options.values]
    if trace is None:
        raise TypeError("plans() of a trace run needs the trace's send times")
    return [_trace_plan(options, trace)]


def _duration(options: Options) -> float:
    return options.duration_s if options.duration_s is not None else DURATION_S


def _warmup_offsets(options: Options, rate: float) -> Offsets:
    """Unrecorded Poisson arrivals at the step's rate over the warm-up, seeded apart."""
    if options.warmup_s <= 0:
        return np.empty(0)
    offsets = poisson_offsets(rate, options.warmup_s, seed=options.seed + 1)
    return np.asarray(offsets, dtype=np.float64)


def _rate_plan(options: Options, rate: float) -> Plan:
    count = options.requests
    if count is not None:
        offsets = count_offsets(rate, count, seed=options.seed)
    else:
        offsets = poisson_offsets(rate, _duration(options), seed=options.seed)
    return Plan(
        Load("rate", rate),
        options.warmup_s,
        None if count is not None else _duration(options),
        count,
        np.asarray(offsets, dtype=np.float64),
        _warmup_offsets(options, rate),
        options.connections,
    )


def _trace_plan(options: Options, trace: Offsets) -> Plan:
    """The trace's send times from its first, cut to ``--requests`` or ``--duration``."""
    offsets = np.asarray(trace, dtype=np.float64)
    if offsets.size:
        offsets = offsets - offsets[0]
    if options.requests is not None:
        offsets = offsets[: options.requests]
    elif options.duration_s is not None:
        offsets = offsets[offsets < options.duration_s]
    if not offsets.size:
        raise BenchError(f"--trace {options.trace!r} has no send times to replay")
    span = float(offsets[-1])
    rate = offsets.size / span if span > 0 else float(offsets.size)
    return Plan(
        Load("trace", rate),
        options.warmup_s,
        None,
        None,
        offsets,
        _warmup_offsets(options, rate),
        options.connections,
    )


# ----------------------------------------------------------------------------- shares


def split(plan: Plan, processes: int) -> list[Share]:
    """``plan`` dealt over ``processes``: callers and requests divided, send times dealt
    round-robin (the union of the shares is the plan's own schedule)."""
    if not plan.closed:
        return _deal_offsets(plan, processes)
    n = processes
    total = int(plan.load.value)
    callers = [total // n + (k < total % n) for k in range(n)]
    requests = _divide_requests(plan.requests, callers)
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


def _divide_requests(requests: int | None, callers: list[int]) -> list[int | None]:
    """A closed step's measured requests over the processes that have callers."""
    if requests is None:
        return [None] * len(callers)
    active = sum(1 for c in callers if c)
    share, extra = divmod(requests, active)
    out: list[int | None] = []
    rank = 0
    for c in callers:
        out.append((share + (rank < extra)) if c else 0)
        rank += bool(c)
    return out


def _deal_offsets(plan: Plan, processes: int) -> list[Share]:
    assert plan.offsets is not None
    n = processes
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
