"""Triton's own load generator, ``perf_analyzer``, against ``carpool serve demo``: over gRPC
and over HTTP with binary tensors, a short bounded run each, no errors, every request served.

The binary comes from ``benchmarks/perf_analyzer/setup.sh`` (the tritonclient 2.41.1 wheel
in its own git-ignored venv, Debian's libb64-0d); the session fixture runs it once when the
binary is not there yet (about 10-40 s from scratch: one apt package, two wheels).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from server.conftest import Launcher, Server

pytestmark = pytest.mark.slow  # perf_analyzer runs for seconds; its first setup for more

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / "benchmarks" / "perf_analyzer" / "setup.sh"
ENV_SH = SETUP.parent / "env.sh"
SETUP_WITHIN_S = 300  # apt-get update + install and two wheels on a slow mirror
RUN_WITHIN_S = 60  # a bounded run takes a few seconds; perf_analyzer hangs are cut here
MEASURE_MS = 400  # a window: hundreds of requests of the demo at concurrency 4


def _read_env() -> dict[str, str]:
    """``PERF_ANALYZER`` and ``PERF_ANALYZER_LIBS`` as env.sh exports them."""
    found = dict(re.findall(r'^export (\w+)="([^"]*)"$', ENV_SH.read_text(), re.M))
    return {k: found[k] for k in ("PERF_ANALYZER", "PERF_ANALYZER_LIBS")}


@pytest.fixture(scope="session")
def perf_analyzer() -> dict[str, str]:
    """The binary's path and libraries, installed by setup.sh when not there yet."""
    if not ENV_SH.is_file() or not Path(_read_env()["PERF_ANALYZER"]).is_file():
        done = subprocess.run(
            ["bash", str(SETUP)], capture_output=True, text=True, timeout=SETUP_WITHIN_S
        )
        assert done.returncode == 0, f"setup.sh failed:\n{done.stdout[-2000:]}{done.stderr}"
    return _read_env()


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    launcher = Launcher(tmp_path_factory.mktemp("servers"))
    yield launcher("demo", "--max-batch-size", "32", grpc=True)
    launcher.close()


def run_perf_analyzer(tools: dict[str, str], *args: str) -> str:
    """A short run: windows of ``MEASURE_MS`` and ``-s 1000`` (windows within 11x of each
    other) because what is checked is that every request is served without an error, not a
    stable figure, and on a loaded machine one window's req/s can be more than twice
    another's."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (tools["PERF_ANALYZER_LIBS"], env.get("LD_LIBRARY_PATH", "")) if p
    )
    done = subprocess.run(
        [tools["PERF_ANALYZER"], "-m", "demo", "--concurrency-range", "4",
         "--measurement-interval", str(MEASURE_MS), "--max-trials", "3", "-s", "1000", *args],
        capture_output=True, text=True, timeout=RUN_WITHIN_S, env=env,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    return output


@pytest.mark.timeout(SETUP_WITHIN_S + 2 * RUN_WITHIN_S)  # the first test pays for setup.sh
@pytest.mark.parametrize(
    ("protocol", "flags"),
    [
        ("grpc", ["-i", "grpc"]),
        ("http", ["-i", "http"]),  # perf_analyzer sends HTTP tensors binary by default
    ],
)
def test_perf_analyzer_runs_clean_against_carpool_serve(
    perf_analyzer: dict[str, str], demo: Server, protocol: str, flags: list[str]
) -> None:
    url = demo.grpc_address if protocol == "grpc" else demo.address
    before = demo.stats("demo")
    output = run_perf_analyzer(perf_analyzer, "-u", url, *flags)
    after = demo.stats("demo")
    served = after["inference_count"] - before["inference_count"]
    completed = re.search(r"Request count: (\d+)", output)
    assert completed is not None, output[-3000:]
    assert re.search(r"Concurrency: 4, throughput: [\d.]+ infer/sec", output), output[-3000:]
    assert "error" not in output.lower(), output[-3000:]
    failed = after["inference_stats"]["fail"]["count"] - before["inference_stats"]["fail"]["count"]
    assert failed == 0
    assert served >= int(completed.group(1)) > 0  # its measured requests, and its warm-up


@pytest.fixture(scope="module")
def cached(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    launcher = Launcher(tmp_path_factory.mktemp("servers"))
    yield launcher("demo", "--response-cache", "demo", grpc=True)
    launcher.close()


@pytest.mark.timeout(SETUP_WITHIN_S + 2 * RUN_WITHIN_S)
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_perf_analyzer_measures_a_cached_model_whose_every_request_is_a_hit(
    perf_analyzer: dict[str, str], cached: Server, protocol: str
) -> None:
    """The same request again and again (``--input-data zero``), no version given: after the
    first, every request is a hit that runs nothing, and perf_analyzer still finds the model's
    statistics (by its queue count) and reports the cache's hits, as against Triton."""
    url = cached.grpc_address if protocol == "grpc" else cached.address
    before = cached.stats("demo")
    output = run_perf_analyzer(
        perf_analyzer, "-u", url, "-i", protocol, "--input-data", "zero", "--shape", "INPUT0:256"
    )
    after = cached.stats("demo")
    hits = re.search(r"Cache hit count: (\d+)", output)
    assert hits is not None, output[-3000:]
    assert int(hits.group(1)) > 0
    misses = re.search(r"Cache miss count: (\d+)", output)
    assert misses is not None, output[-3000:]
    assert int(misses.group(1)) <= 1  # the first request's, if in a measured window
    assert "error" not in output.lower(), output[-3000:]
    assert after["execution_count"] - before["execution_count"] <= 1  # the first request's
