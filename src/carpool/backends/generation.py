"""Text generation's words: a prompt with its sampling settings, and each step's piece of text.

Shared by every text-generation engine, so the protocols see one shape whatever runs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class Message:
    role: Literal["system", "user", "assistant"]
    content: str


@dataclass(frozen=True)
class Prompt:
    """One sequence to generate: its text (or chat messages) and how to sample it.

    ``text`` alone is the user's message under the model's chat template when ``chat`` is
    true, else raw text to continue. ``temperature`` 0 is greedy; a ``seed`` makes sampling
    repeatable, whoever shares the sequence's steps.
    """

    text: str = ""
    messages: tuple[Message, ...] = ()
    chat: bool = True
    max_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class Piece:
    """One step's output: the text it adds (empty while it might begin a stop string), the
    tokens it adds, and, on the last piece, why the sequence ended."""

    text: str
    tokens: int = 1
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0  # on the first piece: the prompt's length in tokens


@dataclass
class StopText:
    """Withholds text that may begin a stop string, so a stop is never returned, even when it
    arrives split over several tokens."""

    stops: Sequence[str]
    _held: str = field(default="", init=False)

    def feed(self, text: str) -> tuple[str, bool]:
        """The text safe to send now, and whether a stop string was completed."""
        held = self._held + text
        cut = min((i for i in (held.find(s) for s in self.stops if s) if i >= 0), default=-1)
        if cut >= 0:
            self._held = ""
            return held[:cut], True
        keep = max((self._overlap(held, s) for s in self.stops if s), default=0)
        self._held = held[len(held) - keep :]
        return held[: len(held) - keep], False

    def flush(self) -> str:
        """The withheld text, once the sequence ends for another reason."""
        held, self._held = self._held, ""
        return held

    @staticmethod
    def _overlap(text: str, stop: str) -> int:
        """The longest end of ``text`` that is a proper beginning of ``stop``."""
        for size in range(min(len(text), len(stop) - 1), 0, -1):
            if text.endswith(stop[:size]):
                return size
        return 0
