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
