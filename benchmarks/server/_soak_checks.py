"""``soak``'s verdicts: what the open-loop run recorded, a figure and goal per trend (RSS
growth, flat fds and tasks, p99 drift), and the server's books (``/metrics``, read once the
load has ended) against the client's tallies, exactly: a check each. Prints its lines.
"""

from __future__ import annotations

import statistics
from array import array
from collections import Counter
from dataclasses import dataclass, field

from benchmarks.harness import Figures, common
from benchmarks.server import _soak_traffic as _soak
from benchmarks.server._soak_server import Proc
from carpool.bench.report.data import percentile


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
    rows: list[float] = field(default_factory=list)  # s in, of each row of the table


def goals(
    run: Soak, window: float, duration: float, idle: tuple[Proc, Proc], figures: Figures
) -> None:
    """The figures over time, and a verdict per goal."""
    first = [p for t, p in run.samples if t <= window + 1e-6]
    last = [p for t, p in run.samples if t > duration - window + 1e-6]
    w = f"{window:g} s"
    rss_1, rss_end = first[-1].rss_mb, last[-1].rss_mb
    growth = (rss_end - rss_1) / rss_1
    print()
    print(
        f"RSS at {w}: {rss_1:.1f} MB, at the end ({duration:g} s): {rss_end:.1f} MB: growth "
        f"{growth:+.1%} (goal < 5 %: {common.verdict(growth, 0.05, higher_is_better=False)})"
    )
    figures.add("rss_mb_first", rss_1, "MB")
    figures.add("rss_mb_end", rss_end, "MB")
    figures.at_most("rss_growth", growth, 0.05, "")
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
    figures.add("fds_mean_first", _mean(first, "fds"))
    figures.add("fds_mean_last", _mean(last, "fds"))
    figures.add("files_max_first", files_early)
    figures.add("files_max_last", files_late)
    figures.add("fds_idle_before", before.fds)
    figures.add("fds_idle_after", after.fds)
    figures.add("fds_flat", flat, goal="flat", met=flat)
    early, late = _mean(first, "tasks"), _mean(last, "tasks")
    flat = late <= 1.1 * early + 2 and after.tasks <= before.tasks
    print(
        f"tasks: first {w} mean {early:.1f}, last {w} mean {late:.1f}, max "
        f"{max(p.tasks for _, p in run.samples):g}; idle before the load {before.tasks:g}, "
        f"after it {after.tasks:g} (goal flat: {'met' if flat else 'MISSED'})"
    )
    figures.add("tasks_mean_first", early)
    figures.add("tasks_mean_last", late)
    figures.add("tasks_idle_before", before.tasks)
    figures.add("tasks_idle_after", after.tasks)
    figures.add("tasks_flat", flat, goal="flat", met=flat)
    p99_first = _p99(run, 0.0, window)
    p99_last = _p99(run, duration - window, duration)
    ratio = p99_last / p99_first
    print(
        f"p99 first {w}: {p99_first:.2f} ms, last {w}: {p99_last:.2f} ms: last/first "
        f"{ratio:.2f} (goal <= 1.20: {common.verdict(ratio, 1.2, higher_is_better=False)})"
    )
    figures.add("p99_ms_first", p99_first, "ms")
    figures.add("p99_ms_last", p99_last, "ms")
    figures.at_most("p99_last_over_first", ratio, 1.2)
    lag = percentile(run.lag, 99) * 1000.0
    print(f"client send lag p99 {lag:.2f} ms (latency counts from the scheduled send)")
    figures.add("client_send_lag_p99_ms", lag, "ms")


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


def accounting(metrics: str, tallies: list[_soak.Tally], figures: Figures) -> None:
    """The server's books against the client's, exactly: each check printed, and a check
    figure; every outcome's count."""
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
    checks: list[tuple[str, str, bool]] = [
        (
            "server_counted_every_request",
            f"server counted every request sent to {_soak.MODEL!r}: {sum(http.values())} == {sent}",
            sum(http.values()) == sent,
        ),
        (
            "answers_under_their_status",
            f"answers under their status, cancellations under one each: {dict(http)} - "
            f"{dict(answered)} = {cancelled} cancelled",
            all(http[k] >= v for k, v in answered.items())
            and sum(http.values()) - sum(answered.values()) == cancelled,
        ),
        (
            "batcher_books_balance",
            f"batcher received {received} == completed + failed + expired + cancelled + "
            f"rejected + in flight = {ended} + {pending}",
            received == ended + pending,
        ),
        (
            "unavailable_are_expired_or_rejected",
            f"503s {http['unavailable']} == expired + rejected = "
            f"{batcher['expired'] + batcher['rejected']}",
            http["unavailable"] == batcher["expired"] + batcher["rejected"],
        ),
        (
            "nothing_left_in_flight",
            f"nothing left: in flight {pending}, queued rows "
            f"{gauges.get('carpool_queue_rows', -1):g}",
            pending == 0 and gauges.get("carpool_queue_rows") == 0,
        ),
    ]
    _verdict(checks, outcomes, batcher, server_5xx, tallies, figures)


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
    checks: list[tuple[str, str, bool]],
    outcomes: Counter[str],
    batcher: Counter[str],
    server_5xx: int,
    tallies: list[_soak.Tally],
    figures: Figures,
) -> None:
    """Each check printed and reported, the surprises, and every outcome's count."""
    print()
    print(f"client outcomes: {dict(outcomes)}")
    print(f"batcher outcomes: {dict(batcher)}")
    for name, text, ok in checks:
        print(f"  [{'ok' if ok else 'FAILED'}] {text}")
        figures.check(name, ok)
    lost = outcomes[_soak.LOST]
    unexpected = outcomes[_soak.WRONG] + outcomes[_soak.UNEXPECTED]
    print(f"lost requests: {lost}")
    print(f"unexpected answers: {unexpected}; server 5xx other than 503: {server_5xx}")
    for surprise in (s for t in tallies for s in t.surprises):
        print(f"  {surprise}")
    for outcome in _soak.OUTCOMES:
        figures.add(f"requests_{_slug(outcome)}", outcomes[outcome], "requests")
    figures.add("server_5xx_not_503", server_5xx, "requests")
    figures.check("nothing_lost", lost == 0)
    figures.check("no_unexpected_answer", unexpected == 0 and server_5xx == 0)


def _slug(outcome: str) -> str:
    """An outcome as a figure's name: ``queue full`` -> ``queue_full``, ``4xx`` -> ``refused``."""
    return "refused" if outcome == _soak.REFUSED else outcome.replace(" ", "_")
