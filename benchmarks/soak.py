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
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _bench
import _process
import _soak
import aiohttp

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


# ------------------------------------------------------------------------------ server


@dataclass(frozen=True)
class Proc:
    """The server process as /proc and /metrics see it."""

    rss_mb: float
    fds: int
    sockets: int  # of the fds: the listening socket and one per client connection
    threads: int
    tasks: float
    cpu_s: float

    @property
    def files(self) -> int:
        """The fds that are not sockets: under load, flat exactly unless something leaks."""
        return self.fds - self.sockets


async def observe(scrape: aiohttp.ClientSession, server: _process.Server) -> Proc:
    async with scrape.get(server.base + "/metrics") as r:
        text = await r.text()
    gauge = "carpool_event_loop_tasks "
    tasks = [float(line.split()[1]) for line in text.splitlines() if line.startswith(gauge)]
    rss_mb, fds, sockets, threads = _from_proc(server.pid)
    cpu_s = _process.cpu_seconds(server.pid)
    return Proc(rss_mb, fds, sockets, threads, tasks[0] if tasks else float("nan"), cpu_s)


def _from_proc(pid: int) -> tuple[float, int, int, int]:
    """RSS in MB, open fds, the sockets among them, and threads of ``pid``."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    rss_mb = int(fields["VmRSS"].split()[0]) / 1024
    fds = sockets = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        fds += 1
        try:
            sockets += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except OSError:  # closed meanwhile
            pass
    return rss_mb, fds, sockets, int(fields["Threads"])


async def settle(scrape: aiohttp.ClientSession, server: _process.Server, fds: int) -> Proc:
    """The server idle: once its fds are back to ``fds`` (connections closed), or 10 s."""
    deadline = time.monotonic() + 10.0
    while True:
        proc = await observe(scrape, server)
        if proc.fds <= fds or time.monotonic() > deadline:
            return proc
        await asyncio.sleep(0.2)


# ------------------------------------------------------------------------------ load


async def capacity(
    server: _process.Server, warmup: float, window: float, tally: _soak.Tally, bodies: _soak.Bodies
) -> float:
    """Answers per second of good requests from CLIENTS closed-loop callers."""
    loop = asyncio.get_running_loop()
    opens = loop.time() + warmup
    closes = opens + window
    counted = [0]

    async def caller(i: int, session: aiohttp.ClientSession) -> None:
        rng = random.Random(1000 + i)
        n = 0
        while loop.time() < closes:
            n += 1
            a = _soak.draw(rng, -(i * 1_000_000 + n), good_only=True)
            if await _soak.send(session, server.base, a, bodies, tally) == _soak.OK:
                counted[0] += opens <= loop.time() < closes

    async with _session(CLIENTS) as session, asyncio.TaskGroup() as tg:
        for i in range(CLIENTS):
            tg.create_task(caller(i, session))
    return counted[0] / window


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


@dataclass
class Soak:
    """What the open-loop run recorded."""

    start: float = 0.0
    scheduled: array[float] = field(default_factory=lambda: array("d"))  # s in, of each OK
    latency: array[float] = field(default_factory=lambda: array("d"))  # from scheduled send
    lag: array[float] = field(default_factory=lambda: array("d"))  # launch - scheduled, all
    outcomes: Counter[str] = field(default_factory=Counter)  # since the last row
    ok_latencies: list[float] = field(default_factory=list)  # since the last row
    samples: list[tuple[float, Proc]] = field(default_factory=list)  # (s in, the server)
    rows: list[Row] = field(default_factory=list)


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

    async def sampler(before: Proc) -> None:
        print(_line(COLUMNS))
        k, since = 1, 0
        while k * SAMPLE_S <= duration + 1e-6:
            await asyncio.sleep(max(0.0, run.start + k * SAMPLE_S - loop.time()))
            t, proc = k * SAMPLE_S, await observe(scrape, server)
            run.samples.append((t, proc))
            k += 1
            if t < (len(run.rows) + 1) * every - 1e-6:
                continue
            these = [p for _, p in run.samples[since:]]
            since = len(run.samples)
            ok = run.ok_latencies
            cpu = (proc.cpu_s - before.cpu_s) / (t - (run.rows[-1].t if run.rows else 0.0))
            means = [statistics.fmean(getattr(p, name) for p in these) for name in _SAMPLED]
            row = Row(t, proc, cpu, run.outcomes, _ms(ok, 50), _ms(ok, 99), *means)
            run.outcomes, run.ok_latencies, before = Counter(), [], proc
            print(_line(_cells(row)))
            run.rows.append(row)

    async with _session(POOL) as session, asyncio.TaskGroup() as tg:
        first = await observe(scrape, server)
        run.start = at = loop.time()
        tg.create_task(sampler(first))
        n = 0
        while True:
            at += rng.expovariate(rate)
            if at - run.start >= duration:
                break
            await asyncio.sleep(max(0.0, at - loop.time()))
            n += 1
            tg.create_task(one(_soak.draw(rng, n), at, session))
    return run


def _session(connections: int) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=connections, keepalive_timeout=KEEPALIVE_S),
        timeout=aiohttp.ClientTimeout(total=_soak.ANSWER_WITHIN_S),
    )


# ------------------------------------------------------------------------------ report

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
    return _bench.percentile(list(latencies), q) * 1000.0


def report(run: Soak, window: float, duration: float, idle: tuple[Proc, Proc]) -> None:
    """The figures over time, and a verdict per goal."""
    first = [p for t, p in run.samples if t <= window + 1e-6]
    last = [p for t, p in run.samples if t > duration - window + 1e-6]
    w = f"{window:g} s"
    rss_1, rss_end = first[-1].rss_mb, last[-1].rss_mb
    growth = (rss_end - rss_1) / rss_1
    print()
    print(
        f"RSS at {w}: {rss_1:.1f} MB, at the end ({duration:g} s): {rss_end:.1f} MB: growth "
        f"{growth:+.1%} (goal < 5 %: {_bench.verdict(growth, 0.05, higher_is_better=False)})"
    )
    before, after = idle
    # Sockets follow the client's connection pool; any other fd that grows is a leak, and
    # a socket left open shows once the client has closed its connections.
    files_early, files_late = max(p.files for p in first), max(p.files for p in last)
    flat = files_late <= files_early and after.fds <= before.fds
    print(
        f"fds: first {w} mean {_mean(first, 'fds'):.1f}, last {w} mean "
        f"{_mean(last, 'fds'):.1f}, max {max(p.fds for _, p in run.samples)} (sockets: "
        f"{_mean(first, 'sockets'):.1f}, {_mean(last, 'sockets'):.1f}; others: max "
        f"{files_early}, {files_late}); idle before the load {before.fds}, after it "
        f"{after.fds} (goal flat: {'met' if flat else 'MISSED'})"
    )
    early, late = _mean(first, "tasks"), _mean(last, "tasks")
    flat = late <= 1.1 * early + 2 and after.tasks <= before.tasks
    print(
        f"tasks: first {w} mean {early:.1f}, last {w} mean {late:.1f}, max "
        f"{max(p.tasks for _, p in run.samples):g}; idle before the load {before.tasks:g}, "
        f"after it {after.tasks:g} (goal flat: {'met' if flat else 'MISSED'})"
    )
    p99_first = _p99(run, 0.0, window)
    p99_last = _p99(run, duration - window, duration)
    ratio = p99_last / p99_first
    print(
        f"p99 first {w}: {p99_first:.2f} ms, last {w}: {p99_last:.2f} ms: last/first "
        f"{ratio:.2f} (goal <= 1.20: {_bench.verdict(ratio, 1.2, higher_is_better=False)})"
    )
    lag = _bench.percentile(list(run.lag), 99) * 1000.0
    print(f"client send lag p99 {lag:.2f} ms (latency counts from the scheduled send)")


def _mean(procs: list[Proc], name: str) -> float:
    return statistics.fmean(getattr(p, name) for p in procs)


def _p99(run: Soak, start: float, end: float) -> float:
    picked = [lat for at, lat in zip(run.scheduled, run.latency, strict=True) if start <= at < end]
    return _bench.percentile(picked, 99) * 1000.0


# Outcome labels of carpool_requests_total by status (docs/server.md, Metrics).
_LABELS = {
    200: "success",
    400: "invalid",
    404: "not_found",
    413: "too_large",
    415: "unsupported_encoding",
    499: "client_closed",
    500: "error",
    503: "unavailable",
    504: "timeout",
}
_BEFORE_BATCHER = ("invalid", "not_found", "too_large", "unsupported_encoding")


def accounting(metrics: str, tallies: list[_soak.Tally]) -> bool:
    """The server's books against the client's, exactly; prints each check."""
    from prometheus_client.parser import text_string_to_metric_families

    http: Counter[str] = Counter()
    batcher: Counter[str] = Counter()
    gauges: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics):
        for s in family.samples:
            if s.labels.get("model") != _soak.MODEL:
                continue
            if s.name == "carpool_requests_total":
                http[s.labels["outcome"]] += int(s.value)
            elif s.name == "carpool_batcher_requests_total":
                batcher[s.labels["outcome"]] += int(s.value)
            elif s.name in ("carpool_requests_in_flight", "carpool_queue_rows"):
                gauges[s.name] = s.value
    sent = sum(t.sent[_soak.MODEL] for t in tallies)
    answered: Counter[str] = Counter()
    for t in tallies:
        for status, count in t.model_statuses.items():
            answered[_LABELS.get(status, str(status))] += count
    outcomes = sum((t.outcomes for t in tallies), Counter[str]())
    cancelled = outcomes[_soak.CANCELLED]
    received = sum(http.values()) - sum(http[o] for o in _BEFORE_BATCHER)
    ended = sum(batcher[o] for o in ("completed", "failed", "expired", "cancelled", "rejected"))
    pending = int(gauges.get("carpool_requests_in_flight", -1))
    server_5xx = sum(v for k, v in http.items() if k in ("error", "timeout"))
    checks = [
        (
            f"server counted every request sent to {_soak.MODEL!r}: {sum(http.values())} == {sent}",
            sum(http.values()) == sent,
        ),
        (
            f"answers under their status, cancellations under one each: {dict(http)} - "
            f"{dict(answered)} = {cancelled} cancelled",
            all(http[k] >= v for k, v in answered.items())
            and sum(http.values()) - sum(answered.values()) == cancelled,
        ),
        (
            f"batcher received {received} == completed + failed + expired + cancelled + "
            f"rejected + in flight = {ended} + {pending}",
            received == ended + pending,
        ),
        (
            f"503s {http['unavailable']} == expired + rejected = "
            f"{batcher['expired'] + batcher['rejected']}",
            http["unavailable"] == batcher["expired"] + batcher["rejected"],
        ),
        (
            f"nothing left: in flight {pending}, queued rows "
            f"{gauges.get('carpool_queue_rows', -1):g}",
            pending == 0 and gauges.get("carpool_queue_rows") == 0,
        ),
    ]
    print()
    print(f"client outcomes: {dict(outcomes)}")
    print(f"batcher outcomes: {dict(batcher)}")
    for text, ok in checks:
        print(f"  [{'ok' if ok else 'FAILED'}] {text}")
    lost = outcomes[_soak.LOST]
    unexpected = outcomes[_soak.WRONG] + outcomes[_soak.UNEXPECTED]
    print(f"lost requests: {lost}")
    print(f"unexpected answers: {unexpected}; server 5xx other than 503: {server_5xx}")
    for surprise in (s for t in tallies for s in t.surprises):
        print(f"  {surprise}")
    good = all(ok for _, ok in checks) and lost == 0 and unexpected == 0 and server_5xx == 0
    print(f"accounting: {'ok' if good else 'FAILED'}")
    return good


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
    report(result, window, duration, (idle_before, idle_after))
    accounting(metrics, [warm, soaked])


def main() -> int:
    args = parse_args()
    return _bench.run_reported("soak", lambda: asyncio.run(run(args)))


if __name__ == "__main__":
    sys.exit(main())
