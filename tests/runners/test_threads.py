"""The worker threads of a plain model: jobs run in order, one per thread at a time, and a
job's result reaches the loop at once, unless the next job is already waiting, when it waits
for that job's ``handoff()`` (the start of its model call). Events order everything."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from carpool.runners.threads import Handoff, ModelThreads
from conftest import WAIT_S, settle


@pytest.fixture
async def pool() -> Iterator[ModelThreads]:
    workers = ModelThreads(1, name="test", loop=asyncio.get_running_loop())
    yield workers
    workers.shutdown()


def wait(event: threading.Event) -> None:
    assert event.wait(WAIT_S)


async def test_a_result_reaches_the_loop_at_once_when_nothing_follows(pool: ModelThreads) -> None:
    assert await pool.submit(lambda handoff: threading.current_thread().name) == "test_0"


async def test_a_job_s_error_reaches_its_future(pool: ModelThreads) -> None:
    def fail(handoff: Handoff) -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        await pool.submit(fail)
    assert await pool.submit(lambda handoff: 2) == 2  # the thread lives on


async def test_a_result_waits_for_the_next_job_s_handoff(pool: ModelThreads) -> None:
    first_may_end, second_may_hand_off, second_may_end = (threading.Event() for _ in range(3))
    order: list[str] = []
    loop, second_started = asyncio.get_running_loop(), asyncio.Event()

    def first(handoff: Handoff) -> str:
        wait(first_may_end)
        return "first"

    def second(handoff: Handoff) -> str:
        order.append("second started")
        loop.call_soon_threadsafe(second_started.set)
        wait(second_may_hand_off)
        handoff()  # where a model call would begin
        order.append("second handed off")
        wait(second_may_end)
        return "second"

    one = pool.submit(first)
    two = pool.submit(second)  # waiting behind the first: the first's result is held
    first_may_end.set()
    await second_started.wait()
    await settle()
    assert not one.done()
    second_may_hand_off.set()
    assert await one == "first"  # delivered while the second job still runs
    assert not two.done()
    second_may_end.set()
    assert await two == "second"
    assert order == ["second started", "second handed off"]


async def test_a_job_that_never_hands_off_still_gets_the_held_result_out(
    pool: ModelThreads,
) -> None:
    gate = threading.Event()

    def first(handoff: Handoff) -> int:
        wait(gate)
        return 1

    one = pool.submit(first)
    two = pool.submit(lambda handoff: 2)  # no model call: nothing to overlap
    gate.set()
    assert await asyncio.gather(one, two) == [1, 2]


async def test_jobs_run_in_order_one_thread_each() -> None:
    loop = asyncio.get_running_loop()
    workers = ModelThreads(2, name="two", loop=loop)
    barrier = threading.Barrier(2)

    def meet(handoff: Handoff) -> Any:
        barrier.wait(WAIT_S)  # both threads run a job at once
        return threading.current_thread().name

    try:
        names = await asyncio.gather(workers.submit(meet), workers.submit(meet))
    finally:
        workers.shutdown()
    assert sorted(names) == ["two_0", "two_1"]


async def test_shutdown_lets_the_threads_go() -> None:
    workers = ModelThreads(2, name="gone", loop=asyncio.get_running_loop())
    threads = [t for t in threading.enumerate() if t.name.startswith("gone_")]
    assert sorted(t.name for t in threads) == ["gone_0", "gone_1", "gone_courier"]
    workers.shutdown()
    for thread in threads:
        await asyncio.to_thread(thread.join, WAIT_S)
        assert not thread.is_alive()


async def test_join_waits_for_idle_threads_and_is_bounded_by_a_running_job() -> None:
    workers = ModelThreads(1, name="joined", loop=asyncio.get_running_loop())
    started, release = threading.Event(), threading.Event()

    def hangs(handoff: Handoff) -> str:
        started.set()
        assert release.wait(WAIT_S)
        return "done"

    result = workers.submit(hangs)
    await asyncio.to_thread(wait, started)
    workers.shutdown()
    assert await asyncio.to_thread(workers.join, 0.05) is False  # its job still runs
    release.set()
    assert await asyncio.to_thread(workers.join, WAIT_S) is True
    assert await result == "done"
    assert not [t for t in threading.enumerate() if t.name.startswith("joined_")]
