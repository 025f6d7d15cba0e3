"""Closed-loop callers for benchmarks (``carpool.bench.callers``): a fixed number of
requests, each sent once, never more in flight than there are callers; a timed window read
as it opens and as it closes, with nothing sent after it; errors counted by kind, and an
exception ending the run.

Fake ``send`` functions that yield to the loop stand in for a target: no server, no model.
"""

from __future__ import annotations

import asyncio

import pytest

from carpool.bench.callers import closed_requests, closed_window


async def test_closed_requests_sends_each_index_once_with_callers_in_flight() -> None:
    sent: list[int] = []
    in_flight = peak = 0

    async def send(i: int) -> str | None:
        nonlocal in_flight, peak
        sent.append(i)
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0)
        in_flight -= 1
        return "Odd" if i % 2 else None

    tally, seconds = await closed_requests(send, callers=4, requests=10)
    assert sorted(sent) == list(range(10))
    assert peak == 4
    assert (tally.done, len(tally.latencies), dict(tally.errors)) == (10, 5, {"Odd": 5})
    assert seconds > 0


async def test_no_requests_sends_nothing() -> None:
    async def send(i: int) -> str | None:
        raise AssertionError("nothing is sent")

    tally, _ = await closed_requests(send, callers=3, requests=0)
    assert tally.done == 0


async def test_a_window_is_read_as_it_opens_and_closes_and_nothing_is_sent_after_it() -> None:
    answered = 0
    sends_after: list[int] = []
    closed = asyncio.Event()

    async def send(i: int) -> str | None:
        nonlocal answered
        if closed.is_set():
            sends_after.append(i)
        await asyncio.sleep(0.001)
        answered += 1
        return None

    def read() -> int:
        if reads:
            closed.set()
        reads.append(answered)
        return answered

    reads: list[int] = []
    window = await closed_window(send, callers=3, warmup_s=0.02, seconds=0.05, read=read)
    assert reads == [window.opened, window.closed]
    assert 0 < window.opened < window.closed
    assert sends_after == []  # a caller's last request may be in flight as it closes; no more
    # the window's answers are fewer than all answers (the warm-up's are not among them)
    assert 0 < len(window.tally.latencies) <= window.tally.answered < answered
    assert window.seconds > 0
    assert window.answered_per_s == window.tally.answered / window.seconds


async def test_an_exception_in_send_ends_the_run() -> None:
    async def send(i: int) -> str | None:
        raise RuntimeError(f"request {i}")

    with pytest.raises(ExceptionGroup) as caught:
        await closed_requests(send, callers=2, requests=5)
    assert caught.group_contains(RuntimeError)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"callers": 0, "warmup_s": 0.0, "seconds": 1.0}, "callers must be >= 1"),
        ({"callers": 1, "warmup_s": -1.0, "seconds": 1.0}, "warmup_s must be >= 0"),
        ({"callers": 1, "warmup_s": 0.0, "seconds": 0.0}, "seconds > 0"),
    ],
)
async def test_a_window_refuses_what_cannot_run(options: dict[str, float], message: str) -> None:
    async def send(i: int) -> str | None:
        return None

    with pytest.raises(ValueError, match=message):
        await closed_window(send, read=lambda: None, **options)  # type: ignore[arg-type]
