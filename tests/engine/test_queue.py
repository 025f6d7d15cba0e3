"""The request queue: priority, then arrival, per collation key; bounded by rows; pure."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from carpool.collation.tokens import Meter
from carpool.engine.queue import RequestQueue, Segment
from carpool.errors import QueueFull


class Item:
    """What the queue holds, and nothing more: the queue is generic over it
    (``carpool.engine.queue.Queued``)."""

    __slots__ = (
        "arrival",
        "key",
        "length",
        "priority",
        "queued",
        "rows",
        "seq",
        "span",
        "taken",
        "tokens",
        "value",
    )

    def __init__(
        self, value: Any, span: int | None, key: Hashable, priority: int, arrival: float
    ) -> None:
        self.value = value
        self.span = span
        self.rows = 1 if span is None else span
        self.key = key
        self.priority = priority
        self.arrival = arrival
        self.seq = 0
        self.taken = 0
        self.queued = False
        self.length = 0
        self.tokens = 0


def entry(value: Any, *, span: int | None = None, key: Hashable = "k", priority: int = 0) -> Item:
    return Item(value, span, key, priority, arrival=0.0)


def names(segments: list[Segment[Item]]) -> list[tuple[Any, int, int]]:
    return [(e.value, start, stop) for e, start, stop in segments]


def pop(queue: RequestQueue[Item], max_rows: int) -> list[tuple[Any, int, int]]:
    head = queue.head()
    assert head is not None
    return names(queue.pop_batch(head, max_rows))


# order


def test_empty_queue() -> None:
    queue = RequestQueue()
    assert queue.head() is None
    assert len(queue) == 0
    assert queue.rows == 0
    assert queue.max_rows is None
    assert queue.drain() == []


def test_fifo_within_a_priority_level() -> None:
    queue = RequestQueue()
    for value in "abcd":
        queue.push(entry(value))
    assert pop(queue, 10) == [("a", 0, 1), ("b", 0, 1), ("c", 0, 1), ("d", 0, 1)]
    assert queue.head() is None


def test_lower_priority_value_is_served_first() -> None:
    queue = RequestQueue()
    queue.push(entry("late-urgent", priority=0))
    queue.push(entry("bulk-1", priority=5))
    queue.push(entry("bulk-2", priority=5))
    queue.push(entry("urgent", priority=-1))
    queue.push(entry("normal", priority=0))
    head = queue.head()
    assert head is not None
    assert head.value == "urgent"
    assert pop(queue, 10) == [
        ("urgent", 0, 1),
        ("late-urgent", 0, 1),
        ("normal", 0, 1),
        ("bulk-1", 0, 1),
        ("bulk-2", 0, 1),
    ]


def test_batch_holds_up_to_max_rows_and_leaves_the_rest_in_order() -> None:
    queue = RequestQueue()
    for value in "abcde":
        queue.push(entry(value))
    assert pop(queue, 2) == [("a", 0, 1), ("b", 0, 1)]
    assert len(queue) == 3
    assert pop(queue, 2) == [("c", 0, 1), ("d", 0, 1)]
    assert pop(queue, 2) == [("e", 0, 1)]
    assert len(queue) == 0


def test_a_batch_only_holds_one_collation_key() -> None:
    queue = RequestQueue()
    queue.push(entry("a1", key="A"))
    queue.push(entry("b1", key="B"))
    queue.push(entry("a2", key="A"))
    queue.push(entry("b2", key="B"))
    assert pop(queue, 10) == [("a1", 0, 1), ("a2", 0, 1)]
    assert pop(queue, 10) == [("b1", 0, 1), ("b2", 0, 1)]


def test_head_is_the_earliest_arrival_across_keys() -> None:
    queue = RequestQueue()
    queue.push(entry("b1", key="B"))
    queue.push(entry("a1", key="A"))
    head = queue.head()
    assert head is not None
    assert head.value == "b1"


def test_a_batch_of_the_head_key_gathers_rows_from_less_urgent_levels() -> None:
    queue = RequestQueue()
    queue.push(entry("a-p2", key="A", priority=2))
    queue.push(entry("b-p1", key="B", priority=1))
    queue.push(entry("a-p0", key="A", priority=0))
    assert pop(queue, 10) == [("a-p0", 0, 1), ("a-p2", 0, 1)]
    assert pop(queue, 10) == [("b-p1", 0, 1)]


def test_rows_like_counts_rows_of_the_same_key_across_levels() -> None:
    queue = RequestQueue()
    a = entry("a", key="A", span=3)
    queue.push(a)
    queue.push(entry("a2", key="A", priority=7))
    queue.push(entry("b", key="B", span=5))
    assert queue.rows_like(a) == 4
    assert queue.rows_like(entry("probe", key="B")) == 5
    assert queue.rows_like(entry("probe", key="C")) == 0
    assert len(queue) == 9


# multi-row entries


def test_multi_row_entry_splits_and_keeps_its_place_at_the_head() -> None:
    queue = RequestQueue()
    big = entry("big", span=5)
    queue.push(big)
    queue.push(entry("next"))
    assert pop(queue, 2) == [("big", 0, 2)]
    assert (big.taken, big.queued) == (2, True)
    assert queue.head() is big
    assert len(queue) == 4
    assert queue.rows_like(big) == 4
    assert pop(queue, 2) == [("big", 2, 4)]
    # the last row of big goes first, then the request behind it fills the batch
    assert pop(queue, 2) == [("big", 4, 5), ("next", 0, 1)]
    assert (big.taken, big.queued) == (5, False)
    assert queue.head() is None
    assert len(queue) == 0


def test_multi_row_entry_fills_the_rest_of_a_batch() -> None:
    queue = RequestQueue()
    queue.push(entry("one"))
    queue.push(entry("big", span=4))
    queue.push(entry("two"))
    assert pop(queue, 3) == [("one", 0, 1), ("big", 0, 2)]
    assert pop(queue, 3) == [("big", 2, 4), ("two", 0, 1)]


def test_partial_entry_is_not_overtaken_by_later_arrivals() -> None:
    queue = RequestQueue()
    big = entry("big", span=3)
    queue.push(big)
    assert pop(queue, 1) == [("big", 0, 1)]
    queue.push(entry("later"))
    assert queue.head() is big
    assert pop(queue, 5) == [("big", 1, 3), ("later", 0, 1)]


# removal


def test_remove_a_queued_entry_updates_counts_and_skips_it() -> None:
    queue = RequestQueue()
    a, b, c = entry("a"), entry("b", span=3), entry("c")
    for e in (a, b, c):
        queue.push(e)
    assert queue.remove(b) is True
    assert b.queued is False
    assert len(queue) == 2
    assert queue.rows_like(a) == 2
    assert pop(queue, 10) == [("a", 0, 1), ("c", 0, 1)]


def test_remove_the_head_moves_the_head_on() -> None:
    queue = RequestQueue()
    a, b = entry("a"), entry("b")
    queue.push(a)
    queue.push(b)
    queue.remove(a)
    assert queue.head() is b


def test_remove_a_partially_taken_entry_withdraws_only_its_remaining_rows() -> None:
    queue = RequestQueue()
    big = entry("big", span=5)
    queue.push(big)
    queue.push(entry("other", span=2))
    assert pop(queue, 2) == [("big", 0, 2)]
    assert len(queue) == 5
    assert queue.remove(big) is True
    assert len(queue) == 2
    assert queue.rows_like(big) == 2
    assert pop(queue, 10) == [("other", 0, 2)]
    assert len(queue) == 0
    assert queue.rows_like(big) == 0


def test_remove_twice_or_after_dispatch_or_never_pushed_is_false() -> None:
    queue = RequestQueue()
    a, b = entry("a"), entry("b")
    queue.push(a)
    queue.push(b)
    assert queue.remove(a) is True
    assert queue.remove(a) is False
    assert pop(queue, 1) == [("b", 0, 1)]
    assert queue.remove(b) is False
    assert queue.remove(entry("stranger")) is False
    assert len(queue) == 0


def test_removing_the_last_row_of_a_key_forgets_the_key() -> None:
    queue = RequestQueue()
    a = entry("a", key="A")
    queue.push(a)
    queue.remove(a)
    assert queue.rows_like(a) == 0
    assert queue.head() is None


# bound


def test_push_up_to_the_bound_then_queue_full() -> None:
    queue = RequestQueue(max_rows=3)
    queue.push(entry("a", span=2))
    queue.push(entry("b"))
    refused = entry("c")
    with pytest.raises(QueueFull) as info:
        queue.push(refused)
    error = info.value
    assert (error.max_queue_size, error.queued, error.rows) == (3, 3, 1)
    assert str(error) == (
        "Exceeds maximum queue size: 3 rows queued, 1 more would pass max_queue_size=3. "
        "Retry later, add workers, or raise max_queue_size."
    )
    assert refused.queued is False
    assert len(queue) == 3


def test_a_multi_row_entry_that_does_not_fit_queues_none_of_its_rows() -> None:
    queue = RequestQueue(max_rows=4)
    queue.push(entry("a", span=2))
    big = entry("big", span=3)
    with pytest.raises(QueueFull) as info:
        queue.push(big)
    assert (info.value.queued, info.value.rows) == (2, 3)
    assert len(queue) == 2
    assert queue.rows_like(big) == 2
    assert pop(queue, 10) == [("a", 0, 2)]
    assert queue.head() is None


def test_queue_full_with_nothing_queued_for_a_request_larger_than_the_bound() -> None:
    queue = RequestQueue(max_rows=2)
    big = entry("big", span=3)
    with pytest.raises(QueueFull) as info:
        queue.push(big)
    assert (info.value.max_queue_size, info.value.queued, info.value.rows) == (2, 0, 3)
    assert len(queue) == 0
    assert queue.head() is None
    assert big.queued is False


def test_zero_bound_refuses_everything() -> None:
    queue = RequestQueue(max_rows=0)
    with pytest.raises(QueueFull) as info:
        queue.push(entry("a"))
    assert (info.value.max_queue_size, info.value.queued, info.value.rows) == (0, 0, 1)


def test_room_frees_as_rows_leave() -> None:
    queue = RequestQueue(max_rows=2)
    a = entry("a", span=2)
    queue.push(a)
    assert pop(queue, 1) == [("a", 0, 1)]
    queue.push(entry("b"))  # one row dispatched, one row of room
    with pytest.raises(QueueFull):
        queue.push(entry("c"))
    queue.remove(a)
    queue.push(entry("c"))
    assert len(queue) == 2


# drain


def test_drain_returns_every_entry_with_rows_left_and_empties_the_queue() -> None:
    queue = RequestQueue()
    big = entry("big", span=3)
    queue.push(big)
    queue.push(entry("b", key="B", priority=4))
    gone = entry("gone")
    queue.push(gone)
    queue.push(entry("c", priority=-2))
    queue.remove(gone)
    head = queue.head()
    assert head is not None
    assert head.value == "c"
    assert names(queue.pop_batch(head, 2)) == [("c", 0, 1), ("big", 0, 1)]
    drained = queue.drain()
    assert sorted(e.value for e in drained) == ["b", "big"]
    assert all(not e.queued for e in drained)
    assert big.taken == 1
    assert len(queue) == 0
    assert queue.rows_like(big) == 0
    assert queue.head() is None
    assert queue.drain() == []


def test_queue_is_usable_after_drain() -> None:
    queue = RequestQueue(max_rows=1)
    queue.push(entry("a"))
    queue.drain()
    queue.push(entry("b"))
    assert pop(queue, 1) == [("b", 0, 1)]


# invariants against a reference model

ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("push"),
            st.integers(-2, 2),  # priority
            st.sampled_from("AB"),  # key
            st.one_of(st.none(), st.integers(1, 5)),  # span
        ),
        st.tuples(st.just("pop"), st.integers(1, 6)),
        st.tuples(st.just("remove"), st.integers(0, 50)),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(ops=ops, bound=st.one_of(st.none(), st.integers(0, 12)))
def test_queue_matches_a_sorted_reference(ops: list[tuple[Any, ...]], bound: int | None) -> None:
    queue = RequestQueue(max_rows=bound)
    pushed: list[Item] = []
    left: dict[int, int] = {}  # id(entry) -> rows not yet dispatched or removed

    def live() -> list[Item]:
        order = sorted(pushed, key=lambda e: (e.priority, e.seq))
        return [e for e in order if left[id(e)]]

    for op in ops:
        if op[0] == "push":
            _, priority, key, span = op
            e = Item(len(pushed), span, key, priority, arrival=float(len(pushed)))
            total = sum(left.values())
            if bound is not None and total + e.rows > bound:
                with pytest.raises(QueueFull):
                    queue.push(e)
                assert not e.queued
            else:
                queue.push(e)
                pushed.append(e)
                left[id(e)] = e.rows
        elif op[0] == "pop":
            expected_head = next(iter(live()), None)
            head = queue.head()
            assert head is expected_head
            if head is None:
                continue
            room = op[1]
            expected: list[tuple[Any, int, int]] = []
            for e in live():
                if e.key != head.key or not room:
                    continue
                start = e.rows - left[id(e)]
                n = min(room, left[id(e)])
                expected.append((e.value, start, start + n))
                left[id(e)] -= n
                room -= n
            assert names(queue.pop_batch(head, op[1])) == expected
        elif pushed:
            target = pushed[op[1] % len(pushed)]
            had = left[id(target)] > 0
            assert queue.remove(target) is had
            left[id(target)] = 0
        assert len(queue) == sum(left.values())
        for key in "AB":
            rows = sum(left[id(e)] for e in pushed if e.key == key)
            assert queue.rows_like(Item(None, None, key, 0, 0.0)) == rows
        assert all(e.queued == (left[id(e)] > 0) for e in pushed)

    drained = queue.drain()
    assert {id(e) for e in drained} == {id(e) for e in pushed if left[id(e)]}
    assert len(queue) == 0
    assert queue.head() is None


# rows_ahead: what admission counts as served before a new request


def test_rows_ahead_of_an_empty_queue() -> None:
    queue = RequestQueue()
    assert [queue.rows_ahead(p) for p in (-(2**63), -1, 0, 1, 2**63)] == [0, 0, 0, 0, 0]


def test_rows_ahead_counts_its_own_level_and_the_more_urgent_ones() -> None:
    queue = RequestQueue()
    queue.push(entry("a", priority=0))
    queue.push(entry("b", priority=0, key="other"))  # every key counts
    queue.push(entry("bulk", span=3, priority=5))
    queue.push(entry("urgent", priority=-1))
    assert [queue.rows_ahead(p) for p in (-2, -1, 0, 3, 5, 6)] == [0, 1, 3, 3, 6, 6]
    assert queue.rows_ahead(0) + 3 == queue.rows  # only "bulk" would run after a new 0


def test_rows_ahead_drops_as_batches_leave_even_across_levels() -> None:
    queue = RequestQueue()
    queue.push(entry("a", priority=0))
    queue.push(entry("big", span=5, priority=2))
    queue.push(entry("c", priority=0))
    # the head's batch takes both 0s and 2 rows of "big", from the less urgent level
    assert pop(queue, 4) == [("a", 0, 1), ("c", 0, 1), ("big", 0, 2)]
    assert [queue.rows_ahead(p) for p in (0, 1, 2)] == [0, 0, 3]
    assert pop(queue, 1) == [("big", 2, 3)]
    assert queue.rows_ahead(2) == 2


def test_rows_ahead_drops_when_a_request_is_withdrawn() -> None:
    queue = RequestQueue()
    big = entry("big", span=4, priority=1)
    small = entry("small", priority=0)
    queue.push(big)
    queue.push(small)
    assert pop(queue, 2) == [("small", 0, 1), ("big", 0, 1)]
    assert queue.rows_ahead(1) == 3
    queue.remove(big)  # only its 3 rows still queued leave the count
    assert queue.rows_ahead(1) == 0
    queue.push(entry("d", priority=1))
    assert queue.rows_ahead(1) == 1


def test_rows_ahead_after_drain_is_zero() -> None:
    queue = RequestQueue()
    for p in (-1, 0, 4):
        queue.push(entry(p, span=2, priority=p))
    assert queue.rows_ahead(10) == 6
    queue.drain()
    assert queue.rows_ahead(10) == 0
    queue.push(entry("again", priority=4))
    assert [queue.rows_ahead(p) for p in (3, 4)] == [0, 1]


@settings(max_examples=200, deadline=None)
@given(ops=ops, bound=st.one_of(st.none(), st.integers(0, 12)))
def test_rows_ahead_matches_a_reference(ops: list[tuple[Any, ...]], bound: int | None) -> None:
    queue = RequestQueue(max_rows=bound)
    pushed: list[Item] = []
    for op in ops:
        if op[0] == "push":
            _, priority, key, span = op
            e = Item(len(pushed), span, key, priority, arrival=float(len(pushed)))
            try:
                queue.push(e)
            except QueueFull:
                continue
            pushed.append(e)
        elif op[0] == "pop":
            head = queue.head()
            if head is not None:
                queue.pop_batch(head, op[1])
        elif pushed:
            queue.remove(pushed[op[1] % len(pushed)])
        for level in range(-3, 4):
            # an entry's rows still queued: all but those taken, unless withdrawn or done
            expected = sum(e.rows - e.taken for e in pushed if e.queued and e.priority <= level)
            assert queue.rows_ahead(level) == expected


# restore: a batch that goes back before it started


def snapshot(queue: RequestQueue[Item]) -> tuple[Any, ...]:
    """What the queue would hand out, in order, and its counts; leaves ``queue`` as it was
    (by restoring what it popped)."""
    popped = []
    order = []
    while (head := queue.head()) is not None:
        segments = queue.pop_batch(head, 1)
        popped.append(segments)
        order.append(names(segments)[0])
    counts = (queue.rows, queue.rows_ahead(0), queue.rows_ahead(9))
    for segments in reversed(popped):
        queue.restore(segments)
    return tuple(order), counts


def test_restore_puts_a_batch_back_as_if_never_popped() -> None:
    queue = RequestQueue()
    for value, priority, key in [("a", 1, "k"), ("b", 0, "k"), ("c", 1, "j"), ("d", 1, "k")]:
        queue.push(entry(value, priority=priority, key=key))
    before = snapshot(queue)
    head = queue.head()
    assert head is not None
    batch = queue.pop_batch(head, 2)
    assert names(batch) == [("b", 0, 1), ("a", 0, 1)]
    queue.restore(batch)
    assert snapshot(queue) == before
    assert (queue.rows, queue.rows_like(head), queue.pushed) == (4, 3, 4)


def test_restore_gives_a_split_request_its_rows_back_in_front_of_its_rest() -> None:
    queue = RequestQueue()
    queue.push(entry("xs", span=5))
    queue.push(entry("y"))
    first = pop_segments(queue, 2)
    second = pop_segments(queue, 2)
    assert (names(first), names(second)) == ([("xs", 0, 2)], [("xs", 2, 4)])
    queue.restore(second)
    queue.restore(first)
    assert pop(queue, 8) == [("xs", 0, 5), ("y", 0, 1)]


def test_restore_after_the_whole_request_left() -> None:
    queue = RequestQueue()
    queue.push(entry("xs", span=3))
    queue.push(entry("y"))
    batch = pop_segments(queue, 4)
    assert names(batch) == [("xs", 0, 3), ("y", 0, 1)]
    assert queue.head() is None  # the emptied lanes are gone
    queue.restore(batch)
    assert pop(queue, 2) == [("xs", 0, 2)]
    assert pop(queue, 8) == [("xs", 2, 3), ("y", 0, 1)]


def test_has_full_looks_at_every_key() -> None:
    queue = RequestQueue()
    queue.push(entry("a", key="k"))
    for value in "bcd":
        queue.push(entry(value, key="j", priority=5))
    assert (queue.has_full(3), queue.has_full(4)) == (True, False)


def pop_segments(queue: RequestQueue[Item], max_rows: int) -> list[Segment[Item]]:
    head = queue.head()
    assert head is not None
    return queue.pop_batch(head, max_rows)


def test_a_priority_level_is_forgotten_once_its_rows_are_gone() -> None:
    """Every distinct priority value (any int is accepted) would otherwise leave an entry
    behind for ever: 10,000 requests of distinct priorities, popped or withdrawn, leave
    none."""
    queue = RequestQueue()
    entries = [entry(i, priority=i) for i in range(10_000)]
    for item in entries:
        queue.push(item)
    for item in entries[::2]:
        queue.remove(item)
    while queue.head() is not None:
        pop(queue, 64)
    assert (len(queue), queue.rows_ahead(10**9)) == (0, 0)
    assert (queue._level_rows, queue._levels, queue._priorities) == ({}, {}, [])
    # and under way, while other levels still hold rows
    queue.push(busy := entry("busy", priority=-1))
    for i in range(100):
        queue.push(item := entry(i, priority=i))
        queue.remove(item)
    assert list(queue._level_rows) == [-1]
    assert queue._priorities == [-1]
    assert pop(queue, 8) == [("busy", 0, 1)]
    assert busy.queued is False


# token budgets and batches formed by length (carpool.collation.tokens)


def measured(value: str, *, length: int, rows: int | None = None, priority: int = 0) -> Item:
    e = Item(value, rows, "k", priority, arrival=0.0)
    e.length, e.tokens = length, length * e.rows
    return e


def test_a_budget_ends_the_batch_at_the_first_request_that_does_not_fit() -> None:
    queue = RequestQueue()
    for value, length in (("a", 10), ("b", 10), ("c", 30), ("d", 5)):
        queue.push(measured(value, length=length))
    head = queue.head()
    assert head is not None
    meter = Meter(60)  # a, b: 2 x 10; c would make 3 x 30 = 90
    assert names(queue.pop_batch(head, 8, meter)) == [("a", 0, 1), ("b", 0, 1)]
    assert (meter.full, meter.computed, queue.rows) == (True, 20, 2)
    assert pop(queue, 8) == [("c", 0, 1), ("d", 0, 1)]  # in order: c was not skipped


def test_a_multi_row_request_gives_the_rows_that_fit_and_keeps_its_place() -> None:
    queue = RequestQueue()
    queue.push(measured("big", length=20, rows=5))
    queue.push(measured("next", length=1))
    head = queue.head()
    assert head is not None
    assert names(queue.pop_batch(head, 8, Meter(50))) == [("big", 0, 2)]
    head = queue.head()
    assert head is not None
    assert head.value == "big"
    assert names(queue.pop_batch(head, 8, Meter(500))) == [("big", 2, 5), ("next", 0, 1)]


def test_rows_fitting_is_a_dry_run_of_the_budget() -> None:
    queue = RequestQueue()
    for value in "abcde":
        queue.push(measured(value, length=10))
    head = queue.head()
    assert head is not None
    meter = Meter(30)
    assert (queue.rows_fitting(head, 8, meter), meter.full) == (3, True)
    assert queue.rows_fitting(head, 2, Meter(30)) == 2
    assert queue.rows == 5  # nothing taken


def test_a_deep_queue_forms_the_batch_by_length_around_its_oldest_row() -> None:
    queue = RequestQueue()
    lengths = [20, 90, 18, 70, 22, 19, 95, 21]
    for i, length in enumerate(lengths):
        queue.push(measured(f"r{i}", length=length))
    head = queue.head()
    assert head is not None
    meter = Meter(None)
    batch = queue.pop_batch(head, 4, meter, sort_window=8)
    assert sorted(e.value for e, _, _ in batch) == ["r0", "r2", "r5", "r7"]  # 20, 18, 19, 21
    assert meter.computed == 4 * 21
    # The rest keep their arrival order, the long ones now first.
    assert pop(queue, 8) == [("r1", 0, 1), ("r3", 0, 1), ("r4", 0, 1), ("r6", 0, 1)]


def test_a_queue_no_deeper_than_one_batch_keeps_arrival_order() -> None:
    queue = RequestQueue()
    for i, length in enumerate([20, 90, 18]):
        queue.push(measured(f"r{i}", length=length))
    head = queue.head()
    assert head is not None
    batch = queue.pop_batch(head, 4, Meter(None), sort_window=32)
    assert names(batch) == [("r0", 0, 1), ("r1", 0, 1), ("r2", 0, 1)]


def test_sorting_stays_within_the_heads_priority_and_a_restore_keeps_arrival_order() -> None:
    queue = RequestQueue()
    for i, length in enumerate([50, 10, 49, 11, 51]):
        queue.push(measured(f"u{i}", length=length, priority=1))
    queue.push(measured("later", length=50, priority=2))
    head = queue.head()
    assert head is not None
    batch = queue.pop_batch(head, 3, Meter(None), sort_window=8)
    assert sorted(e.value for e, _, _ in batch) == ["u0", "u2", "u4"]
    queue.restore(batch)
    assert pop(queue, 8) == [(f"u{i}", 0, 1) for i in range(5)] + [("later", 0, 1)]
