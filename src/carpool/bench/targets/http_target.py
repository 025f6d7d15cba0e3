"""A model behind any v2 server (carpool, Triton, MLServer, KServe), as ``carpool bench`` measures
it: pre-encoded requests POSTed over a keep-alive pool, carpool's ``/metrics`` read around each
step. aiohttp is imported only when a server is reached."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from carpool.bench.report.data import ServerSide
from carpool.bench.report.scrape import Histograms, parse_metrics, server_side
from carpool.bench.targets.base import BenchError, Client, Send
from carpool.bench.targets.payload import is_unique

if TYPE_CHECKING:
    import aiohttp

__all__ = [
    "HttpClient",
    "HttpTarget",
    "ModelURL",
    "ScrapedTarget",
    "answered",
    "get",
    "parse_url",
    "scrape",
]

KEEPALIVE_S = 60.0  # idle pooled connections live across a step's pauses (aiohttp's is 15)
CONTROL_TIMEOUT_S = 10.0  # metadata and /metrics: a server that cannot answer these is down


@dataclass(frozen=True, slots=True)
class ModelURL:
    """``http://HOST:PORT/v2/models/NAME[/versions/V]``, split into what bench uses."""

    base: str  # scheme://host:port
    model: str
    version: str | None = None

    @property
    def metadata(self) -> str:
        suffix = f"/versions/{self.version}" if self.version else ""
        return f"{self.base}/v2/models/{self.model}{suffix}"

    @property
    def infer(self) -> str:
        return self.metadata + "/infer"

    @property
    def metrics(self) -> str:
        return self.base + "/metrics"

    def __str__(self) -> str:
        return self.metadata


def parse_url(text: str) -> ModelURL:
    """A model URL as a v2 server exposes it; a trailing ``/infer`` is allowed."""
    parts = urlsplit(text)
    segments = [s for s in parts.path.split("/") if s]
    if segments and segments[-1] == "infer":
        segments.pop()
    version = None
    if len(segments) == 5 and segments[3] == "versions":
        version = segments.pop()
        segments.pop()
    if not parts.netloc or len(segments) != 3 or segments[:2] != ["v2", "models"]:
        raise BenchError(
            f"TARGET URL {text!r} must name a model: http://HOST:PORT/v2/models/NAME "
            "(optionally /versions/V)"
        )
    return ModelURL(f"{parts.scheme}://{parts.netloc}", segments[2], version)


def _unreachable(url: str, exc: BaseException) -> BenchError:
    cause = getattr(exc, "os_error", exc)
    code = getattr(cause, "errno", None)
    if isinstance(code, int) and code:
        reason = os.strerror(code).lower()
    elif isinstance(exc, TimeoutError):
        reason = f"no answer within {CONTROL_TIMEOUT_S:g}s"
    else:
        reason = str(exc) or type(exc).__name__
    hint = "; is the server running?" if code == errno.ECONNREFUSED else ""
    return BenchError(f"cannot reach {url}: {reason}{hint}")


async def get(session: aiohttp.ClientSession, url: str) -> tuple[int, bytes]:
    """``GET url``: its status and body; :class:`BenchError` when the server cannot be
    reached."""
    import aiohttp

    try:
        async with session.get(url) as response:
            return response.status, await response.read()
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise _unreachable(url, exc) from None


def answered(url: str, status: int, body: bytes) -> BenchError:
    """The :class:`BenchError` for a control request (metadata, a model list) that ``url``
    answered with an HTTP error: its status and the start of its body."""
    message = body.decode(errors="replace")[:300].strip()
    return BenchError(f"{url} answered HTTP {status}: {message}")


async def scrape(
    session: aiohttp.ClientSession, url: str, model: str
) -> tuple[Histograms | None, bool]:
    """``model``'s counters in the ``/metrics`` at ``url``, and whether to read it again:
    not when it has none (not carpool, or prometheus-client is not installed here)."""
    try:
        status, body = await get(session, url)
        text = body.decode(errors="replace")
        snap = parse_metrics(text, model) if status == 200 else None
    except BenchError:
        return None, True  # the server went away: the step's errors say so
    except ImportError:  # prometheus-client, to read the text, is not installed
        snap = None
    return snap, snap is not None


class ScrapedTarget:
    """A model behind an HTTP server whose ``/metrics`` is read around each step while it
    describes the model (carpool's): the probe half of :class:`HttpTarget` and
    :class:`~carpool.bench.targets.openai_target.OpenAITarget`."""

    def __init__(self, name: str, metrics: str, session: aiohttp.ClientSession) -> None:
        self.name = name
        self._metrics = metrics  # the server's /metrics URL
        self._session = session
        self._scrape = True  # until /metrics turns out not to describe this model

    async def snapshot(self) -> Histograms | None:
        """The model's counters in ``/metrics``; ``None`` when it has none (not carpool)."""
        if not self._scrape:
            return None
        snap, self._scrape = await scrape(self._session, self._metrics, self.name)
        return snap

    def server_side(
        self, before: Histograms | None, after: Histograms | None, latency_sum_s: float
    ) -> ServerSide | None:
        if before is None or after is None:
            return None
        return server_side(before, after, latency_sum_s=latency_sum_s)


class HttpTarget(ScrapedTarget):
    """A model behind a v2 server; ``/metrics`` read when it is carpool's."""

    kind = "http"

    def __init__(
        self, url: ModelURL, metadata: Mapping[str, Any], session: aiohttp.ClientSession
    ) -> None:
        super().__init__(str(metadata.get("name") or url.model), url.metrics, session)
        self.url = url
        self.metadata = dict(metadata)

    def __str__(self) -> str:
        return str(self.url)

    @classmethod
    @asynccontextmanager
    async def connect(cls, text: str) -> AsyncIterator[HttpTarget]:
        """Reach the server and read the model's metadata; :class:`BenchError` when the
        server is unreachable or does not serve that model."""
        import aiohttp

        url = parse_url(text)
        timeout = aiohttp.ClientTimeout(total=CONTROL_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            status, body = await get(session, url.metadata)
            if status != 200:
                raise answered(url.metadata, status, body)
            try:
                metadata = json.loads(body)
                if not isinstance(metadata, dict) or not isinstance(metadata.get("inputs"), list):
                    raise ValueError("no 'inputs' list")
            except ValueError as exc:
                raise BenchError(f"{url.metadata} is not v2 model metadata: {exc}") from None
            yield cls(url, metadata, session)

    def client(
        self,
        bodies: Sequence[tuple[bytes, Mapping[str, str]]],
        timeout_s: float,
        others: Sequence[tuple[bytes, Mapping[str, str]]] = (),
        repeat_fraction: float = 1.0,
    ) -> Client:
        """``bodies`` in turn; with ``others``, a share ``1 - repeat_fraction`` of the sends
        are ``others``' in turn instead."""
        sent, also = (tuple((b, dict(h)) for b, h in given) for given in (bodies, others))
        return HttpClient(self.url.infer, sent, timeout_s, also, repeat_fraction)


@dataclass(frozen=True, slots=True)
class HttpClient:
    """Pre-encoded requests POSTed over a keep-alive pool. Picklable: each client process
    opens its own."""

    url: str
    bodies: tuple[tuple[bytes, dict[str, str]], ...]
    timeout_s: float
    others: tuple[tuple[bytes, dict[str, str]], ...] = ()  # --repeat-fraction's others
    repeat_fraction: float = 1.0  # the share of sends that are ``bodies``'

    @asynccontextmanager
    async def open(self, connections: int) -> AsyncIterator[Send]:
        import aiohttp

        connector = aiohttp.TCPConnector(
            limit=connections, limit_per_host=connections, keepalive_timeout=KEEPALIVE_S
        )
        async with aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            skip_auto_headers=("User-Agent",),
            auto_decompress=False,
        ) as session:
            post, url, bodies, n = session.post, self.url, self.bodies, len(self.bodies)
            others, fraction = self.others, self.repeat_fraction

            async def send(i: int) -> str | None:
                if others and is_unique(i, fraction):
                    body, headers = others[i % len(others)]
                else:
                    body, headers = bodies[i % n]
                try:
                    async with post(url, data=body, headers=headers) as response:
                        await response.read()
                        status = response.status
                except Exception as exc:  # any failure is counted by its kind, never raised
                    return type(exc).__name__
                return None if status == 200 else str(status)

            yield send
