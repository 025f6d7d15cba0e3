"""Prompts' computed state, kept for later prompts that share a prefix: a prompt's parts are
keyed by every token up to their end (a hash chain), so a part is found only after the same
tokens, and stay within a byte budget, the least recently used out first.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from typing import Generic, TypeVar

from carpool.steps.model import PrefixCounts

__all__ = ["PrefixStore", "final_key", "part_keys"]

V = TypeVar("V")
_DIGEST = 16  # bytes of blake2b: a collision is as likely as a cosmic ray, never a concern


def part_keys(ids: Sequence[int], part: int) -> list[bytes]:
    """The key of each part of ``ids`` cut in ``part``-token parts (the last: the rest). A
    key hashes the previous part's key with its own tokens, so it names the whole prefix up
    to the part's end; a short last part and a full one over the same start differ."""
    keys: list[bytes] = []
    key = b""
    for start in range(0, len(ids), part):
        tokens = array("q", ids[start : start + part]).tobytes()
        key = hashlib.blake2b(key + tokens, digest_size=_DIGEST).digest()
        keys.append(key)
    return keys


def final_key(ids: Sequence[int]) -> bytes:
    """The key of a whole prompt (its every token): what its last token leaves (its state,
    its logits) is kept apart from its parts', under a key no part's can be."""
    tokens = array("q", ids).tobytes()
    return hashlib.blake2b(tokens, digest_size=_DIGEST, person=b"carpool-final").digest()


class PrefixStore(Generic[V]):
    """Parts' states by key within ``budget_bytes``, and the counts of their reuse.

    A part is useful only after its prefix's earlier parts, so using or storing a part makes
    its earlier parts more recent than it: a prefix loses its last parts first, never its
    first one while later ones stay."""

    def __init__(self, budget_bytes: int) -> None:
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int):
            raise TypeError(f"budget_bytes must be an int, got {budget_bytes!r}")
        if budget_bytes < 1:
            raise ValueError(f"budget_bytes must be >= 1, got {budget_bytes!r}")
        self.budget = budget_bytes
        self.used = 0  # bytes held
        self._parts: OrderedDict[bytes, tuple[V, int]] = OrderedDict()  # oldest use first
        self._hits = self._reused = self._computed = 0

    def __len__(self) -> int:
        return len(self._parts)

    def get(self, key: bytes) -> V | None:
        """The state stored for the part ``key`` names, if any (``touch`` marks its use)."""
        found = self._parts.get(key)
        return None if found is None else found[0]

    def touch(self, keys: Sequence[bytes]) -> None:
        """A prefix's parts (first to last) were just used: the most recent now, the first
        most of all."""
        for key in reversed(keys):
            if key in self._parts:
                self._parts.move_to_end(key)

    def put(self, keys: Sequence[bytes], state: V, nbytes: int) -> None:
        """Keep ``state``, the last part of the prefix ``keys`` names, unless it alone
        outgrows the budget or the part before it is gone (it could never be reached); the
        least recently used parts go until the rest fit."""
        key = keys[-1]
        reachable = len(keys) < 2 or keys[-2] in self._parts
        if key not in self._parts and nbytes <= self.budget and reachable:
            self._parts[key] = (state, nbytes)
            self.used += nbytes
        self.touch(keys)
        while self.used > self.budget:
            _, (_, freed) = self._parts.popitem(last=False)
            self.used -= freed

    def record(self, *, reused: int = 0, computed: int = 0, hit: bool = False) -> None:
        """Count a sequence's tokens reused or computed, and its first reuse (``hit``)."""
        self._hits += hit
        self._reused += reused
        self._computed += computed

    def counts(self) -> PrefixCounts:
        return PrefixCounts(self._hits, self._reused, self._computed)
