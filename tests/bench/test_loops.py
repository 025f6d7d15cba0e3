"""The load loops (``carpool.bench.loops``): closed and open loops, warm-up, tallies, and
the step they make.

Fake clients (an ``open`` that yields a ``send``) sequence events without a server; an
in-process model that sleeps shows open-loop queueing; a real instant server, stopped after
the target was reached, shows connection errors counted by kind.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import numpy as np
import pytest

from bench.conftest import closed_plan, open_plan
from carpool import Batching, Model, Tensor
from carpool.bench.arrivals import count_offsets
from carpool.bench.loops import InProcess, ShareTally, measure, step_of
from carpool.bench.plan import Plan, Timing
from carpool.bench.report.data import Load, ServerSide
from carpool.bench.targets.http_target import HttpTarget
from carpool.bench.targets.local_target import LocalTarget
from server.conftest import free_port, wait_until

Send = Callable[[int], Awaitable[str | None]]


class FakeClient:
    def __init__(self, send: Send) -> None:
        self.send = send
        self.opened: list[int] = []

    @asynccontextmanager
    async def open(self, connections: int) -> AsyncIterator[Send]:
        self.opened.append(connections)
        yield self.send


class NoServer:
    async def snapshot(self) -> None:
        return None

    def server_side(self, before: Any, after: Any, latency_sum_s: float) -> ServerSide | None:
        return None


async def run(plan: Plan, client: FakeClient, slo_ms: float | None = None) -> Any:
    generator = InProcess(client)
    step, _ = await measure(plan, Timing.of(plan), generator, NoServer(), slo_ms=slo_ms)
    return step


# ----------------------------------------------------------------------------- loops


async def test_closed_loop_records_exactly_the_requested_count() -> None:
    in_flight, most, sent = 0, 0, []

    async def send(i: int) -> None:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        sent.append(i)
        await asyncio.sleep(0)
        in_flight -= 1

    client = FakeClient(send)
    step = await run(closed_plan(4, requests=40), client)
    assert (step.requests, step.ok, step.errors) == (40, 40, {})
    assert most == 4
    assert sorted(sent) == list(range(40))  # each request once
    assert client.opened == [4]  # one pooled connection per caller
    assert step.latency is not None
    assert step.latency.count == 40


async def test_warmup_requests_are_sent_but_not_recorded() -> None:
    sent = 0

    async def send(i: int) -> None:
        nonlocal sent
        sent += 1
        await asyncio.sleep(0.001)

    step = await run(closed_plan(2, requests=10, warmup_s=0.05), FakeClient(send))
    assert step.requests == 10
    assert sent > 10


async def test_a_closed_loop_by_duration_keeps_what_finished_in_the_window() -> None:
    async def send(i: int) -> None:
        await asyncio.sleep(0.002)

    plan = closed_plan(2, duration_s=0.1)
    timing = Timing.of(plan)
    step, tallies = await measure(
        plan, timing, InProcess(FakeClient(send)), NoServer(), slo_ms=None
    )
    assert step.duration_s == pytest.approx(0.1)
    assert step.requests == sum(t.done for t in tallies) > 0
    assert all(t.last_done <= timing.end for t in tallies)  # type: ignore[operator]


async def test_a_timed_closed_loop_counts_answers_to_requests_sent_before_its_window() -> None:
    async def send(i: int) -> None:
        await asyncio.sleep(0.04)  # sends at 0, 40, 80 ms: the window opens at 60, closes at 140

    plan = closed_plan(2, duration_s=0.08, warmup_s=0.06)
    step, tallies = await measure(
        plan, Timing.of(plan), InProcess(FakeClient(send)), NoServer(), slo_ms=None
    )
    # The answers at 80 ms were to requests sent before the window: counted as throughput,
    # not as latencies of the window.
    assert sum(t.answered for t in tallies) == step.ok + 2
    assert step.throughput_rps == pytest.approx((step.ok + 2) / 0.08)


def test_a_timed_closed_loop_counts_every_answer_that_arrived_in_its_window() -> None:
    plan = closed_plan(4, duration_s=1.0)
    timing = Timing(start=99.0, window=100.0, end=101.0)
    tally = ShareTally()
    for now in (100.2, 100.4, 100.6):  # sent and answered inside the window
        tally.record(None, 0.1, now)
    tally.answered = 3 + 4  # plus one answer per caller to a request sent before it opened
    step = step_of(plan, timing, [tally], slo_ms=None)
    assert (step.ok, step.requests, step.throughput_rps) == (3, 3, 7.0)


async def test_errors_are_counted_by_kind_and_a_failed_step_still_reports() -> None:
    async def flaky(i: int) -> str | None:
        await asyncio.sleep(0)
        return "503" if i % 2 else None

    step = await run(closed_plan(2, requests=20), FakeClient(flaky), slo_ms=1000.0)
    assert (step.ok, step.errors) == (10, {"503": 10})
    assert step.goodput_rps == pytest.approx(step.throughput_rps)

    async def down(i: int) -> str:
        await asyncio.sleep(0)
        return "ClientConnectorError"

    failed = await run(closed_plan(2, requests=6), FakeClient(down))
    assert (failed.requests, failed.ok, failed.errors) == (6, 0, {"ClientConnectorError": 6})
    assert (failed.latency, failed.throughput_rps) == (None, 0.0)


async def test_open_loop_sends_on_schedule_without_waiting_for_answers() -> None:
    gate = asyncio.Event()
    started: list[int] = []

    async def send(i: int) -> None:
        started.append(i)
        if len(started) == 5:
            gate.set()
        await gate.wait()  # nothing is answered until every request was sent

    step = await run(open_plan([0.0, 0.001, 0.002, 0.003, 0.004]), FakeClient(send))
    assert sorted(started) == [0, 1, 2, 3, 4]
    assert step.requests == 5


def test_step_of_an_open_loop_spans_its_schedule_at_least() -> None:
    plan = Plan(Load("rate", 10.0), 0.0, 2.0, None, np.asarray([0.5]), np.empty(0), 1)
    timing = Timing(start=100.0, window=100.0, end=None)
    tally = ShareTally()
    tally.record(None, 0.01, 100.51)
    step = step_of(plan, timing, [tally], slo_ms=None)
    assert step.duration_s == 2.0  # the schedule lasted 2 s, though its one answer came early
    assert step.throughput_rps == 0.5


# ----------------------------------------------------------------------------- real clients


def _sleep_20ms(batch: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    time.sleep(0.02)
    return batch


SLEEPY = Model(
    _sleep_20ms,
    name="sleepy",
    inputs=[Tensor("INPUT0", "FP32", (4,))],
    batching=Batching(max_batch_size=1),  # capacity: 50 requests/s
)


async def test_open_loop_latency_runs_from_the_scheduled_time() -> None:
    """Above capacity, requests queue: measured from their scheduled send time, latency
    grows with the backlog; a closed loop at one caller never sees it."""
    rows = [{"INPUT0": np.ones((1, 4), np.float32)}]

    async with LocalTarget.serving(SLEEPY, "sleepy") as target:
        generator = InProcess(target.client(rows))
        offsets = count_offsets(100.0, 40, seed=0)  # twice what the model can do
        plan = Plan(Load("rate", 100.0), 0.0, None, 40, offsets, np.empty(0), 8)
        open_step, _ = await measure(plan, Timing.of(plan), generator, target, slo_ms=None)
        plan = closed_plan(1, requests=20)
        closed_step, _ = await measure(plan, Timing.of(plan), generator, target, slo_ms=None)
    assert (open_step.requests, closed_step.requests) == (40, 20)
    assert open_step.latency is not None
    assert closed_step.latency is not None
    assert closed_step.latency.p50 < 60.0  # one 20 ms call, plus a noisy machine
    assert open_step.latency.p50 > 100.0  # ~ 20 + 10 ms per request queued ahead
    assert open_step.latency.max > open_step.latency.p50
    assert open_step.server is not None
    assert open_step.server.batch_size_mean == 1.0


@pytest.fixture
def instant() -> Any:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "carpool.bench.instant", "--port", str(port)],
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return httpx.get(url + "/v2/health/ready", timeout=1.0).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(ready, "the instant server")
    yield process, url
    if process.poll() is None:
        process.terminate()
    assert process.wait(timeout=10) == 0


async def test_a_server_gone_after_start_is_counted_by_exception_type(instant: Any) -> None:
    process, url = instant
    async with HttpTarget.connect(url + "/v2/models/m") as target:
        assert target.name == "m"
        body = b'{"inputs": []}'
        generator = InProcess(target.client([(body, {})], timeout_s=5.0))
        plan = closed_plan(2, requests=6)
        ok, _ = await measure(plan, Timing.of(plan), generator, target, slo_ms=None)
        process.terminate()
        await asyncio.to_thread(process.wait, 10)
        gone, _ = await measure(plan, Timing.of(plan), generator, target, slo_ms=None)
    assert (ok.ok, ok.errors, ok.server) == (6, {}, None)  # not carpool: no /metrics
    assert (gone.requests, gone.ok, gone.errors) == (6, 0, {"ClientConnectorError": 6})
