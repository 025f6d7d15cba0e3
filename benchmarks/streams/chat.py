"""Chat side by side: ``carpool serve smollm2`` (torch engine, prefix cache on, and once off)
against llama.cpp's llama-server and llama-cpp-python's server, same GGUF, one core and one
thread each, all on ``/v1/chat/completions`` streamed; 1, 4, 16 and 64 conversations,
unrelated prompts and a shared 300-token system prompt; measured by the scenario's own client
and by aiperf (docs/benchmarks/chat.md). A peer or tool not installed is NaN, with a note.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchmarks.harness import Figures, common, run
from benchmarks.harness import processes as _process
from benchmarks.streams import _chat_aiperf, _chat_prompts, _chat_servers, _llm_client
from benchmarks.streams._chat_cells import MAX_TOKENS, STATS, Cell, client_cell
from benchmarks.streams._llm_servers import (
    Window,
    add_names,
    add_options,
    chosen,
    measure_each,
    openai_request,
    pinned,
)

CLIENTS = (1, 4, 16, 64)
QUICK_CLIENTS = (1, 16)
PEERS = ("llama_server", "llama_cpp_python")
TOOLS = ("client", "aiperf")
UNITS = {"tokens_per_s": "tok/s", "errors": "requests"}
WINDOW = Window(warmup_s=3.0, duration_s=10.0, quick_warmup_s=0.5, quick_duration_s=5.0)
# (server, prompt set) runs: carpool without reuse only where there is something to reuse.
RUNS = (
    ("carpool", "unrelated"), ("carpool", "shared"), ("carpool_no_reuse", "shared"),
    ("llama_server", "unrelated"), ("llama_server", "shared"),
    ("llama_cpp_python", "unrelated"), ("llama_cpp_python", "shared"),
)  # fmt: skip

Cells = dict[tuple[str, str, str, int], Cell]  # (tool, server, set, clients) -> cell


def parser() -> argparse.ArgumentParser:
    p = common.base_parser(__doc__, default_cpus="0,1", default_repeats=1)
    add_names(p, "--peers", PEERS, "peers to run")
    add_names(
        p,
        "--tools",
        TOOLS,
        "clients measuring each cell: client (the scenario's own), aiperf (its venv: "
        "benchmarks/streams/setup_aiperf.sh)",
    )
    add_options(p, WINDOW)
    return p


def measure(args: argparse.Namespace) -> Figures:
    warmup, duration = WINDOW.of(args)
    clients = QUICK_CLIENTS if args.quick else CLIENTS
    servers = ["carpool", "carpool_no_reuse", *chosen(args.peers, PEERS, "peer")]
    tools = chosen(args.tools, TOOLS, "tool")
    cores, gguf = pinned(args)
    if "aiperf" in tools and (why := _chat_aiperf.missing()):
        print(f"note: aiperf left out (NaN figures): {why}", flush=True)
        tools.remove("aiperf")
    common.header(
        "SmolLM2-135M chat: carpool against llama-server and llama-cpp-python",
        {"gguf": gguf.name, "cores": str(cores), "max_tokens": MAX_TOKENS, "clients": clients,
         "system_prompt": "287 tokens (shared set)", "tools": tools,
         "warmup_s": warmup, "window_s": duration},
    )  # fmt: skip
    cells: Cells = {}
    with tempfile.TemporaryDirectory(prefix="carpool-chat-") as tmp:

        def start(name: str) -> _process.Server:
            return _chat_servers.start(name, gguf, cores, args.llama_server, Path(tmp))

        def measured(name: str, server: _process.Server) -> None:
            model = _first(name, server.base)
            for prompt_set in [s for server_name, s in RUNS if server_name == name]:
                spec = _CellSpec(server, name, model, prompt_set, cores, Path(tmp), warmup,
                                 duration)  # fmt: skip
                cells.update(_cells(spec, clients, tools))

        names = [name for name in _chat_servers.SERVERS if name in servers]
        measure_each(names, start, 240, measured)
    return _figures(cells, clients)


def _first(name: str, base: str) -> str:
    """One stream read to its end: a warm-up, and the answer shown; the model's name."""
    model = _chat_servers.model_of(base)
    request = openai_request(_chat_prompts.WARMUP, MAX_TOKENS, model=model)
    first = _llm_client.one(base, request)
    if not first.ok:
        raise RuntimeError(f"{name}: the warm-up stream failed: {first.error or 'no tokens'}")
    print(f"\n{name}: {len(first.arrivals)} chunks: {''.join(first.text)!r}", flush=True)
    return model


@dataclass(frozen=True)
class _CellSpec:
    """Where and how one (server, prompt set)'s cells run."""

    server: _process.Server
    name: str
    model: str  # what /v1/models lists: the name requests give
    prompt_set: str
    cores: _process.Cores
    tmp: Path
    warmup: float
    duration: float


def _cells(spec: _CellSpec, clients: tuple[int, ...], tools: list[str]) -> Cells:
    found: Cells = {}
    rows = []
    for i, n in enumerate(clients):
        for j, tool in enumerate(TOOLS):
            if tool not in tools:
                continue
            # Each cell its own questions: no cell's prompt is cached by an earlier cell.
            index = (_chat_prompts.SETS.index(spec.prompt_set) * len(CLIENTS) + i) * 2 + j
            folder = spec.tmp / f"{spec.name}-{spec.prompt_set}-{n}-{tool}"
            folder.mkdir()
            if tool == "client":
                cell = client_cell(spec.server.base, spec.model, spec.prompt_set, index, n,
                                   spec.warmup, spec.duration)  # fmt: skip
            else:
                try:
                    cell = _chat_aiperf.cell(
                        spec.server, spec.prompt_set, index, n, spec.warmup, spec.duration,
                        cpus=spec.cores.client, folder=folder,
                    )  # fmt: skip
                except (RuntimeError, subprocess.TimeoutExpired) as exc:  # the tool, not a server
                    print(f"note: aiperf failed (NaN figures): {str(exc)[-500:]}", flush=True)
                    continue
            found[(tool, spec.name, spec.prompt_set, n)] = cell
            rows.append([tool, n, *(common.fmt_num(getattr(cell, s), 1) for s in STATS),
                         common.fmt_num(cell.tokens_per_stream, 1)])  # fmt: skip
            print(f"  {spec.name} {spec.prompt_set} x{n} {tool}: {cell.tokens_per_s:.1f} tok/s",
                  flush=True)  # fmt: skip
    headers = ["tool", "streams", "tok/s", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms",
               "ITL p99 ms", "errors", "tokens/stream"]  # fmt: skip
    print(f"{spec.name}, {spec.prompt_set} prompts:\n" + common.table(headers, rows), flush=True)
    return found


def _figures(cells: Cells, clients: tuple[int, ...]) -> Figures:
    figures = Figures()
    for tool in TOOLS:
        for server, prompt_set in RUNS:
            for n in clients:
                cell = cells.get((tool, server, prompt_set, n))
                for stat in STATS:
                    value = float(getattr(cell, stat)) if cell else math.nan
                    name = f"{tool}_{server}_{prompt_set}_{stat}_{n}"
                    figures.add(name, value, UNITS.get(stat, "ms"))
    for tool in TOOLS:
        _goals(figures, tool, clients)
    carpool = [c for (_, s, _, _), c in cells.items() if s.startswith("carpool")]
    figures.add("cells_run", len(cells), "cells")
    figures.check("carpool_cells_run", bool(carpool))
    figures.check("carpool_zero_errors", all(c.errors == 0 for c in carpool))
    return figures


def _goals(figures: Figures, tool: str, clients: tuple[int, ...]) -> None:
    """Issue 34's goals, as ``tool`` measured them (NaN where a cell did not run)."""

    def stat(server: str, what: str, n: int, prompt_set: str = "unrelated") -> float:
        name = f"{tool}_{server}_{prompt_set}_{what}_{n}"
        return float(figures[name]) if n in clients else math.nan

    rate = "tokens_per_s"
    figures.at_least(
        f"{tool}_carpool_over_llama_server_tokens_per_s_16",
        stat("carpool", rate, 16) / stat("llama_server", rate, 16),
        1.5,
    )
    figures.at_least(
        f"{tool}_carpool_over_llama_cpp_python_tokens_per_s_16",
        stat("carpool", rate, 16) / stat("llama_cpp_python", rate, 16),
        3,
    )
    # "holds its 16-stream rate": within 5 % of it, at four times the streams.
    figures.at_least(
        f"{tool}_carpool_64_over_16_tokens_per_s",
        stat("carpool", rate, 64) / stat("carpool", rate, 16),
        0.95,
    )
    figures.at_most(
        f"{tool}_shared_ttft_p50_16_reuse_over_no_reuse",
        stat("carpool", "ttft_p50_ms", 16, "shared")
        / stat("carpool_no_reuse", "ttft_p50_ms", 16, "shared"),
        0.5,
    )
    figures.at_most(f"{tool}_ttft_1_carpool_over_llama_server",
                    stat("carpool", "ttft_p50_ms", 1) / stat("llama_server", "ttft_p50_ms", 1),
                    1.2)  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(run(measure, parser()))
