"""A pass's attention in the torch engine: each sequence's queries against its own KV cache,
so caches need no padding; sequences feeding one token each (a decode step's) attend
through views made once a pass, the others each with its causal mask.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch
from torch.nn import functional

from carpool.backends.smollm2.kv_cache import KVCache
from carpool.backends.smollm2.weights import LlamaConfig

__all__ = ["PassAttention", "Span"]

Span = tuple[KVCache, int, int]  # a chunk's cache, its tokens, the tokens cached before it


class PassAttention:
    """The attention of one pass over ``spans``, packed as [tokens, hidden] rows in span order.
    The leading spans of one token each, whose caches no other span feeds, attend as one
    decode step (``_Decode``); the rest each with ``_attend``. A one-token span's floats are
    the same either way, so a decode row is the same whatever prompt rides in its pass."""

    def __init__(self, config: LlamaConfig, spans: Sequence[Span]) -> None:
        self._config = config
        self._lead = _leading_singles(spans)
        lead = spans[: self._lead]
        self._decode = _Decode(config, [cache for cache, _, _ in lead]) if lead else None
        self._rest = spans[self._lead :]
        group = config.heads // config.kv_heads
        self._masks = [_causal(n, past, group) for _, n, past in self._rest]

    def __call__(self, layer: int, qk: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """[tokens, hidden] of the queries (``qk``: each token's rotated query heads, then its
        new keys; ``v`` its new values), the new keys and values written into the caches."""
        lead, parts = self._lead, []
        if self._decode is not None:
            parts.append(self._decode.attend(layer, qk[:lead], v[:lead]))
        if self._rest:
            parts.append(_attend(self._config, layer, self._rest, self._masks, qk[lead:], v[lead:]))
        return parts[0] if len(parts) == 1 else torch.cat(parts)


def _attend(
    config: LlamaConfig,
    layer: int,
    spans: Sequence[Span],
    masks: Sequence[torch.Tensor | None],
    qk: torch.Tensor,
    v: torch.Tensor,
) -> torch.Tensor:
    """Each sequence's queries against its cache (its new keys written in first); the
    outputs packed back as [tokens, hidden]. A kv head's query heads are its rows, so
    no key is repeated: q as [kv_heads, group, tokens, dim]."""
    c = config
    group, tokens = c.heads // c.kv_heads, qk.shape[0]
    sizes = [n for _, n, _ in spans]
    q = qk[:, : c.heads].view(tokens, c.kv_heads, group, c.head_dim).permute(1, 2, 0, 3)
    queries = torch.split(q, sizes, dim=2)  # [kv_heads, group, n, dim] each
    # the new keys and values, [2, kv_heads, n, dim] each: one copy into each cache
    news = torch.split(torch.stack([qk[:, c.heads :], v]).permute(0, 2, 1, 3), sizes, dim=2)
    outs = []
    for (cache, n, past), mask, query, new in zip(spans, masks, queries, news, strict=True):
        cached = cache.data[layer]  # [2, kv_heads, capacity, dim]
        cached[:, :, past : past + n] = new
        seen = cached[:, None, :, : past + n]  # [2, 1, kv_heads, past + n, dim]
        mixed = functional.scaled_dot_product_attention(
            query.reshape(1, c.kv_heads, group * n, c.head_dim),
            seen[0],
            seen[1],
            attn_mask=mask,
        )
        outs.append(mixed.view(c.kv_heads, group, n, c.head_dim).permute(2, 0, 1, 3))
    return torch.cat(outs).view(tokens, c.heads * c.head_dim)


class _Decode:
    """The attention of sequences feeding one token each: each cache's views for every
    layer made once a pass, the new keys and values written with one call a layer, so a
    layer costs each sequence one attention call. Each sequence's attention is the very
    call ``_attend`` makes (the same floats), alone whoever shares the pass."""

    def __init__(self, config: LlamaConfig, caches: Sequence[KVCache]) -> None:
        self._config = config
        slots, keys, values = [], [], []
        for cache in caches:
            data, past = cache.data, cache.length
            slots.append(data[:, :, :, past].unbind(0))  # [2, kv_heads, dim] each layer
            seen = data[:, :, None, :, : past + 1]  # [layers, 2, 1, kv_heads, past + 1, dim]
            keys.append(seen[:, 0].unbind(0))
            values.append(seen[:, 1].unbind(0))
        # by layer, then sequence
        self._slots, self._keys, self._values = (
            list(zip(*x, strict=True)) for x in (slots, keys, values)
        )

    def attend(self, layer: int, qk: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """[tokens, hidden] of the sequences' queries (``qk``'s heads, then its new keys)."""
        c = self._config
        tokens, group = qk.shape[0], c.heads // c.kv_heads
        new = torch.stack([qk[:, c.heads :], v], dim=1)  # [tokens, 2, kv_heads, dim]
        torch._foreach_copy_(self._slots[layer], new.unbind(0))
        queries = qk[:, : c.heads].view(tokens, 1, c.kv_heads, group, c.head_dim).unbind(0)
        attention = functional.scaled_dot_product_attention
        outs = [
            attention(query, keys, values)
            for query, keys, values in zip(
                queries, self._keys[layer], self._values[layer], strict=True
            )
        ]
        return torch.cat(outs).view(tokens, c.heads * c.head_dim)


def _leading_singles(spans: Sequence[Span]) -> int:
    """How many spans lead with one token each, of caches no other span feeds (a cache fed
    twice in a pass must see its first chunk's keys: ``_attend``'s order)."""
    fed = Counter(id(cache) for cache, _, _ in spans)
    lead = 0
    for cache, n, _ in spans:
        if n != 1 or fed[id(cache)] > 1:
            break
        lead += 1
    return lead


def _causal(n: int, past: int, group: int) -> torch.Tensor | None:
    """The mask of a chunk of ``n`` tokens after ``past`` cached ones, rows ordered (member of
    the kv head's group, token): token i sees the past and the chunk's tokens up to i."""
    if n == 1:
        return None
    seen = torch.arange(n).repeat(group) + past
    return torch.arange(past + n)[None, :] <= seen[:, None]
