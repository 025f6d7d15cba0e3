"""Prometheus text exposition of what the batchers and the server counted. A collector reads each
batcher's ``stats()`` and the server's counts at scrape time, so the request path never
touches a metrics library. The only module that imports ``prometheus_client``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import TYPE_CHECKING, cast

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from carpool.engine.stats import BatcherStats
from carpool.server.statuses import outcome
from carpool.server.telemetry.buckets import batch_size_buckets, histogram_buckets
from carpool.stepwise import StepServed, StepwiseModel

if TYPE_CHECKING:
    from carpool.server.lifecycle.registry import Registry, ServedModel

__all__ = ["Metrics"]


def _counter(name: str, documentation: str, *labels: str) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, labels=["model", *labels])


def _gauge(name: str, documentation: str, *labels: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=["model", *labels])


def _histogram(name: str, documentation: str) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, documentation, labels=["model"])


class _Families:
    """Every family ``/metrics`` shows, filled in one served model at a time."""

    def __init__(self) -> None:
        self.requests = _counter(
            "carpool_requests",
            "Inference requests by model, outcome and protocol (http, grpc, ...)",
            "outcome",
            "protocol",
        )
        self.batches = _histogram("carpool_batch_size", "Rows per model call")
        self.waits = _histogram(
            "carpool_queue_wait_seconds", "From arrival until the request's batch formed"
        )
        self.model_time = _histogram("carpool_model_seconds", "Duration of one model call")
        self.queued = _gauge("carpool_queue_rows", "Rows waiting")
        self.running = _gauge("carpool_rows_in_flight", "Rows in batches being run or staged")
        self.pending = _gauge(
            "carpool_requests_in_flight", "Requests accepted and not yet answered"
        )
        self.received = _counter(
            "carpool_batcher_received",
            "Requests offered to the batcher: completed + failed + expired + cancelled + "
            "rejected + in flight",
        )
        self.outcomes = _counter(
            "carpool_batcher_requests",
            "Batcher outcomes: completed, failed, expired, cancelled, rejected",
            "outcome",
        )
        self.reasons = _counter("carpool_batches", "Batches by why they were dispatched", "reason")
        self.overloaded = _counter(
            "carpool_overloaded",
            "Requests refused at once as predicted to miss the latency objective (adaptive)",
        )
        self.cost = _gauge(
            "carpool_cost_seconds",
            "Fitted batch time t(b) = fixed + per_row x b, at the fitted quantile (adaptive)",
            "term",
        )
        self.accuracy = _gauge(
            "carpool_batch_time_measured_over_predicted",
            "Measured / predicted model time of recent batches (adaptive)",
            "quantile",
        )
        self.alive = _gauge("carpool_workers_alive", "Workers ready to run a batch now")
        self.restarts = _counter(
            "carpool_worker_restarts", "Worker processes restarted after they died or hung"
        )
        self.retried = _counter(
            "carpool_batches_retried", "Batches run again after their worker process died"
        )
        self.timed_out = _counter(
            "carpool_batches_timed_out", "Batches that ran past batch_timeout_ms"
        )
        self.tokens = _counter(
            "carpool_batch_tokens",
            "Tokens of the batches run: computed (rows x padded length, what the model did) "
            "and real (the rows' own); computed - real is padding",
            "kind",
        )

        self.first_output, self.next_output, self.active, self.step_sequences = _step_families()
        self.prefix_hits = _counter(
            "carpool_prefix_cache_hits",
            "Sequences that reused prompt state computed for an earlier one (step-wise models "
            "that reuse it)",
        )
        self.prefix_tokens = _counter(
            "carpool_prefix_cache_tokens",
            "Prompt tokens whose state was reused, and computed (step-wise models that reuse it)",
            "kind",
        )

    def __iter__(self) -> Iterator[Metric]:
        yield from (self.first_output, self.next_output, self.active, self.step_sequences)
        yield from (self.prefix_hits, self.prefix_tokens)
        yield from (
            self.requests, self.batches, self.waits, self.model_time, self.queued,
            self.running, self.pending, self.received, self.outcomes, self.reasons, self.overloaded,
            self.cost, self.accuracy, self.alive, self.restarts, self.retried, self.timed_out,
            self.tokens,
        )  # fmt: skip

    def add(self, served: ServedModel) -> None:
        name = served.name
        for protocol, counts in sorted(served.statuses.items()):
            for status, count in sorted(counts.items()):
                self.requests.add_metric([name, outcome(status), protocol], count)
        s = served.batcher.stats()
        self._add_batcher(name, s, served.model.batching.max_batch_size)
        if isinstance(served.model, StepwiseModel):  # a front end's batcher shows the same
            self._add_steps(name, cast(StepServed, served.batcher), s)
        if served.model.batching.latency_slo_ms is not None:
            self.overloaded.add_metric([name], s.overloaded)
        if served.model.padding is not None or served.model.count_tokens is not None:
            self.tokens.add_metric([name, "computed"], s.tokens_computed)
            self.tokens.add_metric([name, "real"], s.tokens_real)
        self._add_learned(name, s)

    def _add_batcher(self, name: str, s: BatcherStats, max_batch_size: int) -> None:
        rows_total = sum(size * n for size, n in s.batch_sizes.items())
        self.batches.add_metric(
            [name], batch_size_buckets(s.batch_sizes, max_batch_size), float(rows_total)
        )
        waits = s.queue_wait_seconds
        self.waits.add_metric([name], histogram_buckets(waits), waits.sum)
        self.model_time.add_metric([name], histogram_buckets(s.model_seconds), s.model_seconds.sum)
        self.queued.add_metric([name], s.queued_rows)
        self.running.add_metric([name], s.running_rows)
        self.pending.add_metric([name], s.pending)
        self.received.add_metric([name], s.submitted + s.rejected)
        for kind in ("completed", "failed", "expired", "cancelled", "rejected"):
            self.outcomes.add_metric([name, kind], getattr(s, kind))
        for reason, count in s.dispatch_reasons.items():
            self.reasons.add_metric([name, reason], count)
        self.alive.add_metric([name], s.workers_alive)
        self.restarts.add_metric([name], s.worker_restarts)
        self.retried.add_metric([name], s.retried_batches)
        self.timed_out.add_metric([name], s.timed_out_batches)

    def _add_steps(self, name: str, steps: StepServed, s: BatcherStats) -> None:
        first, following = steps.histograms.first_output, steps.histograms.next_output
        for family, histogram in ((self.first_output, first), (self.next_output, following)):
            snapshot = histogram.snapshot()
            family.add_metric([name], histogram_buckets(snapshot), snapshot.sum)
        self.active.add_metric([name], steps.steps.active)
        outputs = sum(size * n for size, n in s.batch_sizes.items())
        buckets = batch_size_buckets(s.batch_sizes, steps.steps.max_sequences)
        self.step_sequences.add_metric([name], buckets, float(outputs))
        prefixes = steps.steps.prefixes
        if prefixes is not None:
            self.prefix_hits.add_metric([name], prefixes.hits)
            self.prefix_tokens.add_metric([name, "reused"], prefixes.reused)
            self.prefix_tokens.add_metric([name, "computed"], prefixes.computed)

    def _add_learned(self, name: str, s: BatcherStats) -> None:
        # What an adaptive policy fitted: its cost curve and how well it predicts.
        if s.cost_curve is not None:
            curve = s.cost_curve
            self.cost.add_metric([name, "fixed"], curve.fixed_s * curve.margin)
            self.cost.add_metric([name, "per_row"], curve.per_row_s * curve.margin)
        if s.prediction_ratio is not None:
            for q in ("p50", "p90", "p99"):
                self.accuracy.add_metric([name, q[1:]], getattr(s.prediction_ratio, q))


def _step_families() -> tuple[
    HistogramMetricFamily, HistogramMetricFamily, GaugeMetricFamily, HistogramMetricFamily
]:
    """What a step-wise model adds: its outputs' pace, and how full its steps run."""
    return (
        _histogram(
            "carpool_time_to_first_output_seconds",
            "From a sequence's arrival to its first output (step-wise models)",
        ),
        _histogram(
            "carpool_time_per_output_seconds",
            "Between a sequence's outputs after its first (step-wise models)",
        ),
        _gauge("carpool_active_sequences", "Sequences aboard a replica now (step-wise models)"),
        _histogram(
            "carpool_step_sequences", "Active sequences each step advanced (step-wise models)"
        ),
    )


class _Collector:
    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        families = _Families()
        for served in self._registry:
            families.add(served)
        yield from families
        yield _server_requests(self._registry)
        yield from _cache(self._registry)
        yield from _event_loop_tasks()


def _server_requests(registry: Registry) -> Metric:
    """The answers no model counts, so that with ``carpool_requests_total`` every answer is
    counted once: health, metadata and scrapes, and refusals before a model was known."""
    family = CounterMetricFamily(
        "carpool_server_requests",
        "Answers counted under no model in carpool_requests_total, by outcome and protocol: "
        "health, metadata, metrics, and requests refused before their model was known",
        labels=["outcome", "protocol"],
    )
    for protocol, counts in sorted(registry.server_counts.totals().items()):
        for status, count in sorted(counts.items()):
            family.add_metric([outcome(status), protocol], count)
    return family


def _cache(registry: Registry) -> Iterator[Metric]:
    """The response cache's counts, for each model with it on, and the bytes it holds across
    models (nothing when the server has no cache)."""
    if registry.cache is None:
        return
    hits = _counter(
        "carpool_cache_hits",
        "Requests answered from the response cache, or by an identical request's computation "
        "in flight: no batch slot of their own",
    )
    misses = _counter(
        "carpool_cache_misses", "Requests computed and their answers stored in the cache"
    )
    for served in registry:
        if served.model.response_cache:
            hits.add_metric([served.name], served.cache_counts.hits)
            misses.add_metric([served.name], served.cache_counts.misses)
    yield hits
    yield misses
    yield GaugeMetricFamily(
        "carpool_cache_bytes",
        "Bytes the response cache holds (answers, and their bookkeeping), across models",
        value=registry.cache.bytes,
    )


def _event_loop_tasks() -> Iterator[Metric]:
    """Tasks alive on the loop that renders (the server's): requests in flight plus the
    server's own. Flat under steady load, else something holds tasks (a soak watches it)."""
    try:
        tasks = len(asyncio.all_tasks())
    except RuntimeError:  # rendered outside a running loop: no loop to count
        return
    yield GaugeMetricFamily(
        "carpool_event_loop_tasks", "Tasks alive on the server's event loop", value=tasks
    )


class Metrics:
    """Renders ``GET /metrics``."""

    content_type = CONTENT_TYPE_LATEST.encode()

    def __init__(self, registry: Registry) -> None:
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(_Collector(registry))

    def render(self) -> bytes:
        return generate_latest(self._registry)
