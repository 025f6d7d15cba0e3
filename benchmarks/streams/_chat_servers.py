"""The servers of ``benchmarks.streams.chat``, each on the same GGUF with one thread and 64
sequences at once, all asked through ``POST /v1/chat/completions``: carpool with its prefix
cache (and once without), llama.cpp's llama-server, llama-cpp-python's server (the peers
started by ``_llm_servers.start_peer``, with this scenario's slots)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from benchmarks.harness import processes as _process
from benchmarks.streams._llm_servers import PEERS, Missing, start_peer
from carpool.backends.smollm2.served import default_engine

SERVERS = ("carpool", "carpool_no_reuse", "llama_server", "llama_cpp_python")
SLOTS = 64  # carpool's max_sequences and llama-server's --parallel: the 64 cell's streams
CONTEXT = 1024  # tokens per sequence: a 300-token system prompt, a question, 32 tokens


def start(
    name: str, gguf: Path, cores: _process.Cores, llama_server: Path, tmp: Path
) -> _process.Server:
    """Server ``name`` started pinned to the servers' core (not waited on); ``Missing``
    when it cannot run here."""
    if name.startswith("carpool"):
        if name == "carpool_no_reuse" and not _has_prefix_cache():
            raise Missing("this carpool has no --prefix-cache-size (no prefix cache to turn off)")
        config = tmp / "carpool.toml"
        config.write_text(
            f'[models.smollm2]\nengine = "{default_engine()}"\nthreads = 1\n'
            f"max_sequences = {SLOTS}\n"
        )
        flags = ["--prefix-cache-size", "0"] if name == "carpool_no_reuse" else []
        return _process.carpool_serve(
            "smollm2", "--config", str(config), *flags, cpus=cores.server, name=name
        )
    if name in PEERS:
        return start_peer(name, gguf, cores, llama_server, SLOTS, CONTEXT)
    raise ValueError(f"unknown server {name!r}: one of {SERVERS}")


def _has_prefix_cache() -> bool:
    """Whether ``carpool serve`` takes ``--prefix-cache-size`` (issue 34's prompt reuse)."""
    from dataclasses import fields

    from carpool.server.config import ServerConfig

    return any(f.name == "prefix_cache_size" for f in fields(ServerConfig))


def model_of(base: str) -> str:
    """The first model ``GET /v1/models`` lists: the one a request names."""
    with urllib.request.urlopen(base + "/v1/models", timeout=10) as answer:
        return str(json.load(answer)["data"][0]["id"])
