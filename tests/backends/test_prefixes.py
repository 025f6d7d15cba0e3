"""The prefix store alone: keys that name whole prefixes, least recently used out first,
a prefix's last parts before its first, and the budget never exceeded."""

from __future__ import annotations

import pytest

from carpool.backends.prefixes import PrefixStore, final_key, part_keys
from carpool.steps.model import PrefixCounts


def test_keys_name_the_whole_prefix() -> None:
    keys = part_keys(list(range(10)), 4)
    assert len(keys) == 3  # 4 + 4 + 2
    assert part_keys(list(range(8)), 4) == keys[:2]
    assert part_keys([*range(8), 9, 9], 4)[:2] == keys[:2]
    assert part_keys([*range(8), 9, 9], 4)[2] != keys[2]
    assert part_keys([*range(9)], 4)[2] != keys[2]  # a shorter last part is another part
    assert part_keys([7, *range(1, 10)], 4)[1] != keys[1]  # an earlier token differs
    assert part_keys([], 4) == []


def test_a_whole_prompts_key_is_no_parts_key() -> None:
    ids = list(range(10))
    assert final_key(ids) == final_key(list(range(10)))
    assert final_key(ids) != final_key(ids[:-1])
    parts = {key for size in range(1, 12) for key in part_keys(ids, size)}
    assert final_key(ids) not in parts  # not even the one-part split of the same tokens


def test_least_recently_used_go_first_within_the_budget() -> None:
    store: PrefixStore[str] = PrefixStore(30)
    a, b, c = part_keys(list(range(3)), 1)  # one prefix: a, then b, then c
    store.put([a], "a", 10)
    store.put([a, b], "b", 10)
    store.put([a, b, c], "c", 10)
    assert (len(store), store.used) == (3, 30)
    (other,) = part_keys([99], 1)
    store.put([other], "other", 10)  # c, the prefix's last part, was its least recent
    assert (store.get(a), store.get(b), store.get(c), store.get(other)) == ("a", "b", None, "other")
    store.touch([a, b])  # now other is the oldest
    store.put([a, b, c], "c", 10)
    assert (store.get(c), store.get(other), store.used) == ("c", None, 30)
    store.put([other], "big", 31)  # more than the whole budget: not kept
    assert (store.get(other), store.used, len(store)) == (None, 30, 3)


def test_counts_add_up() -> None:
    store: PrefixStore[str] = PrefixStore(1)
    store.record(computed=63)
    store.record(reused=64, hit=True)
    store.record(reused=64, computed=5, hit=False)
    assert store.counts() == PrefixCounts(hits=1, reused=128, computed=68)


@pytest.mark.parametrize("budget", [0, -1])
def test_a_budget_holds_something(budget: int) -> None:
    with pytest.raises(ValueError, match="budget_bytes"):
        PrefixStore(budget)


def test_a_part_whose_prefix_is_gone_is_not_kept() -> None:
    store: PrefixStore[str] = PrefixStore(100)
    a, b = part_keys([1, 2], 1)
    store.put([a, b], "b", 10)
    assert (store.get(b), store.used) == (None, 0)
    store.put([a], "a", 10)
    store.put([a, b], "b", 10)
    assert (store.get(b), store.used) == ("b", 20)
