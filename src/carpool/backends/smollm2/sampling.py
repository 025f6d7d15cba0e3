"""The next token from each sequence's logits: greedy at temperature 0, else temperature and
top-p with the sequence's own generator, so a seed gives the same text whoever shares a step."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["Sampler", "pick"]


class Sampler:
    """One sequence's sampling settings and random stream."""

    def __init__(self, temperature: float, top_p: float, seed: int | None) -> None:
        if not temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {temperature!r}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
        self.temperature = temperature
        self.top_p = top_p
        self._generator: torch.Generator | None = None
        if temperature > 0:
            self._generator = torch.Generator()
            if seed is None:
                self._generator.seed()
            else:
                self._generator.manual_seed(seed)

    @property
    def greedy(self) -> bool:
        return self._generator is None

    def sample(self, logits: torch.Tensor) -> int:
        """A token drawn from one row of logits ([vocab]); the likeliest one when greedy."""
        if self._generator is None:
            return int(logits.argmax())
        probs = torch.softmax(logits.float() / self.temperature, dim=-1)
        if self.top_p < 1:
            sorted_probs, order = probs.sort(descending=True)
            before = sorted_probs.cumsum(0) - sorted_probs  # the mass of the likelier tokens
            sorted_probs[before >= self.top_p] = 0  # the first token always stays
            choice = torch.multinomial(sorted_probs, 1, generator=self._generator)
            return int(order[choice])
        return int(torch.multinomial(probs, 1, generator=self._generator))


def pick(logits: torch.Tensor, samplers: Sequence[Sampler]) -> list[int]:
    """Each row's next token ([rows, vocab] logits, one sampler per row); the greedy rows in
    one argmax."""
    picks = logits.argmax(dim=-1).tolist()
    for row, sampler in enumerate(samplers):
        if not sampler.greedy:
            picks[row] = sampler.sample(logits[row])
    return picks
