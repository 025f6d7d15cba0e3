"""``/metrics``: one family per figure, a sample per model, the adaptive ones only where a
model learns, the cache's only where a model caches; the server's own family for the answers
no model counts."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from carpool import Batching, Model
from carpool.server.inference.admission import AdmittedRequest
from carpool.server.inference.cache import Entry, ResponseCache
from carpool.server.lifecycle.registry import Registry
from carpool.server.messages import OutputTensor
from carpool.server.telemetry.metrics import Metrics


def _double(x: Any) -> Any:
    return x * 2


def families(registry: Registry) -> dict[str, Any]:
    text = Metrics(registry).render().decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


async def test_each_model_has_its_samples_and_only_adaptive_ones_learn() -> None:
    registry = Registry(
        [
            Model(_double, name="plain", batching=Batching(max_batch_size=6)),
            Model(
                _double,
                name="learning",
                batching=Batching(max_batch_size=8, policy="adaptive", latency_slo_ms=50.0),
            ),
        ]
    )
    for served in registry:
        for status in (200, 200, 503, 418):
            served.record("http", status)
        served.record("any protocol", 200)  # a label, whatever its name
        async with served.batcher:
            value = {served.model.input_specs[0].name: np.ones((3, 2), np.float32)}
            await served.batcher.infer_many(value)
    found = families(registry)
    requests = {
        (s.labels["model"], s.labels["outcome"], s.labels["protocol"]): s.value
        for s in found["carpool_requests"].samples
    }
    assert requests == {
        (model, outcome, protocol): count
        for model in ("plain", "learning")
        for outcome, protocol, count in (
            ("success", "http", 2.0),
            ("unavailable", "http", 1.0),
            ("418", "http", 1.0),
            ("success", "any protocol", 1.0),
        )
    }
    buckets = {
        s.labels["le"]: s.value
        for s in found["carpool_batch_size"].samples
        if s.name.endswith("_bucket") and s.labels["model"] == "plain"
    }
    assert buckets == {"1": 0.0, "2": 0.0, "4": 1.0, "6": 1.0, "+Inf": 1.0}
    overloaded = [s.labels["model"] for s in found["carpool_overloaded"].samples]
    assert overloaded == ["learning"]
    for name in ("carpool_queue_rows", "carpool_rows_in_flight", "carpool_requests_in_flight"):
        assert {s.labels["model"]: s.value for s in found[name].samples} == {
            "plain": 0.0,
            "learning": 0.0,
        }


async def test_event_loop_tasks_counts_the_tasks_on_the_rendering_loop() -> None:
    registry = Registry([Model(_double, name="plain")])
    release = asyncio.Event()
    held = [asyncio.ensure_future(release.wait()) for _ in range(3)]
    await asyncio.sleep(0)
    (holding,) = families(registry)["carpool_event_loop_tasks"].samples
    assert holding.value == len(asyncio.all_tasks())  # this test's own and the 3 held
    release.set()
    await asyncio.gather(*held)
    (released,) = families(registry)["carpool_event_loop_tasks"].samples
    assert (holding.value - released.value, released.value) == (3.0, len(asyncio.all_tasks()))


def test_event_loop_tasks_is_left_out_outside_a_loop() -> None:
    assert "carpool_event_loop_tasks" not in families(Registry([Model(_double, name="plain")]))


def test_answers_no_model_counts_are_the_servers_own_family() -> None:
    registry = Registry([Model(_double, name="plain")])
    counts = registry.server_counts
    assert Registry([Model(_double, name="plain")]).server_counts is not counts  # one a server
    for protocol, status in (("http", 404), ("http", 404), ("openai", 400), ("grpc", 401)):
        counts.record(protocol, status)

    def samples() -> dict[tuple[str, ...], float]:
        family = families(registry)["carpool_server_requests"]
        return {tuple(s.labels.values()): s.value for s in family.samples}

    assert samples() == {
        ("not_found", "http"): 2.0, ("invalid", "openai"): 1.0, ("unauthorized", "grpc"): 1.0
    }  # fmt: skip
    counts.shown = {"http": {200: 7}}  # a front end's: every front end's, summed
    assert samples() == {("success", "http"): 7.0}


def test_the_response_cache_has_its_counts_per_model_and_its_bytes() -> None:
    registry = Registry(
        [Model(_double, name="cached", response_cache=True), Model(_double, name="plain")]
    )
    assert not {"carpool_cache_hits", "carpool_cache_bytes"} & set(families(registry))  # none
    registry.cache = ResponseCache(1 << 20)
    entry, nbytes = Entry.copied(
        "cached",
        AdmittedRequest({}, 1, (("OUTPUT0", False),), 0, None),
        [(OutputTensor("OUTPUT0", "FP32", (1, 2), np.zeros((1, 2), np.float32)), False)],
        keep_inputs=False,
    )
    registry.cache.put(b"key", entry, nbytes)
    cached = registry.get("cached")
    cached.cache_counts.hit(0.001)
    cached.cache_counts.hit(0.001)
    cached.cache_counts.miss(0.002)
    found = families(registry)
    for name, count in (("carpool_cache_hits", 2.0), ("carpool_cache_misses", 1.0)):
        assert {s.labels["model"]: s.value for s in found[name].samples} == {"cached": count}
    (held,) = found["carpool_cache_bytes"].samples
    assert held.value == nbytes
