"""Builders shared by the bench tests: steps and reports as a run records them, and the
plans of closed and open-loop steps. Import them as ``from bench.conftest import ...``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from carpool.bench.plan import Plan
from carpool.bench.report.data import Latency, Load, Report, ServerSide, Step


def latency(p50: float, p99: float, *, max_ms: float | None = None, count: int = 100) -> Latency:
    """Percentiles in ms: the mean at p50, p90 halfway to p99, the max at p99 unless given."""
    top = p99 if max_ms is None else max_ms
    return Latency(count=count, mean=p50, p50=p50, p90=(p50 + p99) / 2, p99=p99, max=top)


def step(
    value: float,
    rps: float,
    measured: Latency | None,
    *,
    mode: str = "concurrency",
    duration_s: float = 10.0,
    ok: int | None = None,
    errors: dict[str, int] | None = None,
    server: ServerSide | None = None,
    goodput: float | None = None,
) -> Step:
    """A step at load ``value``: ``ok`` answers (``rps`` over the window unless given), and
    the ``errors`` besides."""
    answered = int(rps * duration_s) if ok is None else ok
    return Step(
        load=Load(mode, value),
        duration_s=duration_s,
        requests=answered + sum((errors or {}).values()),
        ok=answered,
        errors=errors or {},
        throughput_rps=rps,
        latency=measured,
        server=server,
        goodput_rps=goodput,
    )


def batch_sizes(sizes: dict[str, int]) -> ServerSide:
    """Server-side figures with only the batch-size counts filled in."""
    return ServerSide(
        batches=sum(sizes.values()),
        rows=0,
        batch_size_mean=1.0,
        batch_sizes=sizes,
        queue_wait_ms_mean=0.0,
        model_ms_mean=0.0,
        queue_wait_share=None,
    )


def report(
    steps: Sequence[Step],
    *,
    label: str = "",
    target: str = "http://127.0.0.1:8000",
    kind: str = "http",
) -> Report:
    """A closed-loop report of the demo model."""
    return Report(
        target=target,
        kind=kind,
        model="demo",
        mode="concurrency",
        steps=list(steps),
        label=label,
    )


def closed_plan(
    concurrency: int,
    *,
    requests: int | None = None,
    duration_s: float | None = None,
    warmup_s: float = 0.0,
) -> Plan:
    """A closed-loop step: ``concurrency`` callers, one connection each."""
    return Plan(
        Load("concurrency", concurrency), warmup_s, duration_s, requests, connections=concurrency
    )


def open_plan(offsets: Sequence[float], *, warmup: Sequence[float] = ()) -> Plan:
    """An open-loop step sending at ``offsets`` (s) over 8 connections."""
    return Plan(
        Load("rate", 100.0),
        0.0,
        None,
        len(offsets),
        np.asarray(offsets, float),
        np.asarray(warmup, float),
        connections=8,
    )
