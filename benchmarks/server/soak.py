"""Soak: ``carpool serve demo`` for 10 minutes at 70 % of its measured capacity, the whole mix
(rows, encodings, priorities, queue timeouts, bad requests, cancellations) open loop: RSS,
fds, tasks and p99 over time (goals), and the server's books against the client's (checks).

    python -m benchmarks.server.soak [--quick] [--duration S] [--interval S]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.harness import Figures, common, run
from benchmarks.harness import processes as _process
from benchmarks.server import _soak_checks
from benchmarks.server import _soak_traffic as _soak
from benchmarks.server._soak_checks import Soak
from benchmarks.server._soak_server import Proc, observe, settle
from carpool.bench.callers import closed_window
from carpool.bench.report.data import percentile

LOAD = 0.70  # of the measured capacity
CLIENTS = 64  # closed-loop callers of the capacity step: enough to keep batches full
POOL = 256  # the soak client's connections at most
SAMPLE_S = 1.0  # the server's figures every second; a row every --interval shows their means
_SAMPLED = ("fds", "sockets", "tasks")  # a row's means of these
KEEPALIVE_S = 2.0  # the client drops idle connections before uvicorn's 5 s keep-alive does
CONFIG = """\
[models.demo]
max_batch_size = 32
priority_levels = 3
default_priority_level = 2
max_queue_size = 2048  # rows: ~20x what waits at 70 % load; a burst is refused, not queued
"""


def parser() -> argparse.ArgumentParser:
    p = common.base_parser(__doc__, default_cpus="0,1")
    p.add_argument("--duration", type=float, default=None, help="seconds of soak (600)")
    p.add_argument("--interval", type=float, default=None, help="seconds between rows")
    p.add_argument("--load", type=float, default=LOAD, help="share of capacity (0.70)")
    p.add_argument("--seed", type=int, default=0)
    return p


# ------------------------------------------------------------------------------ load


async def capacity(
    server: _process.Server, warmup: float, window: float, tally: _soak.Tally, bodies: _soak.Bodies
) -> float:
    """Answers per second of good requests from CLIENTS closed-loop callers."""
    rng = random.Random(1000)

    async with _session(CLIENTS) as session:

        async def send(i: int) -> str | None:
            a = _soak.draw(rng, -(i + 1), good_only=True)
            outcome = await _soak.send(session, server.base, a, bodies, tally)
            return None if outcome == _soak.OK else outcome

        done = await closed_window(
            send, callers=CLIENTS, warmup_s=warmup, seconds=window, read=lambda: None
        )
    return done.tally.answered / window


@dataclass(frozen=True)
class Row:
    """One sample: the time into the soak, the server, and the requests that ended since
    the last row."""

    t: float
    proc: Proc
    cpu: float  # the server's CPU over the interval, as a share of one core
    outcomes: Counter[str]
    p50_ms: float  # of the answers that came back in the interval
    p99_ms: float
    fds: float  # means over the interval's samples (one a second)
    sockets: float
    tasks: float


async def soak(
    server: _process.Server,
    scrape: aiohttp.ClientSession,
    rate: float,
    duration: float,
    every: float,
    seed: int,
    tally: _soak.Tally,
    bodies: _soak.Bodies,
) -> Soak:
    """Poisson arrivals of the mix at ``rate`` for ``duration`` s; a row every ``every``."""
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    run = Soak()
    host, port = server.base.removeprefix("http://").split(":")

    async def one(a: _soak.Arrival, at: float, session: aiohttp.ClientSession) -> None:
        run.lag.append(loop.time() - at)
        if a.cancel_after_s is not None:
            outcome = await _soak.cancel(host, int(port), a, bodies, tally)
        else:
            outcome = await _soak.send(session, server.base, a, bodies, tally)
        run.outcomes[outcome] += 1
        if outcome == _soak.OK:
            latency = loop.time() - at
            run.scheduled.append(at - run.start)
            run.latency.append(latency)
            run.ok_latencies.append(latency)

    async with _session(POOL) as session, asyncio.TaskGroup() as tg:
        first = await observe(scrape, server)
        run.start = at = loop.time()
        tg.create_task(sampler(run, server, scrape, first, duration, every))
        n = 0
        while True:
            at += rng.expovariate(rate)
            if at - run.start >= duration:
                break
            await asyncio.sleep(max(0.0, at - loop.time()))
            n += 1
            tg.create_task(one(_soak.draw(rng, n), at, session))
    return run


async def sampler(
    run: Soak,
    server: _process.Server,
    scrape: aiohttp.ClientSession,
    before: Proc,
    duration: float,
    every: float,
) -> None:
    """The server sampled every SAMPLE_S into ``run``; a row printed every ``every``."""
    loop = asyncio.get_running_loop()
    print(_line(COLUMNS))
    rows: list[Row] = []
    k, since = 1, 0
    while k * SAMPLE_S <= duration + 1e-6:
        await asyncio.sleep(max(0.0, run.start + k * SAMPLE_S - loop.time()))
        t, proc = k * SAMPLE_S, await observe(scrape, server)
        run.samples.append((t, proc))
        k += 1
        if t < (len(rows) + 1) * every - 1e-6:
            continue
        these = [p for _, p in run.samples[since:]]
        since = len(run.samples)
        ok = run.ok_latencies
        cpu = (proc.cpu_s - before.cpu_s) / (t - (rows[-1].t if rows else 0.0))
        means = [statistics.fmean(getattr(p, name) for p in these) for name in _SAMPLED]
        row = Row(t, proc, cpu, run.outcomes, _ms(ok, 50), _ms(ok, 99), *means)
        run.outcomes, run.ok_latencies, before = Counter(), [], proc
        print(_line(_cells(row)))
        rows.append(row)
        run.rows.append(t)


def _session(connections: int) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=connections, keepalive_timeout=KEEPALIVE_S),
        timeout=aiohttp.ClientTimeout(total=_soak.ANSWER_WITHIN_S),
    )


# ------------------------------------------------------------------------------ the table

COLUMNS = ("t s", "sent", "ok", "expired", "full", "4xx", "cancel", "bad", "p50 ms", "p99 ms",
           "RSS MB", "fds", "sockets", "tasks", "threads", "cpu")  # fmt: skip
WIDTHS = (6, 6, 6, 7, 5, 4, 6, 4, 7, 7, 7, 5, 7, 6, 7, 5)


def _line(cells: Any) -> str:
    return "  ".join(str(c).rjust(w) for c, w in zip(cells, WIDTHS, strict=True))


def _cells(row: Row) -> list[Any]:
    o, p = row.outcomes, row.proc
    bad = o[_soak.WRONG] + o[_soak.UNEXPECTED] + o[_soak.LOST]
    return [
        f"{row.t:g}",
        sum(o.values()),
        o[_soak.OK],
        o[_soak.EXPIRED],
        o[_soak.QUEUE_FULL],
        o[_soak.REFUSED],
        o[_soak.CANCELLED],
        bad,
        f"{row.p50_ms:.2f}",
        f"{row.p99_ms:.2f}",
        f"{p.rss_mb:.1f}",
        f"{row.fds:.0f}",
        f"{row.sockets:.0f}",
        common.fmt_num(row.tasks),
        p.threads,
        f"{row.cpu:.0%}",
    ]


def _ms(latencies: Any, q: float) -> float:
    return percentile(latencies, q) * 1000.0


# ------------------------------------------------------------------------------ main


def measure(args: argparse.Namespace) -> Figures:
    return asyncio.run(soak_run(args))


async def soak_run(args: argparse.Namespace) -> Figures:
    """The server started with the soak's config, soaked, stopped: its figures."""
    figures = Figures()
    cores = _process.split_cpus(args.cpus)
    _process.pin_self(cores.client)  # this process is the client
    duration = args.duration or (6.0 if args.quick else 600.0)
    every = args.interval or max(1.0, min(10.0, duration / 12))
    window = min(60.0, duration / 4)
    cap_warmup, cap_window = (1.0, 2.0) if args.quick else (2.0, min(10.0, duration / 12))
    common.header(
        "soak: carpool serve demo under a mixed open-loop load",
        {
            "cores": cores,
            "duration": duration,
            "interval": every,
            "load": args.load,
            "window": window,
            "seed": args.seed,
        },
    )
    with tempfile.TemporaryDirectory(prefix="carpool-soak-") as folder:
        config = Path(folder) / "carpool.toml"
        config.write_text(CONFIG)
        server = _process.carpool_serve("demo", "--config", str(config), cpus=cores.server)
        try:
            server.wait_ready()
            cap = (cap_warmup, cap_window)
            await soak_server(server, args, duration, every, window, cap, figures)
        finally:
            server.stop()
    print(f"server exit code: {server.proc.returncode}")
    figures.add("server_exit_code", server.proc.returncode)
    return figures


async def soak_server(
    server: _process.Server,
    args: Any,
    duration: float,
    every: float,
    window: float,
    cap: tuple[float, float],
    figures: Figures,
) -> None:
    bodies = _soak.Bodies(args.seed)
    warm, soaked = _soak.Tally(), _soak.Tally()
    async with aiohttp.ClientSession() as scrape:  # one connection, open throughout
        start = await observe(scrape, server)
        cpu0, t0 = start.cpu_s, time.monotonic()
        rps = await capacity(server, *cap, warm, bodies)
        share = (_process.cpu_seconds(server.pid) - cpu0) / (time.monotonic() - t0)
        rate = args.load * rps
        print(
            f"capacity: {rps:,.0f} req/s of the mix's good requests ({CLIENTS} closed-loop "
            f"callers, server CPU {share:.0%}); soak at {args.load:.0%}: {rate:,.0f} req/s"
        )
        idle_before = await settle(scrape, server, start.fds)
        print(
            f"idle: fds {idle_before.fds}, tasks {idle_before.tasks:g}, "
            f"RSS {idle_before.rss_mb:.1f} MB"
        )
        figures.add("capacity_req_per_s", rps, "req/s")
        figures.add("capacity_server_cpu", share, "cores")
        figures.add("soak_req_per_s", rate, "req/s")
        print()
        result = await soak(server, scrape, rate, duration, every, args.seed, soaked, bodies)
        idle_after = await settle(scrape, server, idle_before.fds)
        async with scrape.get(server.base + "/metrics") as r:
            metrics = await r.text()
    figures.add("table_rows", len(result.rows))
    figures.add("last_row_s", result.rows[-1] if result.rows else float("nan"), "s")
    figures.add("samples", len(result.samples))
    _soak_checks.goals(result, window, duration, (idle_before, idle_after), figures)
    _soak_checks.accounting(metrics, [warm, soaked], figures)


if __name__ == "__main__":
    raise SystemExit(run(measure, parser()))
