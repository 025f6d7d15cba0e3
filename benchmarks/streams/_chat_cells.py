"""One cell of ``benchmarks.streams.chat`` (a server, a prompt set, a count of conversations)
as the scenario's own client measures it: closed-loop conversations over aiohttp, each a new
question, every token's arrival timed; what arrived inside the window, as a :class:`Cell`."""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from dataclasses import dataclass

from benchmarks.streams import _chat_prompts
from benchmarks.streams._llm_client import Stream, _quantile, _stream
from benchmarks.streams._llm_servers import Request, openai_request

STATS = ("tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "errors")
MAX_TOKENS = 32


@dataclass(frozen=True)
class Cell:
    """A cell's figures, whichever tool measured them."""

    tokens_per_s: float  # streamed tokens (chunks with text) per second of the window
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float  # between one token and the next, within a stream
    itl_p99_ms: float
    errors: int  # requests that failed: an HTTP error, an error event, a broken stream
    tokens_per_stream: float  # the mean count of tokens a stream delivered


def client_cell(
    base: str, model: str, prompt_set: str, index: int, clients: int, warmup: float,
    duration: float,
) -> Cell:  # fmt: skip
    """``clients`` closed-loop conversations of questions slice ``index`` for ``warmup +
    duration`` seconds (a stream started in time is read to its end). In the window: tokens
    that arrived, per second; the first tokens that arrived (TTFT, from the send); the gaps
    that ended (ITL). A stream sent in the warm-up counts too: at 64 conversations on one
    core a stream outlasts the window."""
    questions = _chat_prompts.cell_questions(index)
    conversations = [_chat_prompts.conversation(prompt_set, q) for q in questions]
    requests = [openai_request("", MAX_TOKENS, model=model, messages=c) for c in conversations]
    streams = asyncio.run(_load(base, requests, clients, warmup + duration))
    start = min(s.sent for s in streams)
    low, high = start + warmup, start + warmup + duration
    ok = [s for s in streams if s.ok]
    ttft = [1e3 * (s.arrivals[0] - s.sent) for s in ok if low <= s.arrivals[0] <= high]
    gaps = [
        1e3 * (b - a) for s in ok for a, b in itertools.pairwise(s.arrivals) if low <= b <= high
    ]
    return Cell(
        tokens_per_s=sum(1 for s in ok for t in s.arrivals if low <= t <= high) / duration,
        ttft_p50_ms=_quantile(ttft, 0.5),
        ttft_p99_ms=_quantile(ttft, 0.99),
        itl_p50_ms=_quantile(gaps, 0.5),
        itl_p99_ms=_quantile(gaps, 0.99),
        errors=len(streams) - len(ok),
        tokens_per_stream=sum(len(s.arrivals) for s in ok) / len(ok) if ok else math.nan,
    )


async def _load(base: str, requests: list[Request], clients: int, seconds: float) -> list[Stream]:
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=600, sock_read=300)
    connector = aiohttp.TCPConnector(limit=0, force_close=True)  # llama-server drops idle ones
    async with aiohttp.ClientSession(base, timeout=timeout, connector=connector) as session:
        deadline = time.perf_counter() + seconds
        turns = itertools.cycle(requests)  # each conversation's next question, in turn

        async def conversation() -> list[Stream]:
            streams: list[Stream] = []
            while not streams or time.perf_counter() < deadline:
                streams.append(await _stream(session, next(turns)))
            return streams

        runs = [conversation() for _ in range(clients)]
        return [s for streams in await asyncio.gather(*runs) for s in streams]
