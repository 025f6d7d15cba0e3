"""The streaming client of ``benchmarks.streams.llm``: closed-loop clients (each posts a
request, reads its SSE stream to the end, posts the next) over aiohttp, recording when each
token arrives; the cell's tokens/s, time to first token and time per output token.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from benchmarks.streams._llm_servers import Request, event_of

if TYPE_CHECKING:
    import aiohttp


@dataclass
class Stream:
    """One request's stream: when it was sent, when each token came, its text, its error."""

    sent: float
    arrivals: list[float] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and bool(self.arrivals)


@dataclass(frozen=True)
class Cell:
    """One server at one concurrency: the window's figures and every stream run."""

    clients: int
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p99_ms: float
    tokens_per_stream: float  # the mean count of tokens a stream delivered
    streams: list[Stream]

    @property
    def failed(self) -> list[Stream]:
        return [s for s in self.streams if not s.ok]


def measure(base: str, request: Request, clients: int, warmup: float, duration: float) -> Cell:
    """``clients`` closed-loop clients for ``warmup + duration`` seconds (a stream started
    in time is read to its end). In the window: tokens arrived per second, the first tokens
    that arrived (their TTFT) and the gaps that ended (TPOT): a stream sent in the warm-up
    counts too, since at 16 streams one may outlast the window. Tokens per stream: the mean
    over every stream that delivered any."""
    streams = asyncio.run(_load(base, request, clients, warmup + duration))
    start = min(s.sent for s in streams)
    low, high = start + warmup, start + warmup + duration
    ok = [s for s in streams if s.ok]
    tokens = sum(1 for s in ok for t in s.arrivals if low <= t <= high)
    ttft = [1e3 * (s.arrivals[0] - s.sent) for s in ok if low <= s.arrivals[0] <= high]
    gaps = [
        1e3 * (b - a)
        for s in ok
        for a, b in zip(s.arrivals, s.arrivals[1:], strict=False)
        if low <= b <= high
    ]
    counts = [len(s.arrivals) for s in ok]
    return Cell(
        clients=clients,
        tokens_per_s=tokens / duration,
        ttft_p50_ms=_quantile(ttft, 0.5),
        ttft_p99_ms=_quantile(ttft, 0.99),
        tpot_p50_ms=_quantile(gaps, 0.5),
        tpot_p99_ms=_quantile(gaps, 0.99),
        tokens_per_stream=float(np.mean(counts)) if counts else math.nan,
        streams=streams,
    )


def one(base: str, request: Request) -> Stream:
    """A single stream, read to its end (a warm-up, and a look at the answer)."""
    return asyncio.run(_load(base, request, 1, 0.0))[0]


def _quantile(values: list[float], q: float) -> float:
    return float(np.quantile(values, q)) if values else math.nan


async def _load(base: str, request: Request, clients: int, seconds: float) -> list[Stream]:
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=600, sock_read=300)
    connector = aiohttp.TCPConnector(limit=0, force_close=True)  # llama-server drops idle ones
    async with aiohttp.ClientSession(base, timeout=timeout, connector=connector) as session:
        deadline = time.perf_counter() + seconds
        runs = [_client(session, request, deadline) for _ in range(clients)]
        return [s for streams in await asyncio.gather(*runs) for s in streams]


async def _client(
    session: aiohttp.ClientSession, request: Request, deadline: float
) -> list[Stream]:
    """Streams one after another until ``deadline`` (at least one)."""
    streams: list[Stream] = []
    while not streams or time.perf_counter() < deadline:
        streams.append(await _stream(session, request))
    return streams


async def _stream(session: aiohttp.ClientSession, request: Request) -> Stream:
    stream = Stream(sent=time.perf_counter())
    try:
        async with session.post(request.path, json=request.body) as response:
            if response.status != 200:
                stream.error = f"HTTP {response.status}: {(await response.text())[:300]}"
                return stream
            async for line in response.content:
                event = event_of(line)
                token = None if event is None else request.token(event)
                if token is not None:
                    stream.arrivals.append(time.perf_counter())
                    stream.text.append(token)
    except Exception as exc:  # counted: the run's check fails on any failed stream
        stream.error = f"{type(exc).__name__}: {exc}"
    return stream
