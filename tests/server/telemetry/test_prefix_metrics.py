"""``/metrics``' prefix cache families: exact counts for a step-wise model that reuses prompt
state, summed over its replicas, none for one that cannot; and the same counts shown by a
front end (``--frontends N``), whose batcher is the main process's, over a real link."""

from __future__ import annotations

import socket
from dataclasses import replace
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from carpool.model import Batching
from carpool.server.frontends.hub import Hub
from carpool.server.frontends.remote import FrontEndRegistry, RemoteStepBatcher, Upstream
from carpool.server.frontends.tallies import Tallies
from carpool.server.lifecycle.registry import Registry
from carpool.server.telemetry.metrics import Metrics
from carpool.steps.model import PrefixCounts
from carpool.stepwise import StepServed
from server.step_models import prompts, words

ONE_REPLICA = [replace(prompts, prefix_cache_bytes=64), replace(words, prefix_cache_bytes=64)]
# 64 bytes over 2 replicas; words cannot reuse
TWO_REPLICAS = [
    replace(prompts, prefix_cache_bytes=64, batching=Batching(max_batch_size=8, workers=2)),
    replace(words, prefix_cache_bytes=64),
]
# on one replica: a miss (3 computed), a hit (3 reused, 1 computed), a miss (1 computed)
PROMPTS = ["a b c", "a b c d", "z"]


def samples(registry: Registry) -> dict[tuple[str, ...], float]:
    """The prefix cache's samples: (name, model[, kind]) -> value."""
    text = Metrics(registry).render().decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("carpool_prefix_cache_"):
                kind = [s.labels["kind"]] if "kind" in s.labels else []
                found[(s.name, s.labels["model"], *kind)] = s.value
    return found


def row(text: str) -> dict[str, Any]:
    return {"text_input": np.array([text.encode()], dtype=object)}


async def test_counts_of_a_model_that_reuses_and_none_for_one_that_cannot() -> None:
    registry = Registry(TWO_REPLICAS)
    started = await registry.start()
    try:
        served = registry.get("prompts").batcher
        assert isinstance(served, StepServed)
        assert samples(registry) == {  # asked at start: it reuses, counted from 0
            ("carpool_prefix_cache_hits_total", "prompts"): 0.0,
            ("carpool_prefix_cache_tokens_total", "prompts", "reused"): 0.0,
            ("carpool_prefix_cache_tokens_total", "prompts", "computed"): 0.0,
        }
        outputs = [o for t in PROMPTS for o in await served.stream(row(t), {}).collect()]
        assert {o.split()[0] for o in outputs} == {"budget=32"}
        # each sequence's own reuse, on whichever replica it ran, adds up to the sums
        hits = sum(1 for o in outputs if "reused=0" not in o)
        reused = sum(int(o.split()[1].partition("=")[2]) for o in outputs)
        assert served.step_stats().prefixes == PrefixCounts(hits, reused, 8 - reused)
        assert samples(registry) == {
            ("carpool_prefix_cache_hits_total", "prompts"): hits,
            ("carpool_prefix_cache_tokens_total", "prompts", "reused"): reused,
            ("carpool_prefix_cache_tokens_total", "prompts", "computed"): 8 - reused,
        }
    finally:
        await registry.close(started, timeout=1)


async def test_a_front_end_shows_the_main_processs_counts() -> None:
    main = Registry(ONE_REPLICA)
    started = await main.start()
    tallies = Tallies(["prompts", "words"], 1)
    hub = Hub(main, tallies)
    ours, theirs = socket.socketpair()
    await hub.attach(1, ours, lambda index: None)
    front = FrontEndRegistry(ONE_REPLICA, [], Upstream(), theirs, tallies.slot(1))
    await front.start()
    try:
        remote = front.get("prompts").batcher
        assert isinstance(remote, RemoteStepBatcher)
        await front.refresh()
        assert remote.steps.prefixes == PrefixCounts()
        outputs = [o for t in PROMPTS for o in await remote.stream(row(t), {}).collect()]
        assert outputs == [
            "budget=64 reused=0 computed=3",
            "budget=64 reused=3 computed=1",
            "budget=64 reused=0 computed=1",
        ]
        await front.refresh()
        assert samples(front) == {
            ("carpool_prefix_cache_hits_total", "prompts"): 1.0,
            ("carpool_prefix_cache_tokens_total", "prompts", "reused"): 3.0,
            ("carpool_prefix_cache_tokens_total", "prompts", "computed"): 5.0,
        }
    finally:
        await front.close(list(front), timeout=0)
        await main.close(started, timeout=1)
        hub.close()
