"""``carpool bench --stream`` as a user runs it: a real ``carpool serve step_models:words`` (a word
of ``text_input`` per step; the word "boom" breaks its sequence) over generate_stream and gRPC,
and the same model in this process. Streams, outputs and errors are counted exactly."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from carpool.bench.report.data import Report
from carpool.cli import main
from server.conftest import Launcher, Server

pytestmark = pytest.mark.slow

# Cycled in order: 12 streams are three of each; the "boom" one breaks after its first output.
TEXTS = ["one two three", "four five", "six", "a boom"]
STREAMS, OUTPUTS, GAPS, BROKEN = 9, 3 * (3 + 2 + 1), 3 * (2 + 1 + 0), 3
STREAM_FIELDS = {"streams", "outputs", "outputs_per_s", "outputs_mean", "ttfo", "tpo"}
LATENCY_FIELDS = {"count", "mean", "p50", "p90", "p99", "max"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    launcher = Launcher(tmp_path_factory.mktemp("servers"))
    yield launcher("step_models:words", grpc=True)
    launcher.close()


@pytest.fixture(scope="module")
def texts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("texts") / "texts.txt"
    path.write_text("".join(f"{t}\n" for t in TEXTS))
    return path


def bench(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["bench", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def targets(server: Server) -> dict[str, list[str]]:
    return {
        "http": [f"{server.url}/v2/models/words"],
        "grpc": [f"grpc://{server.grpc_address}", "--model", "words"],
        "in-process": ["server.step_models:words"],
    }


@pytest.mark.parametrize(
    ("kind", "broken"),
    [("http", "StreamError"), ("grpc", "StreamError"), ("in-process", "ValueError")],
)
def test_streams_are_counted_with_their_outputs_and_times(
    server: Server,
    texts: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    kind: str,
    broken: str,
) -> None:
    path = tmp_path / f"{kind}.json"
    flags = ["--stream", "--concurrency", "3", "--requests", "12", "--warmup", "0"]
    flags += ["--strings", str(texts), "--distinct", "4", "--json", str(path)]
    flags += ["--lengths", "fixed:1", "--length-parameter", "delay_ms"]  # the model reads it
    code, out, err = bench(capsys, *targets(server)[kind], *flags)
    assert (code, err) == (0, ""), out
    raw = json.loads(path.read_text())
    assert raw["settings"]["stream"] is True
    assert (raw["settings"]["lengths"], raw["settings"]["length_parameter"]) == (
        "fixed:1",
        "delay_ms",
    )
    (step,) = raw["steps"]
    assert set(step["streams"]) == STREAM_FIELDS
    assert set(step["streams"]["ttfo"]) == set(step["streams"]["tpo"]) == LATENCY_FIELDS
    report = Report.load(path)
    assert (report.kind, report.model) == (kind, "words")
    (measured,) = report.steps
    assert (measured.requests, measured.ok, measured.errors) == (12, 9, {broken: BROKEN})
    streams = measured.streams
    assert streams is not None
    assert (streams.streams, streams.outputs, streams.outputs_mean) == (STREAMS, OUTPUTS, 2.0)
    assert streams.ttfo is not None
    assert streams.tpo is not None
    assert (streams.ttfo.count, streams.tpo.count) == (STREAMS, GAPS)
    assert streams.outputs_per_s == pytest.approx(OUTPUTS / measured.duration_s)
    assert f"{OUTPUTS} outputs" in out
    for header in ("streams/s", "outputs/s", "TTFO p50 ms", "TPO p99 ms"):
        assert header in out


def test_reports_of_streams_compare_and_plot(
    server: Server, texts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = []
    for kind in ("http", "grpc"):
        paths.append(str(tmp_path / f"{kind}.json"))
        flags = ["--stream", "--concurrency", "1,2", "--requests", "4", "--warmup", "0"]
        flags += ["--strings", str(texts), "--json", paths[-1]]
        assert bench(capsys, *targets(server)[kind], *flags)[0] == 0
    plot = tmp_path / "compare.png"
    code, out, err = bench(capsys, "--compare", *paths, "--plot", str(plot))
    assert (code, err) == (0, "")
    assert "words: http vs grpc" in out
    assert out.count("\N{MULTIPLICATION SIGN}") == 2 * 3  # per load: outputs/s, TTFO, TPO ratios
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_stream_on_a_one_shot_model_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = bench(capsys, "demo", "--stream", "--requests", "1")
    assert code == 2
    assert err == "carpool bench: --stream needs a step-wise model; 'demo' answers whole\n"
