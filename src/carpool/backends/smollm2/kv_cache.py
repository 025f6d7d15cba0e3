"""A sequence's keys and values for every layer, grown ahead of need."""

from __future__ import annotations

import torch

from carpool.backends.smollm2.weights import LlamaConfig

__all__ = ["KVCache"]

_GROWTH = 128  # cache capacity grows in multiples of this many tokens, by half at least


class KVCache:
    """One sequence's keys and values, [layers, 2, kv_heads, capacity, head_dim] (keys at 0,
    values at 1), grown ahead of need so appending a token never copies the history."""

    def __init__(self, config: LlamaConfig, limit: int) -> None:
        self._config = config
        self.limit = limit  # the most tokens the sequence can hold
        self.length = 0
        self.data = self._empty(0)

    def reserve(self, tokens: int) -> None:
        """Room for ``tokens`` more."""
        needed = self.length + tokens
        capacity = self.data.shape[3]
        if needed <= capacity:
            return
        wanted = max(needed, capacity + capacity // 2)
        grown = min(-(-wanted // _GROWTH) * _GROWTH, max(self.limit, needed))
        data = self._empty(grown)
        data[..., : self.length, :] = self.data[..., : self.length, :]
        self.data = data

    def part(self, start: int, end: int) -> torch.Tensor:
        """A copy of the keys and values of tokens ``start`` to ``end``."""
        return self.data[..., start:end, :].clone()

    def extend(self, part: torch.Tensor) -> None:
        """Append ``part``'s tokens (as ``part`` returns them) as if computed here."""
        count = part.shape[3]
        self.reserve(count)
        self.data[..., self.length : self.length + count, :] = part
        self.length += count

    def _empty(self, capacity: int) -> torch.Tensor:
        c = self._config
        return torch.empty(c.layers, 2, c.kv_heads, capacity, c.head_dim)
