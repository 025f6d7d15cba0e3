"""aiperf, NVIDIA's load generator for LLM servers (its venv made by
benchmarks/streams/setup_aiperf.sh when missing, never a carpool dependency), completes a
short streamed chat run against ``carpool serve smollm2`` with no error."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from benchmarks.streams import _chat_aiperf, _chat_prompts

from e2e.conftest import REPO
from server.conftest import Launcher, Server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    launcher = Launcher(tmp_path_factory.mktemp("servers"))
    yield launcher("smollm2")
    launcher.close()


@pytest.fixture(scope="module")
def aiperf() -> None:
    """aiperf's venv and SmolLM2's tokenizer for it, made once a checkout (git-ignored)."""
    if _chat_aiperf.missing():
        setup = REPO / "benchmarks" / "streams" / "setup_aiperf.sh"
        done = subprocess.run(["bash", str(setup)], capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert _chat_aiperf.missing() == ""


@pytest.mark.timeout(1200)  # the venv's first setup: pip installs aiperf
def test_aiperf_completes_a_short_run_without_errors(
    aiperf: None, smollm2: Server, tmp_path: Path
) -> None:
    inputs, system = _chat_prompts.write_aiperf(tmp_path, "unrelated", 0)
    # Two conversations for 1 s (each stream read to its end): a 300-token prompt prefills in
    # seconds on a busy box.
    argv = _chat_aiperf.argv(smollm2.url, "smollm2", 2, 0.0, 1.0, inputs, system, tmp_path / "out")
    env = _chat_aiperf.environment()  # the suite's HF_HUB_OFFLINE left out
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    cell = _chat_aiperf.cell_of(_chat_aiperf.read_export(tmp_path / "out"))
    assert cell.errors == 0
    assert cell.tokens_per_s > 0
    assert 0 < cell.ttft_p50_ms <= cell.ttft_p99_ms
