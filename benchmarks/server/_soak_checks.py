"""``soak.py``'s checks (not a benchmark itself): what the open-loop run recorded, a verdict
per goal (RSS growth, flat fds and tasks, p99 drift), and the server's books against the
client's, exactly.

The goals are judged on the run's record (:class:`Soak`) and the server's samples; the
accounting on ``/metrics`` read once the load has ended (prometheus_client's parser) and
the client's tallies (``_soak.Tally``). Both print their lines; nothing here sends.
"""

from __future__ import annotations

import statistics
from array import array
from collections import Counter
from dataclasses import dataclass, field

import _bench
import _soak
from _soak_server import Proc

_bench.import_carpool()

from carpool.bench.report.data import percentile  # noqa: E402


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


def goals(run: Soak, window: float, duration: float, idle: tuple[Proc, Proc]) -> None:
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
    lag = percentile(run.lag, 99) * 1000.0
    print(f"client send lag p99 {lag:.2f} ms (latency counts from the scheduled send)")


def _mean(procs: list[Proc], name: str) -> float:
    return statistics.fmean(getattr(p, name) for p in procs)


def _p99(run: Soak, start: float, end: float) -> float:
    picked = [lat for at, lat in zip(run.scheduled, run.latency, strict=True) if start <= at < end]
    return percentile(picked, 99) * 1000.0


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
    http, batcher, gauges = _books(metrics)
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
    return _verdict(checks, outcomes, batcher, server_5xx, tallies)


def _books(metrics: str) -> tuple[Counter[str], Counter[str], dict[str, float]]:
    """The model's requests by outcome as the server and as its batcher counted them, and
    the in-flight and queue gauges, from a ``/metrics`` text."""
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
    return http, batcher, gauges


def _verdict(
    checks: list[tuple[str, bool]],
    outcomes: Counter[str],
    batcher: Counter[str],
    server_5xx: int,
    tallies: list[_soak.Tally],
) -> bool:
    """Each check printed, the surprises, and the one line the tests look for."""
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
