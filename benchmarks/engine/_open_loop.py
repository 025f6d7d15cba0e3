"""``benchmarks.engine.adaptive``'s open-loop client (not a scenario): the simulated
accelerator, the settings compared, one measured cell, and the plot. Requests go out at
seeded offsets whatever happened to earlier ones; latency runs from each *scheduled* send
time, so a client that falls behind cannot hide queueing (no coordinated omission).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

import numpy as np

from benchmarks.harness import common as _bench
from carpool.bench.report.data import percentile

SLO_MS = 50.0  # the objective: adaptive's latency_slo_ms, and goodput's "in time"
MAX_BATCH = 64
# fixed max_wait_ms candidates: the grid {0, 1, 2, 5, 10, 20, 50} less 0, since
# fixed with max_wait_ms=0 makes exactly eager's decisions (a free worker takes every row)
WAITS_MS = (1, 2, 5, 10, 20, 50)
ACCEL_FIXED_S = 0.005  # the simulated accelerator: t(b) = 5 ms + 0.1 ms x b
ACCEL_PER_ROW_S = 0.0001

# outcome codes per request (PENDING: unanswered, or cancelled at the window's end)
PENDING, SERVED, OVERLOADED, QUEUE_FULL, EXPIRED = range(5)


def accelerator(batch: Any) -> Any:
    """A GPU-like model: ``time.sleep(5 ms + 0.1 ms x rows)`` (the GIL is released)."""
    time.sleep(ACCEL_FIXED_S + ACCEL_PER_ROW_S * len(batch))
    return batch


@dataclass(frozen=True)
class Setting:
    """One batcher configuration: ``label`` in the tables, ``options`` for ``Batcher``."""

    label: str
    kind: str  # "eager", "fixed" or "adaptive"
    options: dict[str, Any] = field(default_factory=dict)


def settings(waits: Sequence[float]) -> list[Setting]:
    """eager, fixed at each wait, adaptive with a generous 50 ms cap and with the default 5."""
    out = [Setting("eager", "eager", {"policy": "eager"})]
    out += [
        Setting(f"fixed {w:g}", "fixed", {"policy": "fixed", "max_wait_ms": float(w)})
        for w in waits
    ]
    adaptive = {"policy": "adaptive", "latency_slo_ms": SLO_MS}
    out.append(Setting("adaptive", "adaptive", {**adaptive, "max_wait_ms": SLO_MS}))
    out.append(Setting("adaptive/5", "adaptive", {**adaptive, "max_wait_ms": 5.0}))
    return out


def cost_curve(model: Any, row: np.ndarray, sizes: Sequence[int], reps: int) -> dict[int, float]:
    """Median seconds of one model call per batch size, sizes interleaved within each rep."""
    batches = {b: np.stack([row] * b) for b in sizes}
    for batch in batches.values():
        model(batch)
    times: dict[int, list[float]] = {b: [] for b in sizes}
    for _ in range(reps):
        for b, batch in batches.items():
            t0 = time.perf_counter()
            model(batch)
            times[b].append(time.perf_counter() - t0)
    return {b: _bench.median(ts) for b, ts in times.items()}


class Record:
    """What happened to each request of one run, indexed like its offsets (seconds)."""

    def __init__(self, offsets: np.ndarray, carpool: Any) -> None:
        n = len(offsets)
        self.offsets = offsets
        self._carpool = carpool  # its error classes, to sort outcomes
        self.done = np.full(n, np.nan)  # answer, seconds after the run's start
        self.code = np.zeros(n, np.int8)
        self.reject = np.full(n, np.nan)  # seconds from the send to the rejection
        self.lag = np.full(n, np.nan)  # seconds from the scheduled to the actual send

    def settle(self, i: int, sent: float, start: float, error: BaseException | None) -> None:
        now = time.perf_counter()
        if error is None:
            self.done[i] = now - start
            self.code[i] = SERVED
        elif isinstance(error, self._carpool.Overloaded):
            self.reject[i] = now - sent
            self.code[i] = OVERLOADED
        elif isinstance(error, self._carpool.QueueFull):
            self.reject[i] = now - sent
            self.code[i] = QUEUE_FULL
        elif isinstance(error, self._carpool.DeadlineExceeded):
            self.code[i] = EXPIRED
        else:
            raise error


def drive(
    carpool: Any,
    model: Any,
    row: np.ndarray,
    setting: Setting,
    offsets: np.ndarray,
    warm_s: float,
    end_s: float,
    client: str,
    *,
    warm_start: bool = True,
) -> tuple[Record, Any, Any]:
    """Send one row per offset in ``[0, end_s)`` through a fresh batcher; the record and the
    batcher's stats at ``warm_s`` and at ``end_s``. What is unanswered at ``end_s`` is
    cancelled (its answer would fall outside the window anyway). With ``warm_start`` one
    request is answered before the clock starts (after the batcher's warm-up profile)."""
    offsets = offsets[offsets < end_s]
    options = {"max_batch_size": MAX_BATCH, "warmup": row, **setting.options}
    run = Run(carpool, model, row, options, offsets, warm_s, end_s, warm_start)
    if client == "loop":
        return asyncio.run(_drive_loop(run))
    return _drive_thread(run)


class Run(NamedTuple):
    """One cell's run, as both clients take it: the batcher to build, the send times."""

    carpool: Any  # the module: its Batcher and error classes
    model: Any
    row: np.ndarray
    options: dict[str, Any]  # Batcher options
    offsets: np.ndarray  # send times in seconds from the start, those before end_s
    warm_s: float  # the window opens
    end_s: float  # ... and closes: what is unanswered then is cancelled
    warm_start: bool  # one request answered before the clock starts


async def _drive_loop(run: Run) -> tuple[Record, Any, Any]:
    """The client is tasks on the batcher's own loop, each ``await b.infer(row)``."""
    carpool, model, row, options, offsets, warm_s, end_s, warm_start = run
    rec = Record(offsets, carpool)
    perf = time.perf_counter
    sleep = asyncio.sleep
    async with carpool.Batcher(model, **options) as b:
        if warm_start:
            with contextlib.suppress(carpool.Overloaded):  # a box too slow for the objective
                await b.infer(row)  # answered after the warm-up profile: the cost model is warm
        start = perf() + 0.002
        settle = rec.settle

        async def one(i: int) -> None:
            sent = perf()
            rec.lag[i] = sent - start - offsets[i]
            try:
                await b.infer(row)
            except (carpool.QueueFull, carpool.DeadlineExceeded) as exc:
                settle(i, sent, start, exc)
            else:
                settle(i, sent, start, None)

        before = None
        n, i = len(offsets), 0
        async with asyncio.TaskGroup() as tg:
            pending: set[asyncio.Task[None]] = set()  # only the unanswered: no heap growth
            while True:
                now = perf() - start
                if before is None and now >= warm_s:
                    before = b.stats()
                if now >= end_s:
                    break
                while i < n and offsets[i] <= now:
                    task = tg.create_task(one(i))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                    i += 1
                nxt = min(
                    offsets[i] if i < n else end_s, end_s, warm_s if before is None else end_s
                )
                await sleep(max(0.0, nxt - (perf() - start)))
            after = b.stats()
            for task in pending:
                task.cancel()
    return rec, before, after


def _drive_thread(run: Run) -> tuple[Record, Any, Any]:
    """The client is this thread calling ``b.submit(row)``; the batcher runs on its own loop
    thread (``with Batcher``), answers are timed by done-callbacks in that thread."""
    carpool, model, row, options, offsets, warm_s, end_s, warm_start = run
    rec = Record(offsets, carpool)
    perf = time.perf_counter

    pending: set[Any] = set()  # only the unanswered: no heap growth

    def settled(i: int, sent: float, start: float, fut: Any) -> None:
        pending.discard(fut)
        if not fut.cancelled():
            rec.settle(i, sent, start, fut.exception())

    with carpool.Batcher(model, **options) as b:
        if warm_start:
            with contextlib.suppress(carpool.Overloaded):  # as the loop client's
                b.submit(row).result()
        start = perf() + 0.002
        before = None
        for i, off in enumerate(offsets):
            if before is None and off >= warm_s:
                _sleep_until(start + warm_s)
                before = b.stats()
            _sleep_until(start + off)
            sent = perf()
            rec.lag[i] = sent - start - off
            fut = b.submit(row)
            pending.add(fut)
            fut.add_done_callback(partial(settled, i, sent, start))
        if before is None:
            _sleep_until(start + warm_s)
            before = b.stats()
        _sleep_until(start + end_s)
        after = b.stats()
        for fut in list(pending):
            fut.cancel()
    return rec, before, after


def _sleep_until(t: float) -> None:
    delay = t - time.perf_counter()
    if delay > 0:
        time.sleep(delay)


@dataclass
class Cell:
    """One setting under one load, over the measurement window ``[warm_s, end_s)``:
    answers that came back in the window, requests sent in it."""

    latency_s: np.ndarray  # scheduled send -> answer, of answers in the window
    window_s: float
    sent: int
    rejected: int
    overloaded: int
    reject_s: np.ndarray  # send -> rejection
    expired: int
    lag_p99_s: float
    mean_batch: float
    curve: str

    @classmethod
    def of(cls, rec: Record, before: Any, after: Any, warm_s: float, end_s: float) -> Cell:
        in_window = (rec.done >= warm_s) & (rec.done < end_s)
        sent = (rec.offsets >= warm_s) & (rec.offsets < end_s)
        rejected = sent & ((rec.code == OVERLOADED) | (rec.code == QUEUE_FULL))
        lags = rec.lag[sent & ~np.isnan(rec.lag)]
        batches = after.batches - before.batches
        rows = after.rows - before.rows
        return cls(
            latency_s=(rec.done - rec.offsets)[in_window],
            window_s=end_s - warm_s,
            sent=int(sent.sum()),
            rejected=int(rejected.sum()),
            overloaded=int((sent & (rec.code == OVERLOADED)).sum()),
            reject_s=rec.reject[rejected],
            expired=after.expired - before.expired,
            lag_p99_s=percentile(lags, 99),
            mean_batch=rows / batches if batches else float("nan"),
            curve=str(after.cost_curve) if after.cost_curve is not None else "",
        )

    def pct(self, q: float) -> float:
        """Latency percentile of the served requests, ms."""
        return percentile(self.latency_s, q) * 1e3

    @property
    def throughput(self) -> float:
        return len(self.latency_s) / self.window_s

    @property
    def goodput(self) -> float:
        return float((self.latency_s <= SLO_MS / 1e3).sum()) / self.window_s

    @property
    def reject_p99_ms(self) -> float:
        return percentile(self.reject_s, 99) * 1e3


def plot(
    path: str,
    models: Sequence[str],
    loads: Sequence[float],
    series: Callable[[str, str], tuple[list[float], list[float]]],
) -> None:
    """p99 (log) and goodput against offered load, one column per model; ``series(model,
    name)`` gives (p99 ms, goodput as a fraction of capacity) per load for eager, best fixed
    and adaptive."""
    from matplotlib.figure import Figure  # an ImportError: --plot needs matplotlib

    fig = Figure(figsize=(5.5 * len(models), 7.5), dpi=110, layout="constrained")
    axes = fig.subplots(2, len(models), squeeze=False, sharex=True)
    x = [100 * f for f in loads]
    ticks = [f"{v:g}%" if v < 100 else f"{v:g}%\n({'sat' if v < 200 else '2x'})" for v in x]
    styles = {
        "eager": ("tab:gray", "s"),
        "best fixed": ("tab:blue", "^"),
        "adaptive": ("tab:red", "o"),
    }
    for col, model in enumerate(models):
        top, bottom = axes[0][col], axes[1][col]
        for name, (color, marker) in styles.items():
            p99, good = series(model, name)
            top.plot(x, p99, color=color, marker=marker, label=name)
            bottom.plot(x, [100 * g for g in good], color=color, marker=marker, label=name)
        top.axhline(
            SLO_MS, color="black", linestyle=":", linewidth=1, label=f"objective {SLO_MS:g} ms"
        )
        top.set_yscale("log")
        top.set_ylabel("p99 latency of served requests (ms)")
        top.set_title(f"{model}: p99 vs offered load")
        ideal = [min(v, 100.0) for v in x]
        bottom.plot(
            x, ideal, color="black", linestyle=":", linewidth=1, label="ideal min(offered, 100%)"
        )
        bottom.set_ylabel(f"goodput: answers within {SLO_MS:g} ms (% of capacity)")
        bottom.set_xlabel("offered load (% of capacity, Poisson arrivals)")
        bottom.set_title(f"{model}: goodput vs offered load")
        for ax in (top, bottom):
            ax.set_xticks(x, ticks)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize="small")
    fig.savefig(path)
