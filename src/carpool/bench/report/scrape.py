"""What a carpool server's ``/metrics`` says about one model, over a step's window. Pure: text in,
dataclasses out (prometheus_client's parser, no HTTP); the names it reads are those
:mod:`carpool.server.telemetry.metrics` writes."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from carpool.bench.report.data import ServerSide

__all__ = ["Histograms", "exact_buckets", "parse_metrics", "server_side"]

_BATCH = "carpool_batch_size"
_QUEUE_WAIT = "carpool_queue_wait_seconds"
_MODEL = "carpool_model_seconds"
_SAMPLES = frozenset(
    f"{histogram}_{part}"
    for histogram in (_BATCH, _QUEUE_WAIT, _MODEL)
    for part in ("bucket", "count", "sum")
)


@dataclass(frozen=True, slots=True)
class Histograms:
    """One model's histograms at one scrape, counted since the server started.

    ``batch_buckets``: model calls with at most ``le`` rows, cumulative, by the ``le``
    label as the server wrote it (``"1"``, ``"2"``, ..., ``"+Inf"``).
    """

    batch_count: int
    batch_rows: int
    batch_buckets: dict[str, float] = field(default_factory=dict)
    queue_wait_count: int = 0
    queue_wait_sum: float = 0.0
    model_count: int = 0
    model_sum: float = 0.0


def parse_metrics(text: str, model: str) -> Histograms | None:
    """``model``'s batch-size, queue-wait and model-time histograms from exposition text.

    ``None`` when the text holds no ``carpool_batch_size`` for ``model``: not a carpool
    server, not Prometheus text at all, or a model it does not serve. A histogram that is
    absent reads as empty.
    """
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        raise ImportError(
            "reading a server's /metrics needs prometheus-client: pip install 'carpool[bench]'"
        ) from None

    values: dict[tuple[str, str], float] = {}  # (sample name, le or "") -> value
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:  # by sample name: a missing # TYPE line is no matter
                if sample.name in _SAMPLES and sample.labels.get("model") == model:
                    values[sample.name, sample.labels.get("le", "")] = sample.value
    except ValueError:  # the parser's answer to text that is not the exposition format
        return None
    if (f"{_BATCH}_count", "") not in values:
        return None
    buckets = {le: v for (name, le), v in values.items() if name == f"{_BATCH}_bucket"}
    return Histograms(
        batch_count=_count(values.get((f"{_BATCH}_count", ""))),
        batch_rows=_count(values.get((f"{_BATCH}_sum", ""))),
        batch_buckets=dict(sorted(buckets.items(), key=lambda item: _bound(item[0]))),
        queue_wait_count=_count(values.get((f"{_QUEUE_WAIT}_count", ""))),
        queue_wait_sum=values.get((f"{_QUEUE_WAIT}_sum", ""), 0.0),
        model_count=_count(values.get((f"{_MODEL}_count", ""))),
        model_sum=values.get((f"{_MODEL}_sum", ""), 0.0),
    )


def server_side(
    before: Histograms, after: Histograms, *, latency_sum_s: float | None
) -> ServerSide:
    """What happened between two scrapes of the same model.

    ``batch_sizes`` holds the window's model calls per bucket (not cumulative), zero
    buckets left out; ``batch_size_floors`` the smallest size of each that holds more than
    one (the bound below it, plus one). Means are 0 for a window without batches or requests.
    ``latency_sum_s``: the client-side latency summed over the window's requests, to give
    ``queue_wait_share``; ``None`` (or 0) leaves the share ``None``. When ``after`` counts
    fewer batches than ``before`` the server restarted in between, and ``after`` alone is
    the window (as Prometheus's ``rate()`` treats a counter reset).
    """
    if after.batch_count < before.batch_count:
        before = Histograms(batch_count=0, batch_rows=0)
    batches = after.batch_count - before.batch_count
    rows = after.batch_rows - before.batch_rows
    cumulative = {
        le: n - before.batch_buckets.get(le, 0.0) for le, n in after.batch_buckets.items()
    }
    sizes: dict[str, int] = {}
    floors: dict[str, int] = {}
    below, bound = 0.0, 0  # the bucket below: its cumulative count, its bound
    for le in sorted(cumulative, key=_bound):
        count = _count(cumulative[le] - below)
        below = cumulative[le]
        if count > 0:
            sizes[le] = count
            if _bound(le) > bound + 1:  # more sizes than one: from the one above bound
                floors[le] = bound + 1
        if le != "+Inf":
            bound = int(_bound(le))
    waits = after.queue_wait_count - before.queue_wait_count
    wait_s = after.queue_wait_sum - before.queue_wait_sum
    calls = after.model_count - before.model_count
    model_s = after.model_sum - before.model_sum
    return ServerSide(
        batches=batches,
        rows=rows,
        batch_size_mean=rows / batches if batches else 0.0,
        batch_sizes=sizes,
        queue_wait_ms_mean=1000.0 * wait_s / waits if waits else 0.0,
        model_ms_mean=1000.0 * model_s / calls if calls else 0.0,
        queue_wait_share=wait_s / latency_sum_s if latency_sum_s else None,
        batch_size_floors=floors,
    )


def exact_buckets(sizes: Mapping[int, int], largest: int) -> dict[str, float]:
    """Cumulative counts of ``sizes`` (batch size -> batches), as a scrape reads them, with a
    bucket at every size up to ``largest``: what a server that counts each size (gRPC's
    statistics, an in-process batcher) would expose, so that every bucket holds one size.
    Two snapshots of a window need the same ``largest``, as a histogram keeps its bounds."""
    running = 0
    buckets: dict[str, float] = {}
    for size in range(1, largest + 1):
        running += sizes.get(size, 0)
        buckets[str(size)] = float(running)
    buckets["+Inf"] = float(sum(sizes.values()))
    return buckets


def _count(value: float | None) -> int:
    return 0 if value is None else round(value)


def _bound(le: str) -> float:
    try:
        return float(le)  # "+Inf" too
    except ValueError:
        return math.inf
