"""Reading /metrics: exposition text from carpool's own metrics module, after real batches
of known sizes, and hand-written text for exact arithmetic."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import numpy as np
import pytest

from carpool.bench.report.data import ServerSide
from carpool.bench.report.scrape import Histograms, exact_buckets, parse_metrics, server_side
from carpool.model import Batching, Model, Tensor
from carpool.server.lifecycle.registry import Registry
from carpool.server.telemetry.metrics import Metrics


def _double(batch: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return batch * 2


def _model(name: str, max_batch_size: int) -> Model:
    return Model(
        _double,
        name=name,
        inputs=[Tensor("INPUT0", "FP32", (4,))],
        outputs=[Tensor("OUTPUT0", "FP32", (4,))],
        batching=Batching(max_batch_size=max_batch_size),
    )


def _scrapes(registry: Registry, *phases: dict[str, list[int]]) -> list[str]:
    """/metrics text after each phase; a phase sends, one request at a time, requests of
    the given row counts to each model, so each is one batch of exactly that size."""

    async def run() -> list[str]:
        served = {m.name: m for m in registry}
        texts = []
        async with contextlib.AsyncExitStack() as stack:
            for m in served.values():
                await stack.enter_async_context(m.batcher)
            for phase in phases:
                for name, sizes in phase.items():
                    for rows in sizes:
                        x = np.ones((rows, 4), np.float32)
                        await served[name].batcher.infer_many({"INPUT0": x})
                texts.append(Metrics(registry).render().decode())
        return texts

    return asyncio.run(run())


# from a real carpool metrics endpoint


def test_parse_metrics_of_known_batches() -> None:
    registry = Registry([_model("double", 8)])
    [text] = _scrapes(registry, {"double": [1, 3, 8, 2]})
    snap = parse_metrics(text, "double")
    assert snap is not None
    assert snap.batch_count == 4
    assert snap.batch_rows == 14
    assert snap.batch_buckets == {"1": 1.0, "2": 2.0, "4": 3.0, "8": 4.0, "+Inf": 4.0}
    assert list(snap.batch_buckets) == ["1", "2", "4", "8", "+Inf"]
    assert snap.queue_wait_count == 4  # per request
    assert snap.model_count == 4  # per model call
    assert snap.queue_wait_sum >= 0
    assert snap.model_sum > 0


def test_server_side_of_a_window_between_real_scrapes() -> None:
    registry = Registry([_model("double", 8)])
    first, second = _scrapes(registry, {"double": [1, 3]}, {"double": [8, 2, 2, 5]})
    before, after = parse_metrics(first, "double"), parse_metrics(second, "double")
    assert before is not None
    assert after is not None
    side = server_side(before, after, latency_sum_s=2.0)
    wait_s = after.queue_wait_sum - before.queue_wait_sum
    model_s = after.model_sum - before.model_sum
    assert side == ServerSide(
        batches=4,
        rows=17,
        batch_size_mean=4.25,
        batch_sizes={"2": 2, "8": 2},  # 2 and 2 rows; 5 and 8 rows (in (4, 8])
        queue_wait_ms_mean=1000.0 * wait_s / 4,
        model_ms_mean=1000.0 * model_s / 4,
        queue_wait_share=wait_s / 2.0,
        batch_size_floors={"8": 5},  # "2" holds 2 alone
    )


def test_parse_metrics_picks_the_model() -> None:
    registry = Registry([_model("small", 4), _model("large", 64)])
    [text] = _scrapes(registry, {"small": [4, 4], "large": [33]})
    small, large = parse_metrics(text, "small"), parse_metrics(text, "large")
    assert small is not None
    assert large is not None
    assert (small.batch_count, small.batch_rows) == (2, 8)
    assert small.batch_buckets == {"1": 0.0, "2": 0.0, "4": 2.0, "+Inf": 2.0}
    assert (large.batch_count, large.batch_rows) == (1, 33)
    assert list(large.batch_buckets) == ["1", "2", "4", "8", "16", "32", "64", "+Inf"]
    assert large.batch_buckets["32"] == 0.0
    assert large.batch_buckets["64"] == 1.0
    assert parse_metrics(text, "missing") is None


@pytest.mark.parametrize(
    "text",
    [
        "",
        "<html><body>404 Not Found</body></html>",
        "404 page not found\n",
        '# TYPE http_requests_total counter\nhttp_requests_total{code="200"} 1027\n',
        'carpool_batch_size_bucket{le="1",model="other"} 1.0\n',
    ],
)
def test_parse_metrics_of_something_else_is_none(text: str) -> None:
    assert parse_metrics(text, "double") is None


# exact arithmetic on hand-written text


def _text(batch: dict[str, float], count: float, rows: float, waits: tuple[float, float]) -> str:
    lines = ["# TYPE carpool_batch_size histogram"]
    lines += [f'carpool_batch_size_bucket{{le="{le}",model="m"}} {n}' for le, n in batch.items()]
    lines += [
        f'carpool_batch_size_count{{model="m"}} {count}',
        f'carpool_batch_size_sum{{model="m"}} {rows}',
        "# TYPE carpool_queue_wait_seconds histogram",
        f'carpool_queue_wait_seconds_count{{model="m"}} {waits[0]}',
        f'carpool_queue_wait_seconds_sum{{model="m"}} {waits[1]}',
        "# TYPE carpool_model_seconds histogram",
        f'carpool_model_seconds_count{{model="m"}} {count}',
        f'carpool_model_seconds_sum{{model="m"}} {count * 0.002}',
    ]
    return "\n".join(lines) + "\n"


BEFORE = _text({"+Inf": 10, "1": 4, "2": 6, "4": 10}, 10, 22, (22, 0.5))
AFTER = _text({"1": 5, "2": 9, "4": 30, "+Inf": 30}, 30, 96, (96, 2.35))


def test_parse_metrics_exact_and_sorted() -> None:
    assert parse_metrics(BEFORE, "m") == Histograms(
        batch_count=10,
        batch_rows=22,
        batch_buckets={"1": 4.0, "2": 6.0, "4": 10.0, "+Inf": 10.0},
        queue_wait_count=22,
        queue_wait_sum=0.5,
        model_count=10,
        model_sum=0.02,
    )


def test_server_side_exact() -> None:
    before, after = parse_metrics(BEFORE, "m"), parse_metrics(AFTER, "m")
    assert before is not None
    assert after is not None
    side = server_side(before, after, latency_sum_s=3.7)
    assert side.batches == 20
    assert side.rows == 74
    assert side.batch_size_mean == 3.7
    assert side.batch_sizes == {"1": 1, "2": 2, "4": 17}  # "+Inf" had none: left out
    assert side.batch_size_floors == {"4": 3}  # 3 or 4 rows
    assert side.queue_wait_ms_mean == pytest.approx(1000 * 1.85 / 74, rel=1e-12)
    assert side.model_ms_mean == pytest.approx(2.0, rel=1e-12)
    assert side.queue_wait_share == pytest.approx(1.85 / 3.7, rel=1e-12)


def test_server_side_without_client_latency_has_no_share() -> None:
    before, after = parse_metrics(BEFORE, "m"), parse_metrics(AFTER, "m")
    assert before is not None
    assert after is not None
    assert server_side(before, after, latency_sum_s=None).queue_wait_share is None
    assert server_side(before, after, latency_sum_s=0.0).queue_wait_share is None


def test_server_side_of_an_idle_window() -> None:
    snap = parse_metrics(BEFORE, "m")
    assert snap is not None
    assert server_side(snap, snap, latency_sum_s=None) == ServerSide(
        batches=0,
        rows=0,
        batch_size_mean=0.0,
        batch_sizes={},
        queue_wait_ms_mean=0.0,
        model_ms_mean=0.0,
        queue_wait_share=None,
        batch_size_floors={},
    )


def test_server_side_after_a_restart_counts_from_zero() -> None:
    before, after = parse_metrics(AFTER, "m"), parse_metrics(BEFORE, "m")  # fewer batches
    assert before is not None
    assert after is not None
    side = server_side(before, after, latency_sum_s=None)
    assert (side.batches, side.rows) == (10, 22)
    assert side.batch_sizes == {"1": 4, "2": 2, "4": 4}


def test_parse_metrics_with_only_the_batch_histogram() -> None:
    text = 'carpool_batch_size_count{model="m"} 3\ncarpool_batch_size_sum{model="m"} 5\n'
    assert parse_metrics(text, "m") == Histograms(batch_count=3, batch_rows=5)


def test_exact_buckets_hold_one_size_each() -> None:
    buckets = exact_buckets({3: 2, 1: 1, 5: 4}, 6)
    assert buckets == {"1": 1.0, "2": 1.0, "3": 3.0, "4": 3.0, "5": 7.0, "6": 7.0, "+Inf": 7.0}
    assert exact_buckets({}, 2) == {"1": 0.0, "2": 0.0, "+Inf": 0.0}
    before = Histograms(batch_count=1, batch_rows=1, batch_buckets=exact_buckets({1: 1}, 6))
    after = Histograms(batch_count=7, batch_rows=28, batch_buckets=buckets)
    side = server_side(before, after, latency_sum_s=None)
    assert (side.batch_sizes, side.batch_size_floors) == ({"3": 2, "5": 4}, {})


def test_the_last_bucket_counts_from_the_bound_below_it() -> None:
    before = Histograms(batch_count=0, batch_rows=0)
    after = Histograms(
        batch_count=3, batch_rows=30, batch_buckets={"1": 1.0, "8": 1.0, "+Inf": 3.0}
    )
    side = server_side(before, after, latency_sum_s=None)
    assert (side.batch_sizes, side.batch_size_floors) == ({"1": 1, "+Inf": 2}, {"+Inf": 9})
