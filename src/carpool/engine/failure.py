"""A segment's rows failed: the part a batch hands back instead of their outputs.

Below the executor, which makes them, and ``request``, which reads them. Imports nothing.
"""

from __future__ import annotations

__all__ = ["Failure"]


class Failure:
    """The exception a segment's rows raised; never a value a model can return."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error
