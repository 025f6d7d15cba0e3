"""Outputs on their way to callers: an event loop is woken once for every step delivered
while its last wake is still pending, a thread waits on its stream alone, and the
observer hears every step, first output and later output."""

from __future__ import annotations

import asyncio
import threading

from carpool.steps.batcher import StepBatcher
from carpool.steps.stream import StepSequence, Wakeups
from steps.models import Counter


def test_a_loop_with_a_wake_pending_is_not_woken_again() -> None:
    loop = asyncio.new_event_loop()
    calls = []
    schedule = loop.call_soon_threadsafe

    def counted(callback, *args):  # type: ignore[no-untyped-def]
        calls.append(callback)
        return schedule(callback, *args)

    loop.call_soon_threadsafe = counted  # type: ignore[method-assign, assignment]
    try:
        futures = [loop.create_future() for _ in range(3)]
        for future in futures:  # three steps, the loop busy elsewhere all the while
            wakeups = Wakeups()
            wakeups.add(future)
            wakeups.send()
        assert len(calls) == 1
        loop.run_until_complete(asyncio.sleep(0))
        assert [f.done() for f in futures] == [True, True, True]
        later = loop.create_future()
        wakeups = Wakeups()
        wakeups.add(later)
        wakeups.send()  # the last wake ran: this one is scheduled anew
        loop.run_until_complete(asyncio.sleep(0))
        assert len(calls) == 2
        assert later.done()
    finally:
        loop.close()


def test_a_closed_loop_is_not_woken() -> None:
    loop = asyncio.new_event_loop()
    future = loop.create_future()
    loop.close()
    wakeups = Wakeups()
    wakeups.add(future)
    wakeups.send()
    assert not future.done()


def test_a_thread_waits_for_its_next_output() -> None:
    seq = StepSequence(1, None, 0, None, 0.0)
    got = []
    reader = threading.Thread(target=lambda: got.append(seq.next_sync(timeout=10)))
    reader.start()
    wakeups = Wakeups()
    seq.put("a", wakeups)
    reader.join(10)
    assert got == ["a"]


class Heard:
    def __init__(self) -> None:
        self.steps: list[int] = []
        self.first = self.next = 0

    def on_step(self, sequences: int, seconds: float) -> None:
        self.steps.append(sequences)

    def on_first_output(self, seconds: float) -> None:
        self.first += 1

    def on_next_output(self, seconds: float) -> None:
        self.next += 1


def test_the_observer_hears_every_step_and_output() -> None:
    heard = Heard()
    with StepBatcher[int, int](Counter(), max_sequences=4, observer=heard) as batcher:
        streams = [batcher.stream(n) for n in (3, 1, 2)]
        assert [list(s) for s in streams] == [[1, 2, 3], [1], [1, 2]]
    assert (sum(heard.steps), heard.first, heard.next) == (6, 3, 3)
