"""The benchmarks still run: each script's --quick smoke run, as a user would start it.

Numbers are not asserted (these machines are noisy); the shape of the report is: the
lines that name each comparison, and its checks. The runs of the tests selected start when
the module does, two at a time, in the tests' order (``started``, tests/e2e/conftest.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# A quick run's bound: 20-40 s of torch imports in three processes on a busy 2-core box,
# beside the run started with it.
RUN_WITHIN_S = 240

pytestmark = [
    pytest.mark.slow,  # each runs a script, most of them servers: seconds each
    pytest.mark.timeout(RUN_WITHIN_S + 30),  # its wait is for its own run alone
]

# Each named test's run: the script and its arguments ("{out}": the test's own folder).
RUNS: dict[str, tuple[str, ...]] = {
    "test_backends_bench_mlp_quick_run": ("backends_bench.py", "--models", "mlp"),
    "test_backends_bench_minilm_quick_run": ("backends_bench.py", "--models", "minilm"),
    "test_bench_demo_curve_quick_run": (
        "bench_demo_curve.py",
        "--out",
        "{out}",
        "--plot",
        "{out}/curve.png",
    ),
    "test_adaptive_bench_quick_run": ("adaptive_bench.py", "--plot", "{out}/adaptive.png"),
    "test_protocols_bench_quick_run": ("protocols_bench.py",),
    # infinity-emb, where benchmarks/.venv-embeddings has it, is left out: its two servers and
    # the ONNX export import torch beside carpool's three processes (half the run), and what
    # this checks is carpool's side of the report.
    "test_embeddings_bench_quick_run": ("embeddings_bench.py", "--infinity-engines", "none"),
}


def run_of(test: pytest.Function, folder: Path) -> tuple[list[str], float]:
    """``python benchmarks/SCRIPT --quick --cpus none ARGS`` of the run ``test`` checks."""
    name = test.originalname
    if name == "test_benchmark_quick_run":
        script, *args = (test.callspec.params["script"],)
    else:
        script, *args = (arg.format(out=folder) for arg in RUNS[name])
    argv = [sys.executable, str(BENCHMARKS / script), "--quick", "--cpus", "none", *args]
    return argv, RUN_WITHIN_S


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("overhead.py", ["[async] 1000 asyncio tasks, await infer(x)", "carpool/floor = "]),
        ("efficiency.py", ["served/offline", "workers=1 served/offline"]),
        (
            "reform.py",
            [
                "(a) priority: an urgent request's wait",
                "urgent wait p99, staged / free only: ",
                "(b) served/offline (P1b)",
                "(c) 64 clients",
            ],
        ),
        ("low_load.py", ["eager overhead", "fixed"]),
        ("few_clients.py", ["few clients: the default policy is 'eager'", "mean batch"]),
        (
            "http_bench.py",
            [
                "check carpool : ok",
                "check plain   : ok",
                "check instant : ok",
                "client ceiling",
                "64 clients: carpool/plain throughput",
                "1 client: p50 carpool - plain",
            ],
        ),
        ("bench_ceiling.py", ["carpool bench ceiling", "2/1 req/s", "ceiling: "]),
        ("preprocess_cost.py", ["preprocess us/request", "preprocess share = "]),
        (
            "frontend_cpu.py",
            [
                "check REST JSON vs orjson+numpy ASGI: ok",
                "check REST binary vs bare ASGI: ok",
                "check gRPC (raw tensors) vs bare grpc.aio: ok",
                "check /v1/embeddings vs orjson+numpy ASGI: ok",
                "carpool's top threads, us/req",
                "goal: REST binary <= 3x bare ASGI, 64 clients: ",
                "goal: gRPC (raw tensors) <= 1.5x bare grpc.aio, 1 client: ",
            ],
        ),
        (
            "frontends.py",
            [
                "REST binary, 64 clients",
                "gRPC, 64 clients",
                "main process at --frontends 2: ",
                "mean batch, 2 front ends / 1: ",
            ],
        ),
        (
            "body_memory.py",
            [
                "REST JSON, 1 MiB: ",
                "gRPC fp32_contents, 1 MiB: ",
                "goal: REST binary, 1 MiB < 3x the body: ",
            ],
        ),
        ("check_cost.py", ["headers sent twice", "goal: the checks together < 2 us"]),
        (
            "response_cache.py",
            [
                "check cached: ok",
                "check uncached: ok",
                "(a) server CPU per request, every request a hit / computed",
                "the inference path alone, in process",
                "(b) req/s with 50% repeated requests, cache / no cache",
            ],
        ),
        (
            "model_control.py",
            ["failed requests during", "p99 reloading / steady", "after unload / before load, big"],
        ),
        (
            "grpc_batching.py",
            ["(a) 200 concurrent calls at once", "double_2ms", "(b) carpool bench on demo"],
        ),
    ],
)
def test_benchmark_quick_run(script: str, expected: list[str], out: str) -> None:
    for text in expected:
        assert text in out, out[-3000:]
    assert f"\n{Path(script).stem}: " not in out, out[-3000:]  # how a script reports a failure


def test_backends_bench_mlp_quick_run(out: str) -> None:
    for text in [
        "[mlp] check: batching ok, unbatched ok",
        "batching / unbatched",
        "served / offline",
    ]:
        assert text in out, out[-3000:]
    assert "failed:" not in out, out[-3000:]


def test_backends_bench_minilm_quick_run(out: str) -> None:
    for text in [
        "[minilm] check: batching ok, unbatched ok",
        "batching / unbatched",
        "padded/real",
        "no buckets / buckets",
    ]:
        assert text in out, out[-3000:]
    assert "failed:" not in out, out[-3000:]


def test_bench_demo_curve_quick_run(out: str, folder: Path) -> None:
    plot = folder / "curve.png"
    assert "wait 0 ms vs wait 5 ms" in out, out[-3000:]  # carpool bench --compare's table
    assert "\nbench_demo_curve: " not in out, out[-3000:]
    assert sorted(p.name for p in folder.glob("*.json")) == [
        "demo-wait-0ms.json",
        "demo-wait-5ms.json",
    ]
    assert plot.stat().st_size > 0


def test_adaptive_bench_quick_run(out: str, folder: Path) -> None:
    plot = folder / "adaptive.png"
    for text in [
        "[sleep] p99 of served requests",
        "[mlp] throughput, and goodput",
        "p99 <= 1.1x best fixed/eager at every load",
        "2x overload: goodput >= 0.9x capacity",
        "2x overload: rejections immediate",
    ]:
        assert text in out, out[-3000:]
    assert plot.stat().st_size > 0


def test_protocols_bench_quick_run(out: str) -> None:
    for text in [
        "gRPC (raw tensors)",
        "REST binary",
        "REST JSON",
        "target: gRPC req/s at 64 clients >= REST binary's",
        "[minilm] check: ok",
        "target: carpool/FastAPI req/s >= 3x",
    ]:
        assert text in out, out[-3000:]
    assert "failed:" not in out, out[-3000:]
    assert "\nprotocols_bench: " not in out, out[-3000:]


def test_embeddings_bench_quick_run(out: str) -> None:
    for text in [
        "infinity-emb not run: --infinity-engines none",
        "check carpool: ok",
        "check fastapi: ok",
        "[short texts (5-15 words), 1 text per request]",
        "[long texts (100-200 words), 1 text per request]",
        "offline sentence-transformers encode(all ",
        "goal: short, 64 clients: carpool >= 1.3x the faster infinity engine: ",
        "goal: short, 64 clients: carpool >= 3x FastAPI: ",
        "goal: short, 64 clients: carpool >= 0.9x offline encode(batch_size=32): ",
        "goal: long, 64 clients: carpool >= 1.2x infinity torch: ",
    ]:
        assert text in out, out[-3000:]
    assert "DIFFERS" not in out, out[-3000:]
    assert "\nembeddings_bench: " not in out, out[-3000:]
