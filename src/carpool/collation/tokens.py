"""Batches bounded by the tokens the model computes (``max_batch_tokens``), not by rows alone. A
request alone over the budget runs alone, as many of its rows a batch as fit and at least one,
so nothing waits for room that cannot come (a hang text-embeddings-inference had). A
:class:`Meter` is one batch being formed. Pure: counts in, counts out."""

from __future__ import annotations

from typing import Protocol

__all__ = ["Meter", "Measured"]


class Measured(Protocol):
    """What a meter reads of a request (a queue entry)."""

    rows: int
    length: int  # a padded row's length; 0: the model does not pad
    tokens: int  # the request's tokens, all its rows, padding not counted


class Meter:
    """One batch being formed: its rows, its longest row, and its tokens so far.

    ``limit``: the budget (``None``: rows alone bound the batch, tokens are only counted).
    """

    __slots__ = ("full", "limit", "longest", "real", "rows", "summed")

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.full = False  # the queue found a request that did not fit: dispatch it now
        self.rows = 0
        self.longest = 0  # the padded length so far
        self.summed = 0  # the rows' own tokens, unpadded models
        self.real = 0  # the rows' tokens, padding not counted

    @property
    def computed(self) -> int:
        """The tokens the model computes for the batch so far."""
        return self.rows * self.longest if self.longest else self.summed

    def room(self, entry: Measured, rows: int) -> int:
        """How many of ``rows`` of ``entry``'s rows fit; at least one in an empty batch."""
        limit = self.limit
        if limit is None:
            return rows
        if entry.length:  # padded: every row costs the longest row's length
            fit = limit // max(self.longest, entry.length) - self.rows
        else:
            per_row = entry.tokens / entry.rows if entry.rows else 0.0
            fit = rows if per_row <= 0 else int((limit - self.summed) / per_row)
        fit = min(rows, max(fit, 0))
        return fit if fit or self.rows else 1

    def add(self, entry: Measured, rows: int) -> None:
        """``rows`` of ``entry``'s rows joined the batch."""
        self.rows += rows
        share = entry.tokens * rows // entry.rows if entry.rows else 0
        self.real += share
        if entry.length:
            self.longest = max(self.longest, entry.length)
        else:
            self.summed += share
