"""The books of batches in flight: what policies see of them, and which staged batches a
more urgent request displaces. Pure: batches are built from queue entries by hand."""

from __future__ import annotations

import math

from carpool.engine.inflight import Batch, InFlight
from carpool.engine.request import Request


def batch(*priorities: int, started: float | None = None) -> Batch[Request]:
    """A batch of one-row requests at ``priorities`` (most urgent first, as they leave)."""
    entries = [Request(i, None, "k", p, 0.0, future=None) for i, p in enumerate(priorities)]
    made = Batch([(e, 0, 1) for e in entries], len(entries), "full")
    made.started = started
    return made


def test_a_batch_knows_its_least_urgent_row() -> None:
    assert batch(-1, 0, 3).least_urgent == 3
    assert (batch(2).rows, batch(2).started, batch(2).void) == (1, None, False)


def test_the_view_lists_start_and_rows_oldest_first() -> None:
    books = InFlight()
    running, staged = batch(0, 0, started=5.0), batch(0)
    books.add(running)
    books.add(staged)
    assert (len(books), books.view()) == (2, ((5.0, 2), (None, 1)))
    books.remove(running)
    assert books.view() == ((None, 1),)


def test_a_more_urgent_request_displaces_the_staged_batches_newest_first() -> None:
    books = InFlight()
    running, older, newer = batch(5, started=1.0), batch(3), batch(4)
    for made in (running, older, newer):
        books.add(made)
    assert books.least_urgent == 5  # an upper bound until asked again
    assert books.displaced_by(0) == [newer, older]
    assert books.displaced_by(3) == [newer]
    assert books.displaced_by(4) == []
    assert books.least_urgent == 4


def test_a_staged_batch_behind_one_that_stays_stays_too() -> None:
    # A request split over both would otherwise go back with its later rows still out.
    books = InFlight()
    older, newer = batch(7), batch(1)
    books.add(older)
    books.add(newer)
    assert books.displaced_by(2) == []
    newer.started = 2.0  # a second worker started the newer one first
    assert books.displaced_by(0) == []
    assert books.least_urgent == 7


def test_nothing_to_displace_once_empty() -> None:
    books = InFlight()
    assert books.least_urgent == -math.inf
    made = batch(2)
    books.add(made)
    books.remove(made)
    assert books.least_urgent == -math.inf
