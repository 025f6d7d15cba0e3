"""Prometheus text exposition of what the batchers and the server counted.

Nothing is recorded here: at scrape time a collector reads each batcher's ``stats()``
snapshot and the server's per-status request counts, so the request path never touches a
metrics library.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from carpool.stats import HistogramSnapshot

if TYPE_CHECKING:
    from carpool.server.registry import Registry

__all__ = ["Metrics"]

_OUTCOMES = {
    200: "success",
    400: "invalid",
    404: "not_found",
    413: "too_large",
    415: "unsupported_encoding",
    499: "client_closed",
    500: "error",
    503: "unavailable",
}


def _buckets(hist: HistogramSnapshot) -> list[tuple[str, float]]:
    pairs = [
        (repr(bound), float(count)) for bound, count in zip(hist.bounds, hist.counts, strict=True)
    ]
    return [*pairs, ("+Inf", float(hist.count))]


def _size_buckets(sizes: dict[int, int], largest: int) -> list[tuple[str, float]]:
    bounds = [1]
    while bounds[-1] < largest:
        bounds.append(min(bounds[-1] * 2, largest))
    out = []
    for bound in bounds:
        out.append((str(bound), float(sum(n for size, n in sizes.items() if size <= bound))))
    out.append(("+Inf", float(sum(sizes.values()))))
    return out


class _Collector:
    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "carpool_requests",
            "Inference requests by model and outcome",
            labels=["model", "outcome"],
        )
        batches = HistogramMetricFamily(
            "carpool_batch_size", "Rows per model call", labels=["model"]
        )
        waits = HistogramMetricFamily(
            "carpool_queue_wait_seconds",
            "From arrival until the request's batch formed",
            labels=["model"],
        )
        model_time = HistogramMetricFamily(
            "carpool_model_seconds", "Duration of one model call", labels=["model"]
        )
        queued = GaugeMetricFamily("carpool_queue_rows", "Rows waiting", labels=["model"])
        running = GaugeMetricFamily(
            "carpool_rows_in_flight", "Rows in batches being run or staged", labels=["model"]
        )
        pending = GaugeMetricFamily(
            "carpool_requests_in_flight", "Requests accepted and not yet answered", labels=["model"]
        )
        outcomes = CounterMetricFamily(
            "carpool_batcher_requests",
            "Batcher outcomes: completed, failed, expired, cancelled, rejected",
            labels=["model", "outcome"],
        )
        reasons = CounterMetricFamily(
            "carpool_batches", "Batches by why they were dispatched", labels=["model", "reason"]
        )
        overloaded = CounterMetricFamily(
            "carpool_overloaded",
            "Requests refused at once as predicted to miss the latency objective (adaptive)",
            labels=["model"],
        )
        cost = GaugeMetricFamily(
            "carpool_cost_seconds",
            "Fitted batch time t(b) = fixed + per_row x b, at the fitted quantile (adaptive)",
            labels=["model", "term"],
        )
        accuracy = GaugeMetricFamily(
            "carpool_batch_time_measured_over_predicted",
            "Measured / predicted model time of recent batches (adaptive)",
            labels=["model", "quantile"],
        )
        for served in self._registry:
            name = served.name
            for status, count in sorted(served.statuses.items()):
                requests.add_metric([name, _OUTCOMES.get(status, str(status))], count)
            s = served.batcher.stats()
            rows_total = sum(size * n for size, n in s.batch_sizes.items())
            batches.add_metric(
                [name],
                _size_buckets(dict(s.batch_sizes), served.model.batching.max_batch_size),
                float(rows_total),
            )
            waits.add_metric([name], _buckets(s.queue_wait_seconds), s.queue_wait_seconds.sum)
            model_time.add_metric([name], _buckets(s.model_seconds), s.model_seconds.sum)
            queued.add_metric([name], s.queued_rows)
            running.add_metric([name], s.running_rows)
            pending.add_metric([name], s.pending)
            for outcome in ("completed", "failed", "expired", "cancelled", "rejected"):
                outcomes.add_metric([name, outcome], getattr(s, outcome))
            for reason, count in s.dispatch_reasons.items():
                reasons.add_metric([name, reason], count)
            if served.model.batching.latency_slo_ms is not None:
                overloaded.add_metric([name], s.overloaded)
            if s.cost_curve is not None:
                curve = s.cost_curve
                cost.add_metric([name, "fixed"], curve.fixed_s * curve.margin)
                cost.add_metric([name, "per_row"], curve.per_row_s * curve.margin)
            if s.prediction_ratio is not None:
                for q in ("p50", "p90", "p99"):
                    accuracy.add_metric([name, q[1:]], getattr(s.prediction_ratio, q))
        yield from (
            requests, batches, waits, model_time, queued, running, pending, outcomes, reasons,
            overloaded, cost, accuracy,
        )  # fmt: skip


class Metrics:
    """Renders ``GET /metrics``."""

    content_type = CONTENT_TYPE_LATEST.encode()

    def __init__(self, registry: Registry) -> None:
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(_Collector(registry))

    def render(self) -> bytes:
        return generate_latest(self._registry)
