"""What ``carpool bench`` measures, and how one request reaches it.

A target is a model behind any v2 server (a URL), or a model loaded in this process and
served through its own :class:`~carpool.Batcher` (anything ``carpool serve`` takes). Each
gives its v2 metadata, a *client* (the load generator's one seam: ``send(i)`` sends request
``i`` and returns ``None`` or the kind of error) and server-side figures for a step's window:
carpool's ``/metrics``, or the batcher's own stats. Load shapes live in
``plan.py``, the loops that send in ``loops.py``, flags in ``flags.py`` and ``options.py``,
output in ``display.py``.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

import numpy as np

from carpool.batcher import Batcher
from carpool.bench.report import ServerSide
from carpool.bench.scrape import Snapshot, parse_metrics, server_side
from carpool.errors import CarpoolError
from carpool.model import Model, Preprocess
from carpool.stats import BatcherStats

if TYPE_CHECKING:
    import aiohttp

__all__ = [
    "BenchError",
    "Client",
    "HttpClient",
    "HttpTarget",
    "LocalClient",
    "LocalTarget",
    "ModelURL",
    "Send",
    "is_url",
    "load_model",
    "metadata_of",
    "parse_url",
    "snapshot_of",
]

Send = Callable[[int], Awaitable[str | None]]  # request index -> None, or the error's kind
Array = np.ndarray[Any, Any]

KEEPALIVE_S = 60.0  # idle pooled connections live across a step's pauses (aiohttp's is 15)
CONTROL_TIMEOUT_S = 10.0  # metadata and /metrics: a server that cannot answer these is down


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


# ----------------------------------------------------------------------------- over HTTP


def is_url(text: str) -> bool:
    return text.startswith(("http://", "https://"))


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


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, bytes]:
    import aiohttp

    try:
        async with session.get(url) as response:
            return response.status, await response.read()
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise _unreachable(url, exc) from None


class HttpTarget:
    """A model behind a v2 server; ``/metrics`` read when it is carpool's."""

    kind = "http"

    def __init__(
        self, url: ModelURL, metadata: Mapping[str, Any], session: aiohttp.ClientSession
    ) -> None:
        self.url = url
        self.metadata = dict(metadata)
        self.name = str(metadata.get("name") or url.model)
        self._session = session
        self._scrape = True  # until /metrics turns out not to describe this model

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
            status, body = await _get(session, url.metadata)
            if status != 200:
                message = body.decode(errors="replace")[:300].strip()
                raise BenchError(f"{url.metadata} answered HTTP {status}: {message}")
            try:
                metadata = json.loads(body)
                if not isinstance(metadata, dict) or not isinstance(metadata.get("inputs"), list):
                    raise ValueError("no 'inputs' list")
            except ValueError as exc:
                raise BenchError(f"{url.metadata} is not v2 model metadata: {exc}") from None
            yield cls(url, metadata, session)

    def client(self, bodies: Sequence[tuple[bytes, Mapping[str, str]]], timeout_s: float) -> Client:
        return HttpClient(self.url.infer, tuple((b, dict(h)) for b, h in bodies), timeout_s)

    async def snapshot(self) -> Snapshot | None:
        """The model's counters in ``/metrics``; ``None`` when it has none (not carpool)."""
        if not self._scrape:
            return None
        try:
            status, body = await _get(self._session, self.url.metrics)
            text = body.decode(errors="replace")
            snap = parse_metrics(text, self.name) if status == 200 else None
        except BenchError:
            return None  # the server went away: the step's errors say so
        except ImportError:  # prometheus-client, to read the text, is not installed
            snap = None
        self._scrape = snap is not None
        return snap

    def server_side(
        self, before: Snapshot | None, after: Snapshot | None, latency_sum_s: float
    ) -> ServerSide | None:
        if before is None or after is None:
            return None
        return server_side(before, after, latency_sum_s=latency_sum_s)


@dataclass(frozen=True, slots=True)
class HttpClient:
    """Pre-encoded requests POSTed over a keep-alive pool. Picklable: each client process
    opens its own."""

    url: str
    bodies: tuple[tuple[bytes, dict[str, str]], ...]
    timeout_s: float

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

            async def send(i: int) -> str | None:
                body, headers = bodies[i % n]
                try:
                    async with post(url, data=body, headers=headers) as response:
                        await response.read()
                        status = response.status
                except Exception as exc:  # any failure is counted by its kind, never raised
                    return type(exc).__name__
                return None if status == 200 else str(status)

            yield send


# ----------------------------------------------------------------------------- in process


def load_model(target: str, overrides: Mapping[str, Any]) -> Model:
    """What ``carpool serve TARGET`` would serve, with batching ``overrides`` applied."""
    from carpool.errors import ConfigError
    from carpool.loading import check_batching, load_target

    try:
        model = load_target(target)
        if overrides:
            merged = model.batching.merged(overrides)
            check_batching(merged)
            model = replace(model, batching=merged)
    except (ConfigError, ValueError, TypeError) as exc:
        raise BenchError(str(exc)) from None
    return model


def metadata_of(model: Model) -> dict[str, Any]:
    """The v2 metadata ``carpool serve`` gives for ``model`` (a leading -1 when it batches)."""
    batched = model.batching.batched

    def tensor(spec: Any) -> dict[str, Any]:
        shape = [-1, *spec.shape] if batched else list(spec.shape)
        return {"name": spec.name, "datatype": spec.datatype, "shape": shape}

    return {
        "name": model.name,
        "versions": [model.version],
        "platform": model.platform,
        "inputs": [tensor(t) for t in model.input_specs],
        "outputs": [tensor(t) for t in model.output_specs],
    }


class LocalTarget:
    """A model served in this process by its own batcher, which ``serving`` runs."""

    kind = "in-process"

    def __init__(self, model: Model, batcher: Batcher, text: str) -> None:
        self.model = model
        self.batcher = batcher
        self.metadata = metadata_of(model)
        self.name = str(model.name)
        self._text = text

    def __str__(self) -> str:
        return self._text

    @classmethod
    @asynccontextmanager
    async def serving(cls, model: Model, text: str) -> AsyncIterator[LocalTarget]:
        async with model.batcher() as batcher:
            yield cls(model, batcher, text)

    def client(self, values: Sequence[Mapping[str, Array]]) -> Client:
        batched = self.model.batching.batched
        # a model that does not batch gets its tensor whole; the batcher still wants rows
        rows = [{k: v if batched else v[np.newaxis] for k, v in r.items()} for r in values]
        return LocalClient(self.batcher, rows, self.model.preprocess)

    async def snapshot(self) -> Snapshot:
        return snapshot_of(self.batcher.stats(), self.model.batching.max_batch_size)

    def server_side(self, before: Snapshot, after: Snapshot, latency_sum_s: float) -> ServerSide:
        return server_side(before, after, latency_sum_s=latency_sum_s)


@dataclass(frozen=True, slots=True)
class LocalClient:
    """Requests straight into a running batcher, as the server submits them: the model's
    ``preprocess`` on arrival, then ``infer_many``. No HTTP: the batcher measured alone."""

    batcher: Batcher
    values: list[dict[str, Array]]
    preprocess: Preprocess | None

    @asynccontextmanager
    async def open(self, connections: int) -> AsyncIterator[Send]:
        infer_many, values, n, prep = (
            self.batcher.infer_many,
            self.values,
            len(self.values),
            self.preprocess,
        )

        async def send(i: int) -> str | None:
            try:
                value: Any = values[i % n]
                if prep is not None:
                    value = dict(prep(value))
                await infer_many(value)
            except Exception as exc:  # counted by kind: QueueFull, the model's own error
                return type(exc).__name__
            return None

        yield send


def _bounds(largest: int) -> list[int]:
    """The batch-size buckets carpool's ``/metrics`` uses: powers of two up to the largest."""
    bounds = [1]
    while bounds[-1] < largest:
        bounds.append(min(bounds[-1] * 2, largest))
    return bounds


def snapshot_of(stats: BatcherStats, max_batch_size: int) -> Snapshot:
    """What ``/metrics`` would say of a batcher with these stats, as a scrape reads it; so
    in-process and HTTP steps get their server-side figures from the same arithmetic."""
    buckets = {
        str(bound): float(sum(n for size, n in stats.batch_sizes.items() if size <= bound))
        for bound in _bounds(max(1, max_batch_size))
    }
    buckets["+Inf"] = float(sum(stats.batch_sizes.values()))
    return Snapshot(
        batch_count=stats.batches,
        batch_rows=stats.rows,
        batch_buckets=buckets,
        queue_wait_count=stats.queue_wait_seconds.count,
        queue_wait_sum=stats.queue_wait_seconds.sum,
        model_count=stats.model_seconds.count,
        model_sum=stats.model_seconds.sum,
    )
