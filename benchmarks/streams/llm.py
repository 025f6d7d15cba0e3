"""SmolLM2-135M streamed side by side: ``carpool serve smollm2`` (iteration-level batching,
llama and torch engines) against llama-cpp-python's server (one request at a time) and
llama.cpp's llama-server (continuous batching), same GGUF, one core and one thread each, at
1, 4 and 16 closed-loop streams of 32 tokens: tokens/s, TTFT and time per output token
(docs/benchmarks/llm.md). Peers not installed or built are NaN, with a note.
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

from benchmarks.harness import Figures, common, run
from benchmarks.harness import processes as _process
from benchmarks.streams import _llm_client, _llm_servers
from benchmarks.streams._llm_servers import (
    PEERS,
    SERVERS,
    Window,
    add_names,
    add_options,
    chosen,
    measure_each,
    pinned,
)

CLIENTS = (1, 4, 16)
MAX_TOKENS = 32
# A chat prompt of 18 tokens whose greedy answer runs past 32 tokens on every server.
PROMPT = "Write a short story about a small robot who learns to paint the night sky."
ENGINES = ("llama", "torch")
DEFAULT = "carpool_torch"  # carpool serve smollm2's default engine: the goals are its
STATS = ("tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms",
         "tokens_per_stream")  # fmt: skip
UNITS = {"tokens_per_s": "tok/s", "tokens_per_stream": "tokens"}
WINDOW = Window(warmup_s=5.0, duration_s=30.0, quick_warmup_s=0.5, quick_duration_s=3.0)


def parser() -> argparse.ArgumentParser:
    p = common.base_parser(__doc__, default_cpus="0,1", default_repeats=1)
    what = "carpool's engines (one carpool lacks is left out with a note)"
    add_names(p, "--engines", ENGINES, what)
    add_names(p, "--peers", PEERS, "peers to run")
    add_options(p, WINDOW)
    p.add_argument(
        "--reuse",
        action="store_true",
        help="every server reuses the prompt's state, as llama-cpp-python always does: "
        "carpool's prefix cache and llama-server's cache_prompt at their defaults (on); "
        "without it, only llama-cpp-python does (it cannot be turned off)",
    )
    return p


def measure(args: argparse.Namespace) -> Figures:
    warmup, duration = WINDOW.of(args)
    names = [f"carpool_{e}" for e in chosen(args.engines, ENGINES, "engine")]
    names += chosen(args.peers, PEERS, "peer")
    cores, gguf = pinned(args)
    common.header(
        "SmolLM2-135M streams: carpool against llama-cpp-python and llama-server",
        {"gguf": gguf.name, "cores": str(cores), "prompt": PROMPT, "max_tokens": MAX_TOKENS,
         "clients": CLIENTS, "warmup_s": warmup, "window_s": duration,
         "prompt_reuse": "every server" if args.reuse else "llama-cpp-python only"},
    )  # fmt: skip
    cells: dict[str, dict[int, _llm_client.Cell]] = {}
    with tempfile.TemporaryDirectory(prefix="carpool-llm-") as tmp:

        def start(name: str) -> _process.Server:
            return _llm_servers.start(
                name, gguf, cores, args.llama_server, Path(tmp), reuse=args.reuse
            )

        def measured(name: str, server: _process.Server) -> None:
            cells[name] = _run(name, server.base, warmup, duration, args.reuse)

        measure_each([name for name in SERVERS if name in names], start, 180, measured)
    return _figures(cells)


def _run(
    name: str, base: str, warmup: float, duration: float, reuse: bool
) -> dict[int, _llm_client.Cell]:
    request = _llm_servers.request(name, PROMPT, MAX_TOKENS, reuse=reuse)
    first = _llm_client.one(base, request)
    if not first.ok:
        raise RuntimeError(f"{name}: the warm-up stream failed: {first.error or 'no tokens'}")
    print(f"\n{name}: {len(first.arrivals)} tokens: {''.join(first.text)!r}", flush=True)
    found = {}
    rows = []
    for clients in CLIENTS:
        cell = _llm_client.measure(base, request, clients, warmup, duration)
        found[clients] = cell
        rows.append([clients, common.fmt_num(cell.tokens_per_s, 1),
                     *(common.fmt_num(getattr(cell, s), 1) for s in STATS[1:]),
                     len(cell.streams), len(cell.failed)])  # fmt: skip
        print(f"  {name} x{clients}: {cell.tokens_per_s:.1f} tok/s", flush=True)
    headers = ["streams", "tok/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "TPOT p99 ms",
               "tokens/stream", "sent", "failed"]  # fmt: skip
    print(common.table(headers, rows), flush=True)
    return found


def _figures(cells: dict[str, dict[int, _llm_client.Cell]]) -> Figures:
    figures = Figures()
    nan = math.nan
    for name in SERVERS:
        for clients in CLIENTS:
            cell = cells.get(name, {}).get(clients)
            for what in STATS:
                value = float(getattr(cell, what)) if cell else nan
                figures.add(f"{name}_{what}_{clients}", value, UNITS.get(what, "ms"))

    def stat(name: str, what: str, clients: int) -> float:
        return float(figures[f"{name}_{what}_{clients}"])

    # The goals are carpool's default engine's (torch: int8 matrix products, packed).
    figures.at_least(
        "carpool_over_llama_server_tokens_per_s_16",
        stat(DEFAULT, "tokens_per_s", 16) / stat("llama_server", "tokens_per_s", 16),
        1.5,
    )
    figures.at_least(
        "carpool_over_llama_cpp_python_tokens_per_s_16",
        stat(DEFAULT, "tokens_per_s", 16) / stat("llama_cpp_python", "tokens_per_s", 16),
        3,
    )
    figures.at_most(
        "ttft_1_carpool_over_llama_server",
        stat(DEFAULT, "ttft_p50_ms", 1) / stat("llama_server", "ttft_p50_ms", 1),
        1.2,
    )
    streams = [s for by in cells.values() for cell in by.values() for s in cell.streams]
    failed = [s for s in streams if not s.ok]
    for s in failed[:3]:
        print(f"failed stream: {s.error or 'no tokens'}", flush=True)
    figures.add("servers_run", len(cells), "servers")
    figures.add("streams_failed", len(failed), "streams")
    figures.check("every_stream_delivered_tokens", bool(streams) and not failed)
    texts = {"".join(s.text) for cell in cells.get("carpool_llama", {}).values()
             for s in cell.streams}  # fmt: skip
    figures.check("carpool_llama_greedy_texts_equal", len(texts) <= 1)
    return figures


if __name__ == "__main__":
    raise SystemExit(run(measure, parser()))
