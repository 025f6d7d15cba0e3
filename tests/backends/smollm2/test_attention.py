"""A pass's attention: a decode row's floats are its own whatever else the pass feeds."""

from __future__ import annotations

import torch

from carpool.backends.smollm2.attention import PassAttention, Span
from carpool.backends.smollm2.kv_cache import KVCache
from carpool.backends.smollm2.weights import LlamaConfig

CONFIG = LlamaConfig(
    layers=2, hidden=24, ffn=48, heads=6, kv_heads=2, head_dim=4, rope_theta=1e4,
    rms_eps=1e-5, vocab=10, context=64,
)  # fmt: skip


def cache(length: int, seed: int) -> KVCache:
    made = KVCache(CONFIG, CONFIG.context)
    made.extend(torch.randn(CONFIG.layers, 2, CONFIG.kv_heads, length, CONFIG.head_dim,
                            generator=torch.Generator().manual_seed(seed)))  # fmt: skip
    return made


def rows(spans: list[Span], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random queries and new keys ([tokens, heads + kv_heads, dim]) and values."""
    tokens, c = sum(n for _, n, _ in spans), CONFIG
    g = torch.Generator().manual_seed(seed)
    qk = torch.randn(tokens, c.heads + c.kv_heads, c.head_dim, generator=g)
    return qk, torch.randn(tokens, c.kv_heads, c.head_dim, generator=g)


def attended(spans: list[Span], qk: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    for span_cache, n, _ in spans:
        span_cache.reserve(n)
    return PassAttention(CONFIG, spans)(1, qk, v)


def test_decode_rows_are_the_same_beside_a_prompt_as_alone() -> None:
    a, b, c = cache(5, 1), cache(9, 2), cache(3, 3)
    spans: list[Span] = [(a, 1, 5), (b, 1, 9), (c, 4, 3)]  # two decode rows, then a prompt
    qk, v = rows(spans, 7)
    mixed = attended(spans, qk, v)
    assert mixed.shape == (6, CONFIG.heads * CONFIG.head_dim)
    assert torch.equal(mixed[0:1], attended([(a, 1, 5)], qk[0:1], v[0:1]))
    assert torch.equal(mixed[1:2], attended([(b, 1, 9)], qk[1:2], v[1:2]))
    assert torch.equal(mixed[2:], attended([(c, 4, 3)], qk[2:], v[2:]))
    # the prompt's new keys and values were written into its cache
    assert torch.equal(c.data[1, 0, :, 3:7], qk[2:, CONFIG.heads :].transpose(0, 1))
    assert torch.equal(c.data[1, 1, :, 3:7], v[2:].transpose(0, 1))


def test_a_one_token_chunk_of_a_cache_fed_twice_waits_its_turn() -> None:
    """A cache's second chunk must see its first's keys: its one token is no decode row."""
    a = cache(4, 5)
    spans: list[Span] = [(a, 1, 4), (a, 1, 5)]
    qk, v = rows(spans, 9)
    both = attended(spans, qk, v)
    b = cache(4, 5)
    first = attended([(b, 1, 4)], qk[0:1], v[0:1])
    b.length += 1  # as the engine counts a pass's tokens once it ends
    second = attended([(b, 1, 5)], qk[1:2], v[1:2])
    assert torch.equal(both, torch.cat([first, second]))
