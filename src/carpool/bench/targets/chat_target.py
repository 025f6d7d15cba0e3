"""An OpenAI-compatible chat endpoint (carpool, llama.cpp's llama-server, vLLM) streamed, as
``carpool bench --stream`` measures it: chat bodies encoded once, each answer's server-sent
events read and every chunk whose delta carries text timed as an output."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from carpool.bench.targets.base import CHAT_PATH, BenchError, Send, Streamed
from carpool.bench.targets.http_target import CONTROL_TIMEOUT_S, KEEPALIVE_S, ScrapedTarget, get
from carpool.bench.targets.openai_target import _choose, _model_ids
from carpool.bench.targets.stream_clients import STREAM_ERROR

if TYPE_CHECKING:
    import aiohttp

__all__ = ["ChatStreamClient", "ChatTarget", "ChatURL", "chat_bodies", "parse_chat"]

_JSON = {"Content-Type": "application/json"}
_EVENT = b"data:"


@dataclass(frozen=True, slots=True)
class ChatURL:
    """``http://HOST:PORT[/PREFIX]/v1/chat/completions``, split into what bench uses."""

    base: str  # scheme://host:port
    prefix: str = ""  # the path before /v1/chat/completions

    @property
    def chat(self) -> str:
        return f"{self.base}{self.prefix}{CHAT_PATH}"

    @property
    def models(self) -> str:
        return f"{self.base}{self.prefix}/v1/models"

    @property
    def metrics(self) -> str:
        return self.base + "/metrics"

    def __str__(self) -> str:
        return self.chat


def parse_chat(text: str) -> ChatURL:
    """A chat URL: an HTTP URL whose path ends in ``/v1/chat/completions``."""
    parts = urlsplit(text)
    path = parts.path.rstrip("/")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise BenchError(f"TARGET {text!r} must be http://HOST:PORT{CHAT_PATH}")
    if not path.endswith(CHAT_PATH):
        raise BenchError(f"TARGET {text!r} must end in {CHAT_PATH}")
    return ChatURL(f"{parts.scheme}://{parts.netloc}", path[: -len(CHAT_PATH)])


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


@dataclass(frozen=True, slots=True)
class ChatStreamClient:
    """Chat bodies POSTed over a keep-alive pool, each answer streamed: a chunk with text an
    output, an error event a :data:`STREAM_ERROR`. Picklable: each client process opens its
    own. ``timeout_s`` bounds the wait for each next event, not the stream."""

    url: str
    bodies: tuple[bytes, ...]
    timeout_s: float

    @asynccontextmanager
    async def open(self, connections: int) -> AsyncIterator[Send]:
        import aiohttp

        connector = aiohttp.TCPConnector(
            limit=connections, limit_per_host=connections, keepalive_timeout=KEEPALIVE_S
        )
        timeout = aiohttp.ClientTimeout(total=None, sock_read=self.timeout_s)
        async with aiohttp.ClientSession(
            connector=connector, timeout=timeout, skip_auto_headers=("User-Agent",)
        ) as session:
            post, url, bodies, clock = session.post, self.url, self.bodies, time.perf_counter

            async def send(i: int) -> str | Streamed | None:
                sent = clock()
                arrivals: list[float] = []
                try:
                    async with post(url, data=bodies[i % len(bodies)], headers=_JSON) as answer:
                        if answer.status != 200:
                            await answer.read()
                            return str(answer.status)
                        async for line in answer.content:
                            if chunk_text(line) is not None:
                                arrivals.append(clock())
                except RuntimeError:
                    return STREAM_ERROR
                except Exception as exc:  # any failure is counted by its kind, never raised
                    return type(exc).__name__
                return Streamed.of(sent, arrivals)

            yield send


class ChatTarget(ScrapedTarget):
    """A chat endpoint; ``/metrics`` read when the server is carpool."""

    kind = "chat"

    def __init__(self, url: ChatURL, model: str, session: aiohttp.ClientSession) -> None:
        super().__init__(model, url.metrics, session)
        self.url = url
        self.metadata: dict[str, Any] = {"name": model}

    def __str__(self) -> str:
        return str(self.url)

    @classmethod
    @asynccontextmanager
    async def connect(cls, text: str, model: str | None) -> AsyncIterator[ChatTarget]:
        """Reach the server and pick the model from ``GET /v1/models``; :class:`BenchError`
        when the server is unreachable or does not list it."""
        import aiohttp

        url = parse_chat(text)
        timeout = aiohttp.ClientTimeout(total=CONTROL_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            ids = _model_ids(url.models, *await get(session, url.models))
            yield cls(url, _choose(url.models, ids, model), session)

    def client(self, bodies: Sequence[bytes], timeout_s: float) -> ChatStreamClient:
        return ChatStreamClient(self.url.chat, tuple(bodies), timeout_s)
