"""An OpenAI-compatible embeddings endpoint (carpool, vLLM, TEI, OpenAI), as ``carpool bench``
measures it: request bodies encoded once, POSTed over the keep-alive pool v2 requests use.
aiohttp is imported only when a server is reached."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Self, TypeVar
from urllib.parse import urlsplit

from carpool.bench.targets.base import EMBEDDINGS_PATH, BenchError, Client
from carpool.bench.targets.http_target import (
    CONTROL_TIMEOUT_S,
    HttpClient,
    ScrapedTarget,
    answered,
    get,
)

if TYPE_CHECKING:
    import aiohttp

__all__ = ["ENCODINGS", "EmbeddingsURL", "OpenAITarget", "embedding_bodies", "parse_embeddings"]

ENCODINGS = ("float", "base64")  # OpenAI's encoding_format values; float is its default
_JSON = {"Content-Type": "application/json"}


@dataclass(frozen=True, slots=True)
class _OpenAIURL:
    """``http://HOST:PORT[/PREFIX]`` and an OpenAI endpoint's ``PATH``: what either of
    bench's OpenAI targets reaches."""

    base: str  # scheme://host:port
    prefix: str = ""  # the path before the endpoint's ("" at the server's root)
    PATH: ClassVar[str] = ""

    @property
    def endpoint(self) -> str:
        return f"{self.base}{self.prefix}{self.PATH}"

    @property
    def models(self) -> str:
        return f"{self.base}{self.prefix}/v1/models"

    @property
    def metrics(self) -> str:
        return self.base + "/metrics"

    def __str__(self) -> str:
        return self.endpoint


def _split_url(text: str, path: str) -> tuple[str, str]:
    """``(base, prefix)`` of an HTTP URL whose path ends in an endpoint's ``path``."""
    parts = urlsplit(text)
    full = parts.path.rstrip("/")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise BenchError(f"TARGET {text!r} must be http://HOST:PORT{path}")
    if not full.endswith(path):
        raise BenchError(f"TARGET {text!r} must end in {path}")
    return f"{parts.scheme}://{parts.netloc}", full[: -len(path)]


@dataclass(frozen=True, slots=True)
class EmbeddingsURL(_OpenAIURL):
    """``http://HOST:PORT[/PREFIX]/v1/embeddings``, split into what bench uses."""

    PATH: ClassVar[str] = EMBEDDINGS_PATH

    @property
    def embeddings(self) -> str:
        return self.endpoint


def parse_embeddings(text: str) -> EmbeddingsURL:
    """An embeddings URL: an HTTP URL whose path ends in ``/v1/embeddings``."""
    return EmbeddingsURL(*_split_url(text, EMBEDDINGS_PATH))


def embedding_bodies(
    texts: Sequence[str], *, model: str, count: int, rows: int = 1, encoding: str = "float"
) -> list[bytes]:
    """``count`` request bodies cycling through ``texts``: ``"input"`` is one string when
    ``rows`` is 1, else a list of ``rows`` strings. Raises ``ValueError`` for no texts, a
    count or rows below 1, or an ``encoding`` OpenAI does not define."""
    if not texts:
        raise ValueError("no texts to send; give at least one")
    if count < 1 or rows < 1:
        raise ValueError(f"count and rows must be >= 1, got {count} and {rows}")
    if encoding not in ENCODINGS:
        raise ValueError(f"encoding_format must be one of {', '.join(ENCODINGS)}, got {encoding!r}")
    bodies = []
    for j in range(count):
        picked = [texts[(j * rows + k) % len(texts)] for k in range(rows)]
        doc = {"model": model, "input": picked[0] if rows == 1 else picked}
        doc["encoding_format"] = encoding
        bodies.append(json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode())
    return bodies


def _model_ids(url: str, status: int, body: bytes) -> list[str]:
    if status != 200:
        raise answered(url, status, body)
    try:
        data = json.loads(body)["data"]
        return [str(item["id"]) for item in data]
    except (ValueError, KeyError, TypeError):
        raise BenchError(f"{url} is not an OpenAI model list ({{'data': [{{'id'}}]}})") from None


def _choose(url: str, ids: list[str], model: str | None) -> str:
    listed = ", ".join(ids) or "none"
    if model is None:
        if len(ids) != 1:
            raise BenchError(f"{url} lists models {listed}: choose one with --model NAME")
        return ids[0]
    if model not in ids:
        raise BenchError(f"{url} does not list model {model!r} (it lists {listed})")
    return model


_URL = TypeVar("_URL", bound=_OpenAIURL)


class _ListedTarget(ScrapedTarget, Generic[_URL]):
    """An OpenAI endpoint serving a model its ``GET /v1/models`` lists; ``/metrics`` read when
    the server is carpool. A subclass names its URL's parser."""

    def __init__(self, url: _URL, model: str, session: aiohttp.ClientSession) -> None:
        super().__init__(model, url.metrics, session)
        self.url = url
        self.metadata: dict[str, Any] = {"name": model}

    def __str__(self) -> str:
        return str(self.url)

    @classmethod
    def _parse(cls, text: str) -> _URL:
        raise NotImplementedError

    @classmethod
    @asynccontextmanager
    async def connect(cls, text: str, model: str | None) -> AsyncIterator[Self]:
        """Reach the server and pick the model from ``GET /v1/models``; :class:`BenchError`
        when the server is unreachable or does not list it."""
        import aiohttp

        url = cls._parse(text)
        timeout = aiohttp.ClientTimeout(total=CONTROL_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            ids = _model_ids(url.models, *await get(session, url.models))
            yield cls(url, _choose(url.models, ids, model), session)


class OpenAITarget(_ListedTarget[EmbeddingsURL]):
    """An embeddings endpoint; ``/metrics`` read when the server is carpool."""

    kind = "openai"

    @classmethod
    def _parse(cls, text: str) -> EmbeddingsURL:
        return parse_embeddings(text)

    def client(self, bodies: Sequence[bytes], timeout_s: float) -> Client:
        return HttpClient(self.url.embeddings, tuple((b, dict(_JSON)) for b in bodies), timeout_s)
