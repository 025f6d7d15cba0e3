"""LoopBridge: coroutines from one loop run as tasks on another thread's loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from carpool.server.loop_bridge import LoopBridge


@pytest.fixture
def target() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()


async def test_results_and_errors_come_back_from_the_target_loop(
    target: asyncio.AbstractEventLoop,
) -> None:
    bridge = LoopBridge(target)

    async def where(i: int) -> tuple[int, bool]:
        if i == 3:
            raise ValueError("three")
        return i, asyncio.get_running_loop() is target

    results = await asyncio.gather(
        *(bridge.run(where(i)) for i in range(50)), return_exceptions=True
    )
    assert results[:3] == [(0, True), (1, True), (2, True)]
    assert isinstance(results[3], ValueError)
    assert str(results[3]) == "three"
    assert results[4:] == [(i, True) for i in range(4, 50)]


async def test_a_cancelled_call_cancels_its_task(target: asyncio.AbstractEventLoop) -> None:
    bridge = LoopBridge(target)
    started, cancelled = threading.Event(), threading.Event()

    async def forever() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    call = asyncio.ensure_future(bridge.run(forever()))
    await asyncio.to_thread(started.wait)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert await asyncio.to_thread(cancelled.wait, 10)
    assert await bridge.run(asyncio.sleep(0, "still works")) == "still works"


async def test_a_call_cancelled_before_it_starts_never_runs() -> None:
    target = asyncio.new_event_loop()  # not running yet: nothing starts until it does
    ran = threading.Event()

    async def body() -> None:
        ran.set()

    bridge = LoopBridge(target)
    call = asyncio.ensure_future(bridge.run(body()))
    await asyncio.sleep(0)  # handed over
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    thread = threading.Thread(target=target.run_forever, daemon=True)
    thread.start()
    try:
        assert await bridge.run(asyncio.sleep(0, "later")) == "later"
    finally:
        target.call_soon_threadsafe(target.stop)
        thread.join()
        target.close()
    assert not ran.is_set()


async def test_a_lone_call_goes_at_once_even_when_it_may_be_held(
    target: asyncio.AbstractEventLoop,
) -> None:
    bridge = LoopBridge(target, quiet_s=3600.0, max_hold_s=3600.0)  # a held call would hang
    assert await bridge.run(asyncio.sleep(0, "alone"), gather=True) == "alone"


async def test_calls_arriving_together_are_held_and_go_over_as_one_burst(
    target: asyncio.AbstractEventLoop,
) -> None:
    bridge = LoopBridge(target, max_burst=3, quiet_s=3600.0, max_hold_s=3600.0)
    running, release = threading.Event(), threading.Event()
    started: list[int] = []

    async def blocker() -> None:  # keeps a call in flight: the next ones are not alone
        running.set()
        await asyncio.to_thread(release.wait)

    async def body(i: int) -> int:
        started.append(i)
        return i

    in_flight = asyncio.ensure_future(bridge.run(blocker()))
    await asyncio.to_thread(running.wait)  # it went at once, alone, and the outbox is empty
    held = [asyncio.ensure_future(bridge.run(body(i), gather=True)) for i in range(2)]
    await asyncio.sleep(0)
    # Anything handed over by now has started once the target loop ran one more callback.
    await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(asyncio.sleep(0), target))
    assert started == []  # two of three: held
    third = asyncio.ensure_future(bridge.run(body(2), gather=True))
    assert await asyncio.gather(*held, third) == [0, 1, 2]
    assert sorted(started) == [0, 1, 2]
    release.set()
    await in_flight


async def test_a_held_burst_goes_when_calls_stop_coming(target: asyncio.AbstractEventLoop) -> None:
    bridge = LoopBridge(target, quiet_s=0.0, max_hold_s=3600.0)
    results = await asyncio.gather(
        *(bridge.run(asyncio.sleep(0, i), gather=True) for i in range(20))
    )
    assert results == list(range(20))


def test_limits_are_checked() -> None:
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(ValueError, match="max_burst must be >= 1"):
            LoopBridge(loop, max_burst=0)
        with pytest.raises(ValueError, match="quiet_s and max_hold_s must be >= 0"):
            LoopBridge(loop, quiet_s=-1.0)
    finally:
        loop.close()
