"""The servers of ``benchmarks.streams.llm`` (and the peers of ``.chat``), each on the same GGUF
with one thread: the options that choose them, how each starts, where it streams, what a
request body is, which events of its stream are tokens, and the loop that measures each in
turn. A peer that is not installed (or built) is ``Missing``: a note, its figures NaN.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import common
from benchmarks.harness import processes as _process
from carpool.backends.smollm2.files import gguf_path
from carpool.backends.smollm2.served import default_engine

SERVERS = ("carpool_llama", "carpool_torch", "llama_cpp_python", "llama_server")
PEERS = ("llama_cpp_python", "llama_server")  # the servers ``start_peer`` starts
LLAMA_SERVER = common.REPO / "benchmarks" / ".llama-server" / "llama-server"
SLOTS = 16  # carpool's max_sequences and llama-server's --parallel
CONTEXT = 1024  # tokens per sequence, as carpool's llama engine holds


@dataclass(frozen=True)
class Request:
    """What a client posts to stream one answer, and how it reads the events."""

    path: str
    body: dict[str, Any]
    token: Callable[[dict[str, Any]], str | None]  # an event's token text; None: no token


class Missing(Exception):
    """A peer that cannot run here: the message says what to install or build."""


@dataclass(frozen=True)
class Window:
    """A cell's warm-up and measured seconds: a full run's and a ``--quick`` one's."""

    warmup_s: float
    duration_s: float
    quick_warmup_s: float
    quick_duration_s: float

    def of(self, args: argparse.Namespace) -> tuple[float, float]:
        """The warm-up and window seconds ``args`` ask for."""
        warmup = self.quick_warmup_s if args.quick else self.warmup_s
        duration = self.quick_duration_s if args.quick else self.duration_s
        return (
            warmup if args.warmup is None else args.warmup,
            duration if args.duration is None else args.duration,
        )


def add_names(p: argparse.ArgumentParser, option: str, known: tuple[str, ...], what: str) -> None:
    """``option``: some of ``known`` (all by default), comma-separated, or 'none' (``chosen``)."""
    listed = ",".join(known)
    p.add_argument(
        option, default=listed, help=f"{what}, comma-separated, or 'none' (default {listed})"
    )


def add_options(p: argparse.ArgumentParser, window: Window) -> None:
    """``--llama-server``, ``--warmup`` and ``--duration`` (``window``'s seconds by default)."""
    p.add_argument(
        "--llama-server",
        type=Path,
        default=LLAMA_SERVER,
        metavar="PATH",
        help="llama.cpp's llama-server binary (default: the one "
        "benchmarks/streams/setup_llama_server.sh builds)",
    )
    p.add_argument(
        "--warmup",
        type=float,
        default=None,
        help=f"warm-up seconds per cell ({window.warmup_s:g}; quick {window.quick_warmup_s:g})",
    )
    p.add_argument(
        "--duration",
        type=float,
        default=None,
        help=f"window seconds per cell ({window.duration_s:g}; quick {window.quick_duration_s:g})",
    )


def pinned(args: argparse.Namespace) -> tuple[_process.Cores, Path]:
    """``--cpus``'s cores, this process pinned to the client's; and the GGUF the servers run."""
    cores = _process.split_cpus(args.cpus)
    _process.pin_self(cores.client)
    return cores, gguf_path()


def chosen(spec: str, known: tuple[str, ...], what: str) -> list[str]:
    """The names of an option's comma-separated ``spec`` ('none': none), each one of ``known``."""
    names = [] if spec == "none" else [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown {what} {unknown[0]!r}: one of {list(known)} or 'none'")
    return names


def carpool_request(prompt: str, max_tokens: int) -> Request:
    body = {
        "text_input": prompt,
        "parameters": {"max_tokens": max_tokens, "temperature": 0, "seed": 1},
    }
    return Request("/v2/models/smollm2/generate_stream", body, _carpool_token)


def openai_request(prompt: str, max_tokens: int, **extra: Any) -> Request:
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 1,
        "stream": True,
        **extra,
    }
    return Request("/v1/chat/completions", body, _openai_token)


def _carpool_token(event: dict[str, Any]) -> str | None:
    if "error" in event:
        raise RuntimeError(f"stream error: {event['error']}")
    if "text_output" not in event:
        raise RuntimeError(f"carpool stream event without text_output: {event}")
    return str(event["text_output"])


def _openai_token(event: dict[str, Any]) -> str | None:
    if "error" in event:
        raise RuntimeError(f"stream error: {event['error']}")
    choices = event.get("choices") or []
    content = (choices[0].get("delta") or {}).get("content") if choices else None
    return None if content is None else str(content)


def start(
    name: str,
    gguf: Path,
    cores: _process.Cores,
    llama_server: Path,
    tmp: Path,
    *,
    reuse: bool = False,
) -> _process.Server:
    """Server ``name`` started pinned to the servers' core (not waited on); ``Missing``
    when it cannot run here. ``reuse``: carpool's prefix cache at its default (on)."""
    if name.startswith("carpool_"):
        engine = name.removeprefix("carpool_")
        if importlib.util.find_spec(f"carpool.backends.smollm2.{engine}_engine") is None:
            raise Missing(f"carpool has no smollm2 {engine} engine")
        config = tmp / f"{engine}.toml"
        chosen = default_engine() if engine == "torch" else engine  # int8 where it runs fast
        config.write_text(
            f'[models.smollm2]\nengine = "{chosen}"\nthreads = 1\nmax_sequences = {SLOTS}\n'
        )
        # without reuse every prompt is prefilled, as llama-server's requests then ask
        # (cache_prompt false): the same prompt each time would otherwise be a cache hit
        cache = [] if reuse else ["--prefix-cache-size", "0"]
        return _process.carpool_serve(
            "smollm2", "--config", str(config), *cache,
            cpus=cores.server, name=f"carpool ({engine})",
        )  # fmt: skip
    if name in PEERS:
        return start_peer(name, gguf, cores, llama_server, SLOTS, CONTEXT)
    raise ValueError(f"unknown server {name!r}: one of {SERVERS}")


def start_peer(
    name: str, gguf: Path, cores: _process.Cores, llama_server: Path, slots: int, context: int
) -> _process.Server:
    """Peer ``name`` (one of ``PEERS``) started pinned to the servers' core with ``slots``
    sequences of ``context`` tokens (not waited on); ``Missing`` when it cannot run here."""
    port = _process.free_port()
    if name == "llama_cpp_python":
        absent = common.missing_modules(("sse_starlette", "starlette_context", "fastapi"))
        if absent:
            raise Missing(
                f"llama_cpp.server needs {', '.join(absent)}: "
                "pip install sse-starlette starlette-context fastapi pydantic-settings"
            )
        argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf),
                "--n_threads", "1", "--n_threads_batch", "1", "--n_ctx", str(context),
                "--flash_attn", "True", "--interrupt_requests", "False",
                "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
        return _process.Server(
            "llama_cpp.server", argv, port, cores.server, ready_path="/v1/models"
        )
    if name == "llama_server":
        if not llama_server.is_file():
            raise Missing(
                f"no llama-server at {llama_server}: bash benchmarks/streams/setup_llama_server.sh"
            )
        # cache_prompt is llama-server's default: a slot keeps its last prompt's KV cache
        # unless a request turns it off (``request`` does, for llm's one-shot streams).
        argv = [str(llama_server), "--model", str(gguf), "--host", "127.0.0.1",
                "--port", str(port), "--threads", "1", "--threads-batch", "1",
                "--parallel", str(slots), "--cont-batching", "--ctx-size", str(context * slots),
                "--flash-attn", "on", "--jinja", "--no-webui"]  # fmt: skip
        return _process.Server("llama-server", argv, port, cores.server, ready_path="/health")
    raise ValueError(f"unknown peer {name!r}: one of {PEERS}")


def measure_each(
    names: Iterable[str],
    start: Callable[[str], _process.Server],
    ready_s: float,
    measure: Callable[[str, _process.Server], None],
) -> None:
    """``measure`` each server of ``names`` in turn, started and ready, stopped after it; one
    that cannot run here (``Missing``) is a note, its figures NaN."""
    for name in names:
        try:
            server = start(name)
        except Missing as missing:
            print(f"note: {name} left out (NaN figures): {missing}", flush=True)
            continue
        try:
            server.wait_ready(ready_s)
            measure(name, server)
        finally:
            server.stop()


def request(name: str, prompt: str, max_tokens: int, *, reuse: bool = False) -> Request:
    """The streaming request server ``name`` answers. llama-server ignores EOS (it can) and,
    without ``reuse``, recomputes the prompt (``cache_prompt`` false; its default is true)."""
    if name.startswith("carpool_"):
        return carpool_request(prompt, max_tokens)
    if name == "llama_server":
        return openai_request(prompt, max_tokens, ignore_eos=True, cache_prompt=reuse)
    return openai_request(prompt, max_tokens)


def event_of(line: bytes) -> dict[str, Any] | None:
    """One SSE line's JSON event; None for other lines and the ``[DONE]`` sentinel."""
    text = line.decode("utf-8", "replace").strip()
    if not text.startswith("data:"):
        return None
    data = text[len("data:") :].strip()
    if not data or data == "[DONE]":
        return None
    event = json.loads(data)
    return event if isinstance(event, dict) else None
