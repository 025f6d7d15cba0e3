"""carpool.server.frontends.hub and carpool.server.frontends.remote together: the main process's
hub over a real
batcher, and two front ends' registries, linked by real Unix socket pairs on one loop.

Requests from both front ends share the one batcher's batches; a cancelled request is
withdrawn there; errors cross typed; each front end's counts are summed once, also after
it is gone; a front end that is lost has its queued requests withdrawn, also one that only
stops answering the heartbeat; readiness follows the workers."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest

from carpool import Batching, Model
from carpool.errors import BatcherClosed, QueueFull
from carpool.server.frontends import hub as hub_module
from carpool.server.frontends.hub import Hub
from carpool.server.frontends.remote import FrontEndRegistry, Upstream
from carpool.server.frontends.tallies import Tallies
from carpool.server.lifecycle.registry import Registry

Array = np.ndarray[Any, Any]


class Gate:
    """A model whose batches wait while the gate is closed, and say their sizes."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.open.set()
        self.sizes: list[int] = []
        self.started = threading.Semaphore(0)

    def __call__(self, batch: Array) -> Array:
        self.sizes.append(len(batch))
        self.started.release()
        if not self.open.wait(10):
            raise RuntimeError("the gate stayed closed")
        if (batch < 0).any():
            raise ValueError("negative rows are refused")
        return batch * 2


class Setup:
    def __init__(self, gate: Gate, main: Registry, hub: Hub, fronts: list[FrontEndRegistry]):
        self.gate = gate
        self.main = main
        self.hub = hub
        self.fronts = fronts
        self.lost: list[int] = []

    def batcher(self, front: int) -> Any:
        return next(iter(self.fronts[front])).batcher

    async def started(self, batches: int) -> None:
        await until(lambda: len(self.gate.sizes) >= batches)

    async def queued(self, rows: int) -> None:
        batcher = next(iter(self.main)).batcher
        await until(lambda: batcher.stats().queued_rows == rows)


async def until(condition: Callable[[], bool], within_s: float = 10.0) -> None:
    """Until ``condition()`` holds, looking every millisecond; fails after ``within_s``."""
    for _ in range(int(within_s * 1000)):
        if condition():
            return
        await asyncio.sleep(0.001)
    pytest.fail(f"not true within {within_s:g} s")


@pytest.fixture
async def setup() -> AsyncIterator[Setup]:
    gate = Gate()
    model = Model(gate, name="m", batching=Batching(max_batch_size=16, max_queue_size=8))
    main = Registry([model])
    started = await main.start()
    tallies = Tallies(["m"], 2)
    hub = Hub(main, tallies)
    fronts = []
    made = Setup(gate, main, hub, fronts)
    for index in (1, 2):
        ours, theirs = socket.socketpair()
        await hub.attach(index, ours, made.lost.append)
        front = FrontEndRegistry([model], [], Upstream(), theirs, tallies.slot(index))
        await front.start()
        fronts.append(front)
    yield made
    gate.open.set()
    for front in fronts:
        await front.close(list(front), timeout=0)
    await main.close(started, timeout=1)
    hub.close()


def rows(*values: float) -> dict[str, Array]:
    return {"INPUT0": np.array([[v] for v in values], np.float32)}


async def test_both_front_ends_feed_one_batch(setup: Setup) -> None:
    setup.gate.open.clear()
    first = asyncio.create_task(setup.batcher(0).infer_many(rows(100)))
    await setup.started(1)
    calls = [
        asyncio.create_task(setup.batcher(i % 2).infer_many(rows(i, i + 0.25))) for i in range(4)
    ]
    await setup.queued(8)
    setup.gate.open.set()
    assert (await first)["OUTPUT0"].tolist() == [[200]]
    for i, call in enumerate(calls):
        assert (await call)["OUTPUT0"].tolist() == [[2 * i], [2 * i + 0.5]]
    assert setup.gate.sizes == [1, 8]


async def test_a_cancelled_request_is_withdrawn_in_the_main_process(setup: Setup) -> None:
    setup.gate.open.clear()
    first = asyncio.create_task(setup.batcher(0).infer_many(rows(1)))
    await setup.started(1)
    gone = asyncio.create_task(setup.batcher(1).infer_many(rows(2)))
    await setup.queued(1)
    gone.cancel()
    await setup.queued(0)
    setup.gate.open.set()
    assert (await first)["OUTPUT0"].tolist() == [[2]]
    assert gone.cancelled()
    assert setup.gate.sizes == [1]
    assert next(iter(setup.main)).batcher.stats().cancelled == 1


async def test_errors_cross_typed(setup: Setup) -> None:
    with pytest.raises(ValueError, match="negative rows are refused"):
        await setup.batcher(0).infer_many(rows(-1))
    setup.gate.open.clear()
    running = asyncio.create_task(setup.batcher(0).infer_many(rows(1)))
    await setup.started(2)
    queued = asyncio.create_task(setup.batcher(1).infer_many(rows(*range(8))))
    await setup.queued(8)
    with pytest.raises(QueueFull):  # max_queue_size=8 rows
        await setup.batcher(0).infer_many(rows(7))
    setup.gate.open.set()
    await running
    await queued


async def test_counts_are_summed_once_and_outlive_a_lost_front_end(setup: Setup) -> None:
    one, two = (next(iter(front)) for front in setup.fronts)
    one.record("http", 200, 0.5)
    one.record("http", 503)
    two.record("http", 200, 0.25)
    two.record("grpc", 200, 0.25)
    for front in setup.fronts:  # whichever front end is asked, the same sums
        await front.refresh()
    assert one.statuses == {"http": {200: 2, 503: 1}, "grpc": {200: 1}}
    assert two.statuses == one.statuses
    assert one.request_seconds == two.request_seconds == 1.0
    setup.gate.open.clear()
    running = asyncio.create_task(setup.batcher(0).infer_many(rows(1)))
    await setup.started(1)
    orphan = asyncio.create_task(setup.batcher(1).infer_many(rows(2)))
    await setup.queued(1)
    await setup.fronts[1].close([], timeout=0)  # the second front end goes
    with pytest.raises(BatcherClosed):
        await orphan
    await setup.queued(0)  # its queued request was withdrawn
    await until(lambda: setup.lost == [2])
    setup.gate.open.set()
    await running
    one.record("http", 200)
    await setup.fronts[0].refresh()
    assert one.statuses == {"http": {200: 3, 503: 1}, "grpc": {200: 1}}
    assert one.batcher.stats().completed == 1
    assert setup.hub.front_ends == 1


async def test_readiness_follows_the_main_process(setup: Setup) -> None:
    front = setup.fronts[0]
    front.ready = True
    assert front.is_ready()
    assert next(iter(front)).batcher.workers_alive == 1
    setup.hub.close()  # the main process is gone
    await until(lambda: not next(iter(front)).batcher.workers_alive)
    assert not front.is_ready()
    with pytest.raises(BatcherClosed, match="lost the server's main process"):
        await setup.batcher(0).infer_many(rows(1))


@pytest.fixture
def fast_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    """A heartbeat every 50 ms; 300 ms of silence loses a front end (set before the hub
    starts beating)."""
    monkeypatch.setattr(hub_module, "HEARTBEAT_S", 0.05)
    monkeypatch.setattr(hub_module, "SILENT_S", 0.3)


async def test_a_front_end_that_stops_answering_is_lost_and_its_requests_withdrawn(
    fast_heartbeat: None, setup: Setup
) -> None:
    setup.gate.open.clear()
    running = asyncio.create_task(setup.batcher(0).infer_many(rows(1)))
    await setup.started(1)
    orphan = asyncio.create_task(setup.batcher(1).infer_many(rows(2)))
    await setup.queued(1)
    await asyncio.sleep(0.5)  # both answer the heartbeat: neither is lost
    assert setup.lost == []
    hung = setup.fronts[1]._upstream.link  # its loop stops reading: no PONG
    assert hung._transport is not None
    hung._transport.pause_reading()
    await until(lambda: setup.lost == [2])
    await setup.queued(0)  # its queued request was withdrawn
    assert setup.hub.front_ends == 1
    await asyncio.sleep(0.5)  # the other one answers on
    assert setup.lost == [2]
    setup.gate.open.set()
    await running
    assert setup.gate.sizes == [1]  # the withdrawn request never ran
    hung._transport.resume_reading()  # it sees the link closed
    with pytest.raises(BatcherClosed):
        await orphan
