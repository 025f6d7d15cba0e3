"""``--lengths``: how many outputs each stream asks for, as a distribution parsed from its text
(``fixed:64``, ``uniform:16,128``, ``geometric:64,cap=512``) and drawn once per run, seeded.
Pure: text in, numbers out; the request parameter they are sent as is the target's."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Lengths", "parse_lengths"]

_FORMS = "fixed:N, uniform:LOW,HIGH or geometric:MEAN[,cap=N]"


@dataclass(frozen=True, slots=True)
class Lengths:
    """A distribution of requested lengths, each at least 1: ``fixed`` (always ``a``),
    ``uniform`` (``a`` to ``b`` inclusive) or ``geometric`` (mean ``a``, at most ``cap``)."""

    kind: str
    a: int
    b: int = 0
    cap: int | None = None

    def __str__(self) -> str:
        if self.kind == "fixed":
            return f"fixed:{self.a}"
        if self.kind == "uniform":
            return f"uniform:{self.a},{self.b}"
        return f"geometric:{self.a}" + (f",cap={self.cap}" if self.cap is not None else "")

    def draw(self, count: int, *, seed: int) -> list[int]:
        """``count`` lengths, the same for the same seed."""
        if self.kind == "fixed":
            return [self.a] * count
        rng = np.random.default_rng(seed)
        if self.kind == "uniform":
            return [int(n) for n in rng.integers(self.a, self.b + 1, size=count)]
        drawn = rng.geometric(1.0 / self.a, size=count)  # on 1, 2, ...: mean a
        if self.cap is not None:
            drawn = np.minimum(drawn, self.cap)
        return [int(n) for n in drawn]


def parse_lengths(text: str) -> Lengths:
    """The :class:`Lengths` ``text`` names; ``ValueError`` saying the forms it takes."""
    kind, _, rest = text.strip().partition(":")
    items = [item.strip() for item in rest.split(",")] if rest.strip() else []
    cap = None
    if kind == "geometric" and len(items) == 2 and items[1].startswith("cap="):
        cap = _count(items.pop()[len("cap=") :], text)
    numbers = [_count(item, text) for item in items]
    wanted = {"fixed": 1, "uniform": 2, "geometric": 1}.get(kind)
    if wanted is None or len(numbers) != wanted:
        raise ValueError(f"--lengths must be {_FORMS}, got {text!r}")
    if kind == "uniform" and numbers[0] > numbers[1]:
        raise ValueError(f"--lengths uniform:LOW,HIGH needs LOW <= HIGH, got {text!r}")
    if cap is not None and cap < numbers[0]:
        raise ValueError(f"--lengths cap must be >= the mean, got {text!r}")
    return Lengths(kind, numbers[0], numbers[1] if kind == "uniform" else 0, cap)


def _count(item: str, text: str) -> int:
    try:
        value = int(item)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"--lengths takes whole numbers >= 1 ({_FORMS}), got {text!r}")
    return value
