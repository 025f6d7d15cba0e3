"""An OpenAI-compatible chat endpoint (carpool, llama.cpp's llama-server, vLLM) streamed, as
``carpool bench --stream`` measures it: chat bodies encoded once, each answer's server-sent
events read and every chunk whose delta carries text timed as an output."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, ClassVar

from carpool.bench.targets.base import CHAT_PATH, Send
from carpool.bench.targets.openai_target import _ListedTarget, _OpenAIURL, _split_url
from carpool.bench.targets.stream_clients import sse_sends

__all__ = ["ChatStreamClient", "ChatTarget", "ChatURL", "chat_bodies", "parse_chat"]

_EVENT = b"data:"


@dataclass(frozen=True, slots=True)
class ChatURL(_OpenAIURL):
    """``http://HOST:PORT[/PREFIX]/v1/chat/completions``, split into what bench uses."""

    PATH: ClassVar[str] = CHAT_PATH

    @property
    def chat(self) -> str:
        return self.endpoint


def parse_chat(text: str) -> ChatURL:
    """A chat URL: an HTTP URL whose path ends in ``/v1/chat/completions``."""
    return ChatURL(*_split_url(text, CHAT_PATH))


def chat_bodies(
    conversations: Sequence[Sequence[Mapping[str, Any]]],
    *,
    model: str,
    lengths: Sequence[int | None],
) -> tuple[bytes, ...]:
    """A streamed request body per conversation (its ``messages``), greedy (temperature 0,
    seed 0), cycled against ``lengths`` (each a ``max_tokens``, None: the server's own):
    as many bodies as the longer of the two. ``ValueError`` for no conversations."""
    if not conversations or not lengths:
        raise ValueError("no conversations to send; give at least one")
    bodies = []
    for j in range(max(len(conversations), len(lengths))):
        doc: dict[str, Any] = {
            "model": model,
            "messages": [dict(m) for m in conversations[j % len(conversations)]],
            "stream": True,
            "temperature": 0,
            "seed": 0,
        }
        length = lengths[j % len(lengths)]
        if length is not None:
            doc["max_tokens"] = length
        bodies.append(json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode())
    return tuple(bodies)


def chunk_text(line: bytes) -> str | None:
    """The text one SSE line adds to the answer: its first choice's ``delta.content``
    (``text`` for a completion); None for other lines, ``[DONE]``, a role or usage chunk.
    ``RuntimeError`` for an ``{"error": ...}`` event."""
    if not line.startswith(_EVENT):
        return None
    data = line[len(_EVENT) :].strip()
    if not data or data == b"[DONE]":
        return None
    event = json.loads(data)
    if not isinstance(event, dict):
        return None
    if "error" in event:
        raise RuntimeError(str(event["error"])[:300])
    choices = event.get("choices") or []
    if not choices:
        return None
    choice = choices[0]
    text = (choice.get("delta") or {}).get("content", choice.get("text"))
    return str(text) if text else None


def _has_text(line: bytes) -> bool:
    return chunk_text(line) is not None


@dataclass(frozen=True, slots=True)
class ChatStreamClient:
    """Chat bodies POSTed over a keep-alive pool, each answer streamed: a chunk with text an
    output, an error event a :data:`STREAM_ERROR`. Picklable: each client process opens its
    own. ``timeout_s`` bounds the wait for each next event, not the stream."""

    url: str
    bodies: tuple[bytes, ...]
    timeout_s: float

    def open(self, connections: int) -> AbstractAsyncContextManager[Send]:
        # chunk_text's RuntimeError is an error event
        return sse_sends(
            self.url, self.bodies, self.timeout_s, connections, _has_text, RuntimeError
        )


class ChatTarget(_ListedTarget[ChatURL]):
    """A chat endpoint; ``/metrics`` read when the server is carpool."""

    kind = "chat"

    @classmethod
    def _parse(cls, text: str) -> ChatURL:
        return parse_chat(text)

    def client(self, bodies: Sequence[bytes], timeout_s: float) -> ChatStreamClient:
        return ChatStreamClient(self.url.chat, tuple(bodies), timeout_s)
