"""Bursts: gRPC inference calls held back while more arrive, then let go together."""

from __future__ import annotations

import asyncio

import pytest

from carpool.server.grpc.bursts import Bursts

FOREVER = 3600.0  # a hold this long would hang the test: what must go at once goes at once


async def call(bursts: Bursts, order: list[int], i: int, *, may_wait: bool = True) -> int:
    async with bursts.slot(may_wait=may_wait):
        order.append(i)
        await asyncio.sleep(0)
        return i


async def test_a_lone_call_goes_at_once() -> None:
    bursts = Bursts(quiet_s=FOREVER, max_hold_s=FOREVER)
    assert await call(bursts, [], 0) == 0
    assert bursts.in_flight == 0


async def test_calls_arriving_together_are_held_and_let_go_as_one_burst() -> None:
    bursts = Bursts(max_burst=3, quiet_s=FOREVER, max_hold_s=FOREVER)
    order: list[int] = []
    blocker = asyncio.Event()

    async def in_flight() -> None:  # keeps a call in flight: the next ones are not alone
        async with bursts.slot(may_wait=True):
            await blocker.wait()

    first = asyncio.ensure_future(in_flight())
    await asyncio.sleep(0)
    held = [asyncio.ensure_future(call(bursts, order, i)) for i in range(2)]
    for _ in range(5):
        await asyncio.sleep(0)
    assert order == []  # two of three: held
    third = asyncio.ensure_future(call(bursts, order, 2))
    assert await asyncio.gather(*held, third) == [0, 1, 2]
    assert sorted(order) == [0, 1, 2]  # let go together
    blocker.set()
    await first
    assert bursts.in_flight == 0


async def test_a_call_that_may_not_wait_never_waits() -> None:
    bursts = Bursts(quiet_s=FOREVER, max_hold_s=FOREVER)
    order: list[int] = []
    async with bursts.slot(may_wait=True):  # another call in flight
        assert await call(bursts, order, 7, may_wait=False) == 7


async def test_a_held_burst_goes_when_calls_stop_coming() -> None:
    bursts = Bursts(quiet_s=0.0, max_hold_s=FOREVER)
    order: list[int] = []
    results = await asyncio.gather(*(call(bursts, order, i) for i in range(20)))
    assert results == list(range(20))
    assert bursts.in_flight == 0


async def test_a_held_burst_goes_when_its_first_call_waited_long_enough() -> None:
    bursts = Bursts(quiet_s=FOREVER, max_hold_s=0.0)
    order: list[int] = []
    results = await asyncio.gather(*(call(bursts, order, i) for i in range(20)))
    assert results == list(range(20))


async def test_a_cancelled_held_call_leaves_the_others_waiting_and_its_slot() -> None:
    bursts = Bursts(max_burst=3, quiet_s=FOREVER, max_hold_s=FOREVER)
    order: list[int] = []
    blocker = asyncio.Event()

    async def in_flight() -> None:
        async with bursts.slot(may_wait=True):
            await blocker.wait()

    first = asyncio.ensure_future(in_flight())
    await asyncio.sleep(0)
    withdrawn: list[int] = []

    async def counted(i: int) -> int:
        async with bursts.slot(may_wait=True, withdrawn=lambda: withdrawn.append(i)):
            order.append(i)
            return i

    gone = asyncio.ensure_future(counted(0))
    kept = asyncio.ensure_future(counted(1))
    await asyncio.sleep(0)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert withdrawn == [0]  # told, so the server counts it
    assert bursts.in_flight == 2
    assert await asyncio.gather(kept, call(bursts, order, 2)) == [1, 2]
    assert sorted(order) == [1, 2]  # the cancelled call never ran
    assert withdrawn == [0]  # the others, let go, were not withdrawn
    blocker.set()
    await first
    assert bursts.in_flight == 0


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="max_burst must be >= 1"):
        Bursts(max_burst=0)
    with pytest.raises(ValueError, match="quiet_s and max_hold_s must be >= 0"):
        Bursts(quiet_s=-1.0)
