"""``benchmarks.streams.synthetic``'s systems over HTTP, each a server process of its own,
read by the same aiohttp client: carpool (``carpool serve`` of the synthetic model, its
``generate_stream`` SSE) and LitServe's batched streaming (``_litserve_app``, run by the
venv ``setup_litserve.sh`` makes), so the two compare like for like."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from benchmarks.harness import processes as _process
from benchmarks.streams._models import Synthetic, served
from benchmarks.streams._systems import Job, Opener

MODEL = "synthetic"
LITSERVE_PYTHON = _process.REPO / "benchmarks" / ".venv-litserve" / "bin" / "python"
SETUP_LITSERVE = "bash benchmarks/streams/setup_litserve.sh"


def _served() -> Synthetic:
    costs = os.environ["BENCH_SYNTHETIC_MS"].split(",")
    return Synthetic(float(costs[0]) / 1000, float(costs[1]) / 1000)


synthetic = served(MODEL, _served, int(os.environ.get("BENCH_SYNTHETIC_MOST", "32")))


def carpool_server(
    cpus: frozenset[int] | None, fixed_ms: float, per_ms: float, most: int
) -> _process.Server:
    """``carpool serve`` of the synthetic model (REST only), pinned to ``cpus``, not waited on."""
    port = _process.free_port()
    argv = [sys.executable, "-m", "carpool", "serve", "benchmarks.streams._http_systems:synthetic",
            "--port", str(port), "--grpc-port", "0", "--access-log", "false",
            "--log-level", "warning"]  # fmt: skip
    env = _process.child_env(
        BENCH_SYNTHETIC_MS=f"{fixed_ms},{per_ms}", BENCH_SYNTHETIC_MOST=str(most)
    )
    return _process.Server("carpool serve (synthetic)", argv, port, cpus, env)


def litserve_server(
    cpus: frozenset[int] | None, fixed_ms: float, per_ms: float, most: int, wait_ms: float
) -> _process.Server | None:
    """LitServe serving the synthetic model in batches of ``most``, formed within
    ``wait_ms``; None when its venv is not there (``SETUP_LITSERVE`` makes it)."""
    if not LITSERVE_PYTHON.is_file():
        return None
    port = _process.free_port()
    argv = [str(LITSERVE_PYTHON), "-m", "benchmarks.streams._litserve_app", str(port),
            str(fixed_ms), str(per_ms), str(most), str(wait_ms)]  # fmt: skip
    return _process.Server("litserve (synthetic)", argv, port, cpus, ready_path="/health")


def carpool_opener(session: Any, base: str) -> Opener:
    """A job's outputs from ``generate_stream``'s events."""
    return _opener(session, f"{base}/v2/models/{MODEL}/generate_stream", _event_data)


def litserve_opener(session: Any, base: str) -> Opener:
    """A job's outputs from LitServe's stream: a JSON object a line."""
    return _opener(session, f"{base}/predict", _json_line)


def _opener(session: Any, url: str, data_of: Callable[[bytes], bytes | None]) -> Opener:
    """A job POSTed to ``url``, its outputs the JSON of each line ``data_of`` keeps."""

    async def open_stream(job: Job) -> AsyncIterator[int]:
        async with session.post(url, json={"key": job[0], "length": job[1]}) as response:
            response.raise_for_status()
            async for line in response.content:
                data = data_of(line)
                if data is not None:
                    yield _value(data)

    return open_stream


def _event_data(line: bytes) -> bytes | None:
    return line[5:] if line.startswith(b"data:") else None


def _json_line(line: bytes) -> bytes | None:
    return line if line.strip() else None


def _value(data: bytes) -> int:
    event = orjson.loads(data)
    if "error" in event:
        raise RuntimeError(event["error"])
    return int(event["value"])
