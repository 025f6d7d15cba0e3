"""What ``carpool bench`` measures, and the one seam requests reach it through: a :class:`Client`
whose ``send(i)`` sends request ``i`` and returns ``None`` or the kind of error. A target is a
model behind a v2 server (HTTP or gRPC), an OpenAI embeddings or chat endpoint, or a model in
this process. Stdlib and :mod:`carpool.errors` only."""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from carpool.errors import CarpoolError

__all__ = [
    "CHAT_PATH",
    "KINDS",
    "BenchError",
    "Client",
    "Send",
    "Streamed",
    "is_url",
    "target_kind",
]

#: What a TARGET can be, as :func:`target_kind` names it (and a report's ``kind`` records).
KINDS = ("http", "grpc", "openai", "chat", "in-process")
EMBEDDINGS_PATH = "/v1/embeddings"  # OpenAI's embeddings endpoint, under the server's base URL
CHAT_PATH = "/v1/chat/completions"  # OpenAI's chat endpoint, streamed by --stream


@dataclass(frozen=True, slots=True)
class Streamed:
    """A stream that ended well: its outputs, the seconds from its send to the first, and
    between each output and the next."""

    outputs: int
    first_s: float | None
    gaps_s: tuple[float, ...]

    @classmethod
    def of(cls, sent: float, arrivals: Sequence[float]) -> Streamed:
        """The stream sent at ``sent`` whose outputs arrived at ``arrivals`` (same clock)."""
        if not arrivals:
            return cls(0, None, ())
        gaps = tuple(b - a for a, b in itertools.pairwise(arrivals))
        return cls(len(arrivals), arrivals[0] - sent, gaps)


# request index -> None (answered), a Streamed (a stream ended well), or the error's kind
Send = Callable[[int], Awaitable[str | Streamed | None]]


class BenchError(CarpoolError, ValueError):
    """A target, flag or file that cannot be used; the message says what to fix (exit 2)."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)

    def _fields(self) -> dict[str, Any]:
        return {"message": self.message}


class Client(Protocol):
    """How requests reach a target; ``open`` gives the ``send`` of one client process."""

    def open(self, connections: int) -> AbstractAsyncContextManager[Send]: ...


def is_url(text: str) -> bool:
    """Whether a TARGET names a model on a server, rather than one to load here."""
    return text.startswith(("http://", "https://", "grpc://"))


def target_kind(text: str) -> str:
    """Which of :data:`KINDS` a TARGET is: ``grpc://...`` is gRPC, an HTTP URL whose path
    ends in ``/v1/embeddings`` is OpenAI's embeddings API, one in ``/v1/chat/completions``
    its chat API, any other URL a v2 model URL, anything else a model to load in this
    process."""
    if text.startswith("grpc://"):
        return "grpc"
    if not is_url(text):
        return "in-process"
    path = text.split("?", 1)[0].rstrip("/")
    if path.endswith(CHAT_PATH):
        return "chat"
    return "openai" if path.endswith(EMBEDDINGS_PATH) else "http"
