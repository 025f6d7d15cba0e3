"""One cell of ``benchmarks.streams.chat`` (a server, a prompt set, a count of conversations)
as ``carpool bench --stream`` measures it on ``/v1/chat/completions``: its report's outputs/s,
time to first output and between outputs, and its errors, as a :class:`Cell`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from benchmarks.harness import processes as _process
from benchmarks.streams import _chat_prompts

STATS = ("tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "errors")
MAX_TOKENS = 32
TIMEOUT_S = 300  # a stream queued behind 63 others on llama-cpp-python waits its turn


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


def bench_cell(
    server: _process.Server,
    prompt_set: str,
    index: int,
    clients: int,
    warmup: float,
    duration: float,
    *,
    cpus: frozenset[int] | None,
    folder: Path,
) -> Cell:
    """``clients`` closed-loop conversations of questions slice ``index`` for ``warmup +
    duration`` seconds, by ``python -m carpool bench URL --stream``, pinned to ``cpus``."""
    chats = _chat_prompts.write_bench(folder / "chats.jsonl", prompt_set, index)
    flags = ["--stream", "--lengths", f"fixed:{MAX_TOKENS}", "--input-data", str(chats),
             "--timeout", str(TIMEOUT_S)]  # fmt: skip
    done = _process.carpool_bench(
        server, "", [clients], warmup=warmup, duration=duration, cpus=cpus, flags=flags,
        target=server.base + "/v1/chat/completions",
    )  # fmt: skip
    (step,) = done.report.steps
    streams = step.streams
    nan = math.nan
    return Cell(
        tokens_per_s=streams.outputs_per_s if streams else 0.0,
        ttft_p50_ms=streams.ttfo.p50 if streams and streams.ttfo else nan,
        ttft_p99_ms=streams.ttfo.p99 if streams and streams.ttfo else nan,
        itl_p50_ms=streams.tpo.p50 if streams and streams.tpo else nan,
        itl_p99_ms=streams.tpo.p99 if streams and streams.tpo else nan,
        errors=sum(step.errors.values()),
        tokens_per_stream=streams.outputs_mean if streams else nan,
    )
