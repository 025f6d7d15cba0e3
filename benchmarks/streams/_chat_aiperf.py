"""One cell of ``benchmarks.streams.chat`` as NVIDIA's aiperf measures it: ``aiperf profile``
from its own venv (benchmarks/streams/setup_aiperf.sh), offline, pinned to the client's
core, its JSON export read into a :class:`~benchmarks.streams._chat_cells.Cell`."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path
from typing import Any

from benchmarks.harness import common
from benchmarks.harness import processes as _process
from benchmarks.streams import _chat_prompts, _chat_servers
from benchmarks.streams._chat_cells import MAX_TOKENS, Cell

VENV = common.REPO / "benchmarks" / ".venv-aiperf"
AIPERF = VENV / "bin" / "aiperf"
TOKENIZER = common.REPO / "benchmarks" / ".tokenizer-smollm2"
EXPORT = "profile_export_aiperf.json"
GRACE_S = 120  # a stream sent before the window's end is read to its end, as the client does
STARTUP_S = 240  # aiperf's services, its dataset and tokenizer, on a busy 2-core box


def missing() -> str:
    """Why aiperf cannot run here ("" when it can)."""
    if not AIPERF.is_file() or not (TOKENIZER / "tokenizer.json").is_file():
        return f"no aiperf at {AIPERF} or tokenizer at {TOKENIZER}: bash " \
            "benchmarks/streams/setup_aiperf.sh"  # fmt: skip
    return ""


def environment() -> dict[str, str]:
    """aiperf's environment: never offline (with HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE set,
    aiperf 0.13 looks the tokenizer up in the hub's cache, not at its path)."""
    env = _process.child_env(HF_HUB_DISABLE_TELEMETRY="1")
    for offline in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env.pop(offline, None)
    return env


def argv(base: str, model: str, clients: int, warmup: float, duration: float,
         inputs: Path, system: Path | None, out: Path) -> list[str]:  # fmt: skip
    """``aiperf profile``'s command line for one cell: closed loop at ``clients``, streamed
    chat, greedy, ``MAX_TOKENS`` each, the tokenizer from the GGUF, no telemetry."""
    line = [str(AIPERF), "profile", "--model", model, "--url", base,
            "--endpoint-type", "chat", "--streaming", "--concurrency", str(clients),
            "--benchmark-duration", f"{duration:g}", "--benchmark-grace-period", str(GRACE_S),
            "--input-file", str(inputs), "--custom-dataset-type", "single_turn",
            "--dataset-sampling-strategy", "sequential",
            "--extra-inputs", f"max_tokens:{MAX_TOKENS}", "--extra-inputs", "temperature:0",
            "--tokenizer", str(TOKENIZER), "--artifact-dir", str(out), "--ui-type", "none",
            "--random-seed", "0", "--no-gpu-telemetry", "--no-server-metrics"]  # fmt: skip
    if warmup > 0:
        line += ["--warmup-duration", f"{warmup:g}"]
    if system is not None:
        line += ["--system-prompt-file", str(system)]
    return line


def cell(
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
    """``clients`` conversations of questions slice ``index`` for ``warmup + duration``
    seconds, measured by aiperf; ``RuntimeError`` with its output if it fails."""
    inputs, system = _chat_prompts.write_aiperf(folder, prompt_set, index)
    out = folder / "aiperf"
    model = _chat_servers.model_of(server.base)
    line = argv(server.base, model, clients, warmup, duration, inputs, system, out)
    done = subprocess.run(
        line,
        cwd=folder,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=STARTUP_S + GRACE_S + warmup + duration,
        preexec_fn=_process.pin_child(cpus),
    )
    if done.returncode != 0 or not (out / EXPORT).is_file():
        raise RuntimeError(
            f"aiperf exited {done.returncode}: {(done.stdout + done.stderr)[-3000:]}"
        )
    return cell_of(read_export(out))


def read_export(out: Path) -> dict[str, Any]:
    """The JSON export aiperf wrote in its ``--artifact-dir`` (the profiling phase's)."""
    document = json.loads((out / EXPORT).read_text())
    return document if isinstance(document, dict) else {}


def cell_of(export: dict[str, Any]) -> Cell:
    """A :class:`Cell` from aiperf's JSON export (metrics by tag, each with its stats; no
    ``error_request_count`` when no request failed)."""
    metrics = export

    def stat(tag: str, key: str) -> float:
        value = (metrics.get(tag) or {}).get(key)
        return math.nan if value is None else float(value)

    errors = stat("error_request_count", "avg")
    return Cell(
        tokens_per_s=stat("output_token_throughput", "avg"),
        ttft_p50_ms=stat("time_to_first_token", "p50"),
        ttft_p99_ms=stat("time_to_first_token", "p99"),
        itl_p50_ms=stat("inter_token_latency", "p50"),
        itl_p99_ms=stat("inter_token_latency", "p99"),
        errors=0 if math.isnan(errors) else int(errors),
        tokens_per_stream=stat("output_sequence_length", "avg"),
    )
