"""Soak: ``carpool serve`` for 10 minutes at about 70 % of its capacity, with everything mixed.

What: ``carpool serve demo`` (the numpy MLP; 3 priority levels, a bounded queue) on the
server core; its capacity for the mix measured first (closed loop, 64 callers), then an
open-loop Poisson arrival at 70 % of it from this process on the client core (aiohttp):
1..8 rows a request, JSON or binary, random priorities, 10 % with a short queue ``timeout``
(some expire), 2 % bad requests (wrong shape, wrong datatype, unknown model, malformed JSON:
4xx), 2 % cancelled (the client closes its connection before the answer; see ``_soak.py``).
The server is sampled every second: RSS, open fds and the sockets among them (``/proc``),
event-loop tasks (``carpool_event_loop_tasks``), threads, CPU; every ``--interval`` s a row
shows the requests that ended, p50/p99 of the answers and the samples' means. Latency runs
from each request's scheduled send time, so a lagging client hides nothing.

Goals: RSS growth after the first minute < 5 %; fds flat (the fds other than sockets peak no
higher in the last minute than in the first; sockets follow the client's connection pool;
as many fds idle after the load as before it); tasks flat (the last minute's mean within
10 % (+2) of the first's, as many idle after as before); p99 of the last minute within 20 %
of the first. Shorter runs (``--duration``) use a quarter of the run for "minute".

Accounting, from ``/metrics`` at the end: the server counted every request sent to the model
once; what the batcher received equals completed + failed + expired + cancelled + rejected
+ in flight; every request got one answer or ended in a close the client made itself; 0
lost, 0 unexpected statuses. Exits 0 whatever it finds.

Here: the capacity step, the open-loop run and its live table. The traffic (the mix, its
bodies, one request sent and classified) is ``_soak.py``'s; the server's samples
``_soak_server.py``'s; the verdicts and the accounting ``_soak_checks.py``'s.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _bench
import _process
import _soak
import _soak_checks
import aiohttp
from _soak_checks import Soak
from _soak_server import Proc, observe, settle

_bench.import_carpool()

from carpool.bench.callers import closed_window  # noqa: E402
from carpool.bench.report.data import percentile  # noqa: E402

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


def parse_args() -> Any:
    p = _bench.base_parser(__doc__, default_cpus="0,1")
    p.add_argument("--duration", type=float, default=None, help="seconds of soak (600)")
    p.add_argument("--interval", type=float, default=None, help="seconds between rows")
    p.add_argument("--load", type=float, default=LOAD, help="share of capacity (0.70)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


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
        _bench.fmt_num(row.tasks),
        p.threads,
        f"{row.cpu:.0%}",
    ]


def _ms(latencies: Any, q: float) -> float:
    return percentile(latencies, q) * 1000.0


# ------------------------------------------------------------------------------ main


async def run(args: Any) -> None:
    cores = _process.split_cpus(args.cpus)
    _process.pin_self(cores.client)  # this process is the client
    duration = args.duration or (6.0 if args.quick else 600.0)
    every = args.interval or max(1.0, min(10.0, duration / 12))
    window = min(60.0, duration / 4)
    cap_warmup, cap_window = (1.0, 2.0) if args.quick else (2.0, min(10.0, duration / 12))
    _bench.header(
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
            await soak_server(server, args, duration, every, window, (cap_warmup, cap_window))
        finally:
            server.stop()
    print(f"server exit code: {server.proc.returncode}")


async def soak_server(
    server: _process.Server,
    args: Any,
    duration: float,
    every: float,
    window: float,
    cap: tuple[float, float],
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
        print()
        result = await soak(server, scrape, rate, duration, every, args.seed, soaked, bodies)
        idle_after = await settle(scrape, server, idle_before.fds)
        async with scrape.get(server.base + "/metrics") as r:
            metrics = await r.text()
    _soak_checks.goals(result, window, duration, (idle_before, idle_after))
    _soak_checks.accounting(metrics, [warm, soaked])


def main() -> int:
    args = parse_args()
    return _bench.run_reported("soak", lambda: asyncio.run(run(args)))


if __name__ == "__main__":
    sys.exit(main())
