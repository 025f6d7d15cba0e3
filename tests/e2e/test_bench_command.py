"""``carpool bench`` as a user runs it, against real ``carpool serve`` processes on loopback.

Most runs call ``carpool.cli.main`` in this process (no interpreter start-up per run); the
runs whose exit status, stderr or client processes matter are real subprocesses. Counts are
asserted exactly; times only with bounds a noisy machine keeps.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.conftest import latency, report, step
from carpool.bench.report.data import Report
from carpool.bench.targets.payload import is_unique
from carpool.cli import main
from server.conftest import Launcher, Server, free_port, wait_until

REPORT_FIELDS = {
    "format",
    "target",
    "kind",
    "model",
    "mode",
    "steps",
    "label",
    "settings",
    "client",
    "created",
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    launcher = Launcher(tmp_path_factory.mktemp("servers"))
    yield launcher
    launcher.close()


@pytest.fixture(scope="module")
def demo(servers: Launcher) -> Server:
    return servers()  # the built-in demo model


@pytest.fixture(scope="module")
def failing(servers: Launcher) -> Server:
    return servers("models:flaky", "models:gated", "--max-queue-size", "1")


def bench(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["bench", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("CARPOOL_")}
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "carpool", "bench", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment,
    )


def url(server: Server, model: str = "demo") -> str:
    return f"{server.url}/v2/models/{model}"


# ----------------------------------------------------------------------------- load modes


def test_each_load_mode_records_its_requests_and_writes_a_report(
    demo: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("".join(f"{i * 0.004:.3f}\n" for i in range(30)))
    runs = {
        "concurrency": ["--concurrency", "4", "--requests", "40"],
        "rate": ["--rate", "200", "--requests", "50", "--encoding", "binary"],
        "trace": ["--trace", str(trace)],
    }
    counts = {"concurrency": 40, "rate": 50, "trace": 30}
    for mode, flags in runs.items():
        path = tmp_path / f"{mode}.json"
        code, out, err = bench(capsys, url(demo), *flags, "--warmup", "0", "--json", str(path))
        assert (code, err) == (0, ""), out
        raw = json.loads(path.read_text())
        assert set(raw) == REPORT_FIELDS
        assert Report.from_dict(raw).to_json() == path.read_text()  # round trip, nothing lost
        report = Report.load(path)  # labelled after its file
        assert (report.kind, report.model, report.mode) == ("http", "demo", mode)
        assert report.label == mode
        (step,) = report.steps
        n = counts[mode]
        assert (step.load.mode, step.requests, step.ok, step.errors) == (mode, n, n, {})
        assert step.latency is not None
        assert step.latency.count == n
        assert step.server is not None  # carpool's /metrics was read
        assert step.server.rows >= 1
        assert "demo on http://" in out
        assert f"wrote {path}" in out


@pytest.mark.parametrize("encoding", ["binary", "json"])
def test_the_others_of_a_repeat_fraction_miss_a_response_cache(
    servers: Launcher, tmp_path: Path, capsys: pytest.CaptureFixture[str], encoding: str
) -> None:
    cached = servers("--response-cache", "demo")
    path = tmp_path / "half.json"
    flags = ["--concurrency", "8", "--requests", "200", "--warmup", "0", "--distinct", "4",
             "--repeat-fraction", "0.5", "--unique", "1000", "--encoding", encoding]  # fmt: skip
    code, out, err = bench(capsys, url(cached), *flags, "--json", str(path))
    assert (code, err) == (0, ""), out
    settings = Report.load(path).settings
    assert (settings["repeat_fraction"], settings["unique"]) == (0.5, 1000)
    others = sum(is_unique(i, 0.5) for i in range(200))  # each another request: a miss
    stats = cached.stats("demo")["inference_stats"]
    assert stats["cache_miss"]["count"] == others + 4  # and the 4 repeated ones, once each
    assert stats["cache_hit"]["count"] == 200 - others - 4


@pytest.mark.slow  # interpreters started: seconds
def test_client_processes_split_the_load_and_merge_it(demo: Server, tmp_path: Path) -> None:
    path = tmp_path / "two.json"
    done = run(
        url(demo),
        "--concurrency",
        "4",
        "--requests",
        "40",
        "--client-processes",
        "2",
        "--warmup",
        "0.2",
        "--json",
        str(path),
    )
    assert done.returncode == 0, done.stderr
    report = Report.load(path)
    (step,) = report.steps
    assert (step.requests, step.ok) == (40, 40)
    assert report.client["processes"] == 2


def test_in_process_target_reports_batching_from_the_batchers_stats(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "demo.json"
    code, out, _ = bench(
        capsys,
        "demo",
        "--concurrency",
        "16",
        "--requests",
        "400",
        "--warmup",
        "0.2",
        "--json",
        str(path),
    )
    assert code == 0
    report = Report.load(path)
    assert (report.kind, report.model, report.settings["batching"]["max_batch_size"]) == (
        "in-process",
        "demo",
        32,
    )
    (step,) = report.steps
    assert step.requests == 400
    assert step.server is not None
    assert step.server.batch_size_mean > 1.0
    assert step.server.queue_wait_share is not None
    (line,) = [line for line in out.splitlines() if line.startswith("batch sizes at 16 clients:")]
    assert step.server.batch_size_floors == {}  # the batcher counts every size
    printed = dict(item.split(":") for item in line.split(": ", 1)[1].split())
    assert printed == {size: str(n) for size, n in step.server.batch_sizes.items()}


def test_batch_sizes_from_metrics_print_as_the_ranges_they_count(
    demo: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    """/metrics has a bucket per power of two: the line names each bucket's range (never
    its bound, as if it were a size), and each range holds what the server's exact
    statistics counted in it."""
    before = demo.stats("demo")
    code, out, _ = bench(
        capsys, url(demo), "--concurrency", "8", "--requests", "300", "--warmup", "0"
    )
    assert code == 0
    after = demo.stats("demo")
    (line,) = [line for line in out.splitlines() if line.startswith("batch sizes at 8 clients:")]
    printed = dict(item.split(":") for item in line.split(": ", 1)[1].split())
    counted = {b["batch_size"]: b["compute_infer"]["count"] for b in after["batch_stats"]}
    for b in before["batch_stats"]:
        counted[b["batch_size"]] -= b["compute_infer"]["count"]
    assert set(printed) <= {"1", "2", "3-4", "5-8", "9-16", "17-32"}  # max_batch_size 32
    for label, n in printed.items():
        low, _, high = label.partition("-")
        sizes = range(int(low), int(high or low) + 1)
        assert int(n) == sum(counted.get(size, 0) for size in sizes), label
    assert sum(map(int, printed.values())) == sum(counted.values())


# ----------------------------------------------------------------------------- errors


def test_model_errors_are_counted_by_status(
    failing: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "requests.jsonl"
    data.write_text('{"INPUT0": [[1.0, 2.0, 3.0]]}\n{"INPUT0": [[-1.0, -2.0, -3.0]]}\n')
    path = tmp_path / "flaky.json"
    code, out, _ = bench(
        capsys,
        url(failing, "flaky"),
        "--input-data",
        str(data),
        "--concurrency",
        "1",
        "--requests",
        "20",
        "--warmup",
        "0",
        "--json",
        str(path),
    )
    assert code == 0
    (step,) = Report.load(path).steps
    assert (step.requests, step.ok, step.errors) == (20, 10, {"500": 10})  # every other one
    assert "errors 500: 10" in out


def test_a_queue_limit_is_counted_as_503(failing: Server, tmp_path: Path) -> None:
    """The model's one worker is held at a gate and one row may wait: every other request
    is refused at once, until the run has sent all it was asked to."""

    def refused() -> float:
        found = re.search(
            r'^carpool_requests_total\{model="gated",outcome="unavailable",protocol="http"\}'
            r" (\S+)$",
            failing.metrics(),
            re.M,
        )
        return float(found.group(1)) if found else 0.0

    before = refused()
    path = tmp_path / "gated.json"
    command = [
        sys.executable,
        "-m",
        "carpool",
        "bench",
        url(failing, "gated"),
        "--shape",
        "INPUT0:4",
        "--concurrency",
        "4",
        "--requests",
        "20",
        "--warmup",
        "0",
        "--json",
        str(path),
    ]
    with failing.gate_closed("gated"):
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        wait_until(lambda: refused() - before >= 18, "18 requests refused with 503")
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    (step,) = Report.load(path).steps
    assert (step.requests, step.ok, step.errors) == (20, 2, {"503": 18})


# ----------------------------------------------------------------------------- output


def _report(label: str, rps: float) -> Report:
    measured = latency(2.0, 4.0, max_ms=5.0, count=10)
    return report(
        [step(8, rps, measured, duration_s=1.0, ok=10)],
        label=label,
        target="demo",
        kind="in-process",
    )


def test_compare_prints_both_labels_and_ratios_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b, png = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "cmp.png"
    _report("before", 100.0).save(a)
    _report("after", 250.0).save(b)
    code, out, err = bench(capsys, "--compare", str(a), str(b), "--plot", str(png))
    assert (code, err) == (0, "")
    for text in ("before req/s", "after req/s", "req/s after/before", "2.50"):
        assert text in out
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_plot_of_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "run.png"
    code, _, _ = bench(
        capsys,
        "demo",
        "--concurrency",
        "1,4",
        "--requests",
        "30",
        "--warmup",
        "0",
        "--plot",
        str(png),
    )
    assert code == 0
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_sweep_batching_runs_every_setting_and_names_the_best(
    capsys: pytest.CaptureFixture[str],
) -> None:
    grid = ["--sweep-batching", "--max-batch-size", "2,8", "--max-wait-ms", "0,1"]
    load = ["--concurrency", "8", "--requests", "80", "--warmup", "0"]
    args = ["demo", *grid, "--policy", "fixed", *load, "--p99-budget-ms", "10000"]
    code, out, _ = bench(capsys, *args)
    assert code == 0
    for size in (2, 8):
        for wait in (0, 1):
            assert re.search(rf"│\s+{size} │\s+{wait} │ 8 clients", out), out
            assert f"max_batch_size={size} max_wait_ms={wait}" in out
    best = r"^best with p99 <= 10000 ms: --max-batch-size \d+ --max-wait-ms \d"
    assert re.search(best, out, re.M)


# ----------------------------------------------------------------------------- usage


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "name a TARGET"),
        (("demo", "--rate", "10", "--concurrency", "2"), "choose one load mode"),
        (("demo", "--client-processes", "2"), "--client-processes needs a URL TARGET"),
        (("demo", "--max-batch-size", "4,8"), "--max-batch-size takes one value here"),
        (("http://127.0.0.1:1/v2/models/m", "--sweep-batching"), "needs an in-process TARGET"),
        (("http://127.0.0.1:1/v2/models/m", "--workers", "2"), "apply to in-process targets"),
        (("demo", "--trace", "missing.csv"), "--trace file 'missing.csv' does not exist"),
        (("demo", "--shape", "INPUT0"), "--shape 'INPUT0' must be NAME:DIMS"),
        (("demo", "--duration", "1", "--requests", "5"), "give one"),
        (("demo", "--rate", "0"), "--rate values must be > 0"),
        (("no_such_module:fn",), "cannot import module 'no_such_module'"),
        (("demo", "--policy", "bogus"), "policy must be one of"),
        (("--compare", "a.json"), "two reports or more"),
        (("http://127.0.0.1:1/v2/models/m", "--repeat-fraction", "2"), "must be in [0, 1]"),
        (("demo", "--repeat-fraction", "0.5"), "--repeat-fraction applies to v2 targets"),
        (("http://127.0.0.1:1/v2/models/m", "--unique", "9"), "add that"),
    ],
)
def test_usage_errors_exit_2_with_one_line(
    args: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = bench(capsys, *args)
    assert (code, out) == (2, "")
    assert err.startswith("carpool bench: ")
    assert err.count("\n") == 1
    assert message in err


@pytest.mark.slow  # interpreters started: seconds
def test_unreachable_or_unknown_models_exit_2_without_a_traceback(demo: Server) -> None:
    port = free_port()
    done = run(f"http://127.0.0.1:{port}/v2/models/demo", "--requests", "5")
    assert done.returncode == 2
    assert done.stderr == (
        f"carpool bench: cannot reach http://127.0.0.1:{port}/v2/models/demo: "
        "connection refused; is the server running?\n"
    )
    unknown = run(url(demo, "nope"), "--requests", "5")
    assert unknown.returncode == 2
    assert unknown.stderr.count("\n") == 1
    assert "answered HTTP 404" in unknown.stderr
