"""The report data model: percentiles on known data, JSON both ways, and refusals."""

from __future__ import annotations

import json
import pickle
import random
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from carpool.bench.report.data import (
    FORMAT,
    Latency,
    Load,
    Report,
    ReportError,
    ServerSide,
    Step,
    percentile,
    summarize,
)
from carpool.errors import CarpoolError

# percentile, summarize


def test_percentile_is_numpys_linear_and_nan_of_nothing() -> None:
    values = [4.0, 1.0, 3.0, 2.0]  # order does not matter
    assert (percentile(values, 0), percentile(values, 50), percentile(values, 100)) == (
        1.0,
        2.5,
        4.0,
    )
    assert percentile(np.arange(1, 101), 99) == pytest.approx(99.01, abs=1e-9)
    assert np.isnan(percentile([], 50))


def test_summarize_1_to_100_ms() -> None:
    seconds = [i / 1000 for i in range(1, 101)]
    random.Random(3).shuffle(seconds)  # order does not matter
    latency = summarize(seconds)
    assert latency is not None
    assert latency.count == 100
    # numpy's linear percentiles of 1..100: rank p/100 * 99 between neighbours
    assert latency.p50 == pytest.approx(50.5, abs=1e-9)
    assert latency.p90 == pytest.approx(90.1, abs=1e-9)
    assert latency.p99 == pytest.approx(99.01, abs=1e-9)
    assert latency.mean == pytest.approx(50.5, abs=1e-9)
    assert latency.max == pytest.approx(100.0, abs=1e-9)


def test_summarize_exactly_representable_values_are_exact() -> None:
    latency = summarize(np.array([0.5, 0.25, 0.125, 1.0, 0.0625]))  # 62.5 to 1000 ms
    assert latency == Latency(count=5, mean=387.5, p50=250.0, p90=800.0, p99=980.0, max=1000.0)


def test_summarize_one_value_and_none() -> None:
    assert summarize([0.004]) == Latency(count=1, mean=4.0, p50=4.0, p90=4.0, p99=4.0, max=4.0)
    assert summarize([]) is None
    assert summarize(np.empty(0)) is None


def test_summarize_gives_python_floats() -> None:
    latency = summarize(np.array([0.001, 0.002], dtype=np.float32))
    assert latency is not None
    assert all(type(v) is float for v in (latency.mean, latency.p50, latency.p99, latency.max))
    assert type(latency.count) is int


# Load


@pytest.mark.parametrize(
    ("load", "text"),
    [
        (Load("concurrency", 64), "64 clients"),
        (Load("rate", 250.0), "250 req/s"),
        (Load("rate", 12.5), "12.5 req/s"),
        (Load("trace", 99.6), "trace (100 req/s)"),
    ],
)
def test_load_reads_as_its_level(load: Load, text: str) -> None:
    assert str(load) == text


# JSON both ways


def _report(**overrides: Any) -> Report:
    server = ServerSide(
        batches=10,
        rows=40,
        batch_size_mean=4.0,
        batch_sizes={"1": 2, "4": 3, "8": 5},
        queue_wait_ms_mean=1.25,
        model_ms_mean=2.5,
        queue_wait_share=0.2,
    )
    steps = [
        Step(
            load=Load("concurrency", 1),
            duration_s=10.0,
            requests=1000,
            ok=1000,
            errors={},
            throughput_rps=100.0,
            latency=Latency(count=1000, mean=9.5, p50=9.0, p90=12.0, p99=20.0, max=31.0),
        ),
        Step(
            load=Load("concurrency", 64),
            duration_s=10.0,
            requests=5000,
            ok=4988,
            errors={"503": 11, "ClientOSError": 1},
            throughput_rps=498.8,
            latency=Latency(count=4988, mean=90.0, p50=80.0, p90=120.0, p99=200.0, max=410.0),
            server=server,
            goodput_rps=450.0,
        ),
        Step(
            load=Load("concurrency", 512),
            duration_s=10.0,
            requests=512,
            ok=0,
            errors={"ClientConnectorError": 512},
            throughput_rps=0.0,
            latency=None,
        ),
    ]
    fields: dict[str, Any] = {
        "target": "http://127.0.0.1:8000",
        "kind": "http",
        "model": "demo",
        "mode": "concurrency",
        "steps": steps,
        "label": "baseline",
        "settings": {"duration_s": 10.0, "warmup_s": 2.0, "concurrency": [1, 64, 512]},
        "client": {"processes": 2, "connections": 512, "host": "ci"},
        "created": "2026-11-22T02:00:00+00:00",
    }
    fields.update(overrides)
    return Report(**fields)


def test_json_round_trip() -> None:
    report = _report()
    text = report.to_json()
    assert text.endswith("\n")
    data = json.loads(text)
    assert data["format"] == FORMAT
    assert data["steps"][1]["server"]["batch_sizes"] == {"1": 2, "4": 3, "8": 5}
    assert data["steps"][2]["latency"] is None
    assert Report.from_dict(data) == report


def test_save_and_load(tmp_path: Path) -> None:
    report = _report()
    path = tmp_path / "run.json"
    report.save(path)
    assert Report.load(path) == report
    assert Report.load(str(path)) == report


def test_load_labels_an_unlabelled_report_by_its_file_name(tmp_path: Path) -> None:
    path = tmp_path / "before-fix.json"
    _report(label="").save(path)
    assert Report.load(path).label == "before-fix"


def test_from_dict_tolerates_a_missing_goodput() -> None:
    data = json.loads(_report().to_json())
    del data["steps"][0]["goodput_rps"]
    assert Report.from_dict(data).steps[0].goodput_rps is None


def test_a_report_needs_only_its_required_fields() -> None:
    data: dict[str, Any] = {"format": FORMAT, "target": "t", "kind": "in-process", "model": "m"}
    data.update(mode="rate", steps=[])
    report = Report.from_dict(data)
    assert report == Report(target="t", kind="in-process", model="m", mode="rate")
    assert asdict(report)["settings"] == {}


# refusals


def test_report_error_is_a_carpool_value_error_that_pickles() -> None:
    assert issubclass(ReportError, CarpoolError)
    assert issubclass(ReportError, ValueError)
    error = pickle.loads(pickle.dumps(ReportError("report 'a.json' is not JSON")))
    assert type(error) is ReportError
    assert (str(error), error.message) == ("report 'a.json' is not JSON",) * 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("format"), "not a carpool bench report of format 'carpool-bench/1' "),
        (lambda d: d.update(format="carpool-bench/0"), r"\(format: 'carpool-bench/0'\)"),
        (lambda d: d.pop("steps"), "malformed carpool bench report: 'steps'"),
        (lambda d: d.pop("target"), "malformed carpool bench report: .*target"),
        (lambda d: d.update(colour="red"), "malformed carpool bench report: .*colour"),
        (lambda d: d["steps"][0].pop("ok"), "malformed carpool bench report: 'ok'"),
        (lambda d: d["steps"][0]["load"].pop("mode"), "malformed carpool bench report: .*mode"),
        (lambda d: d["steps"][1]["server"].pop("rows"), "malformed carpool bench report: .*rows"),
        (lambda d: d["steps"][0].update(latency=[1, 2]), "malformed carpool bench report"),
    ],
)
def test_from_dict_refuses(change: Any, message: str) -> None:
    data = json.loads(_report().to_json())
    change(data)
    with pytest.raises(ReportError, match=message):
        Report.from_dict(data)


def test_load_refuses_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match=r"cannot read report '.*nope\.json'"):
        Report.load(tmp_path / "nope.json")


def test_load_refuses_text_that_is_not_json(tmp_path: Path) -> None:
    path = tmp_path / "notes.json"
    path.write_text("p99 was fine\n")
    with pytest.raises(ReportError, match=r"report '.*notes\.json' is not JSON"):
        Report.load(path)


def test_load_refuses_json_that_is_not_an_object(tmp_path: Path) -> None:
    path = tmp_path / "list.json"
    path.write_text("[1, 2, 3]")
    with pytest.raises(ReportError, match=r"report '.*list\.json' is not a JSON object"):
        Report.load(path)


def test_load_refuses_another_format(tmp_path: Path) -> None:
    path = tmp_path / "perf.json"
    path.write_text(json.dumps({"format": "perf_analyzer", "steps": []}))
    with pytest.raises(ReportError, match="write one with carpool bench --json"):
        Report.load(path)
