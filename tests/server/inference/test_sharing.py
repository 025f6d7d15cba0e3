"""Single flight: identical computations in flight shared, owned by their flight rather than
by the caller that started them. Events, not timers."""

from __future__ import annotations

import asyncio

import pytest

from carpool.server.inference.sharing import Flights


class Computation:
    """A computation the test finishes: how often it started, whether it was cancelled."""

    def __init__(self) -> None:
        self.started = 0
        self.running = asyncio.Event()
        self.finish: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.cancelled = asyncio.Event()

    async def __call__(self) -> str:
        self.started += 1
        self.running.set()
        try:
            return await self.finish
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


async def joined(flights: Flights[str], key: str, callers: int) -> None:
    while flights.waiting(key) != callers:  # noqa: ASYNC110 - one look per loop turn
        await asyncio.sleep(0)


async def test_identical_callers_share_one_computation() -> None:
    flights: Flights[str] = Flights()
    compute = Computation()
    callers = [asyncio.create_task(flights.share("k", compute)) for _ in range(5)]
    await joined(flights, "k", 5)
    compute.finish.set_result("answer")
    results = await asyncio.gather(*callers)
    assert results == [("answer", True)] + [("answer", False)] * 4
    assert compute.started == 1
    assert len(flights) == 0  # landed: the next caller starts afresh


async def test_other_keys_compute_apart() -> None:
    flights: Flights[str] = Flights()
    first, second = Computation(), Computation()
    a = asyncio.create_task(flights.share("a", first))
    b = asyncio.create_task(flights.share("b", second))
    await joined(flights, "a", 1)
    await joined(flights, "b", 1)
    first.finish.set_result("A")
    second.finish.set_result("B")
    assert (await a, await b) == (("A", True), ("B", True))


async def test_an_error_reaches_every_caller() -> None:
    flights: Flights[str] = Flights()
    compute = Computation()
    callers = [asyncio.create_task(flights.share("k", compute)) for _ in range(3)]
    await joined(flights, "k", 3)
    compute.finish.set_exception(ValueError("the model refused"))
    for caller in callers:
        with pytest.raises(ValueError, match="the model refused"):
            await caller
    assert len(flights) == 0


async def test_the_computation_outlives_the_caller_that_started_it() -> None:
    flights: Flights[str] = Flights()
    compute = Computation()
    starter = asyncio.create_task(flights.share("k", compute))
    follower = asyncio.create_task(flights.share("k", compute))
    await joined(flights, "k", 2)
    starter.cancel()  # its client went away, or its deadline passed
    with pytest.raises(asyncio.CancelledError):
        await starter
    assert flights.waiting("k") == 1
    assert not compute.cancelled.is_set()
    compute.finish.set_result("answer")
    assert await follower == ("answer", False)


async def test_the_computation_is_cancelled_when_the_last_caller_leaves() -> None:
    flights: Flights[str] = Flights()
    compute = Computation()
    callers = [asyncio.create_task(flights.share("k", compute)) for _ in range(2)]
    await joined(flights, "k", 2)
    await compute.running.wait()
    for caller in callers:
        caller.cancel()
    await asyncio.gather(*callers, return_exceptions=True)
    assert len(flights) == 0  # forgotten at once: a caller that comes now starts afresh
    await compute.cancelled.wait()
    again = Computation()
    caller = asyncio.create_task(flights.share("k", again))
    await joined(flights, "k", 1)
    again.finish.set_result("fresh")
    assert await caller == ("fresh", True)


async def test_a_caller_after_the_answer_landed_starts_again() -> None:
    flights: Flights[str] = Flights()
    first, second = Computation(), Computation()
    first_call = asyncio.create_task(flights.share("k", first))
    await joined(flights, "k", 1)
    first.finish.set_result("one")
    assert await first_call == ("one", True)
    second_call = asyncio.create_task(flights.share("k", second))
    await joined(flights, "k", 1)
    second.finish.set_result("two")
    assert await second_call == ("two", True)
