"""The servers of ``benchmarks.streams.llm``, each on the same GGUF with one thread: how it
starts, where it streams, what a request body is and which events of its stream are tokens.
A peer that is not installed (or built) is None, with the reason printed by the caller.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import common
from benchmarks.harness import processes as _process
from carpool.backends.smollm2.served import default_engine

SERVERS = ("carpool_llama", "carpool_torch", "llama_cpp_python", "llama_server")
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
    name: str, gguf: Path, cores: _process.Cores, llama_server: Path, tmp: Path
) -> _process.Server:
    """Server ``name`` started pinned to the servers' core (not waited on); ``Missing``
    when it cannot run here."""
    if name.startswith("carpool_"):
        engine = name.removeprefix("carpool_")
        if importlib.util.find_spec(f"carpool.backends.smollm2.{engine}_engine") is None:
            raise Missing(f"carpool has no smollm2 {engine} engine")
        config = tmp / f"{engine}.toml"
        chosen = default_engine() if engine == "torch" else engine  # fp32 where no VNNI
        config.write_text(
            f'[models.smollm2]\nengine = "{chosen}"\nthreads = 1\nmax_sequences = {SLOTS}\n'
        )
        return _process.carpool_serve(
            "smollm2", "--config", str(config), cpus=cores.server, name=f"carpool ({engine})"
        )
    port = _process.free_port()
    if name == "llama_cpp_python":
        absent = common.missing_modules(("sse_starlette", "starlette_context", "fastapi"))
        if absent:
            raise Missing(
                f"llama_cpp.server needs {', '.join(absent)}: "
                "pip install sse-starlette starlette-context fastapi pydantic-settings"
            )
        argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf),
                "--n_threads", "1", "--n_threads_batch", "1", "--n_ctx", str(CONTEXT),
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
        argv = [str(llama_server), "--model", str(gguf), "--host", "127.0.0.1",
                "--port", str(port), "--threads", "1", "--threads-batch", "1",
                "--parallel", str(SLOTS), "--cont-batching", "--ctx-size", str(CONTEXT * SLOTS),
                "--flash-attn", "on", "--jinja", "--no-webui"]  # fmt: skip
        return _process.Server("llama-server", argv, port, cores.server, ready_path="/health")
    raise ValueError(f"unknown server {name!r}: one of {SERVERS}")


def request(name: str, prompt: str, max_tokens: int) -> Request:
    """The streaming request server ``name`` answers. llama-server ignores EOS (it can) and
    recomputes the prompt (no prompt cache, like the others' one-sequence-per-slot work)."""
    if name.startswith("carpool_"):
        return carpool_request(prompt, max_tokens)
    if name == "llama_server":
        return openai_request(prompt, max_tokens, ignore_eos=True, cache_prompt=False)
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
