"""The tables a person reads: cells exactly, and the rendered text where layout matters."""

# ruff: noqa: RUF001  (the tables print the multiplication sign on purpose)

from __future__ import annotations

import dataclasses

import pytest

from bench.conftest import latency, report, step
from carpool.bench.report.data import Report, ServerSide, Step
from carpool.bench.report.present import (
    SweepResult,
    batch_histogram,
    best,
    compare_table,
    errors_text,
    render,
    step_row,
    steps_table,
    sweep_table,
)


def _step(
    clients: float,
    rps: float,
    p99: float | None,
    *,
    server: ServerSide | None = None,
    errors: dict[str, int] | None = None,
    goodput: float | None = None,
    mode: str = "concurrency",
) -> Step:
    """``rps`` for 10 s, p50 half of p99 and the max one and a half times it."""
    measured = latency(p99 / 2, p99, max_ms=p99 * 1.5) if p99 is not None else None
    return step(clients, rps, measured, mode=mode, errors=errors, server=server, goodput=goodput)


def _report(steps: list[Step], label: str = "eager") -> Report:
    return report(steps, label=label)


SERVER = ServerSide(
    batches=250,
    rows=2000,
    batch_size_mean=8.0,
    batch_sizes={"8": 200, "1": 12, "+Inf": 1, "4": 37},
    queue_wait_ms_mean=1.5,
    model_ms_mean=3.0,
    queue_wait_share=0.375,
)

# one step


def test_step_row_plain() -> None:
    assert step_row(_step(1, 512.25, 4.0)) == [
        "1 clients",
        "512.2",
        "2.00",
        "3.00",
        "4.00",
        "6.00",
        "5122",
        "-",
    ]


def test_step_row_with_server_goodput_and_errors() -> None:
    step = _step(
        64,
        12345.0,
        250.0,
        server=SERVER,
        errors={"ClientOSError": 1, "503": 12, "QueueFull": 1},
        goodput=12000.0,
    )
    assert step_row(step) == [
        "64 clients",
        "12,345.0",
        "125",
        "188",
        "250",
        "375",
        "123450",
        "503×12, ClientOSError×1, QueueFull×1",
        "8.0",
        "38%",
        "12,000.0",
    ]


def test_step_row_columns_can_be_forced_and_absent_values_are_dashes() -> None:
    step = _step(8, 100.0, None)
    assert step_row(step, server=True, goodput=True) == [
        "8 clients",
        "100.0",
        *["-"] * 4,
        "1000",
        "-",
        "-",
        "-",
        "-",
    ]
    assert len(step_row(_step(8, 1.0, 0.5, server=SERVER), server=False)) == 8


def test_step_row_milliseconds_keep_three_figures() -> None:
    cells = step_row(_step(1, 1.0, 0.125))
    assert cells[2:6] == ["0.062", "0.094", "0.125", "0.188"]
    cells = step_row(_step(1, 1.0, 2400.0))
    assert cells[2:6] == ["1,200", "1,800", "2,400", "3,600"]


def test_errors_text() -> None:
    assert errors_text({}) == "-"
    assert errors_text({"503": 0}) == "-"
    assert errors_text({"b": 2, "a": 2, "c": 5}) == "c×5, a×2, b×2"


def test_batch_histogram_in_bucket_order() -> None:
    # A report without floors knows each bucket by its bound alone.
    assert batch_histogram(_step(1, 1.0, 1.0, server=SERVER)) == "1:12 ≤4:37 ≤8:200 +Inf:1"
    assert batch_histogram(_step(1, 1.0, 1.0)) == "-"


def test_batch_histogram_shows_ranges_never_a_bound_as_a_size() -> None:
    """/metrics' buckets (powers of two) read as the ranges they count; a server that
    counts every size (gRPC's statistics, in process) shows each size as it is."""
    ranges = dataclasses.replace(SERVER, batch_size_floors={"4": 3, "8": 5, "+Inf": 9})
    assert batch_histogram(_step(8, 1.0, 1.0, server=ranges)) == "1:12 3-4:37 5-8:200 ≥9:1"
    sizes = {"3": 71, "5": 75, "6": 243, "7": 178}
    exact = dataclasses.replace(SERVER, batch_sizes=sizes, batch_size_floors={})
    assert batch_histogram(_step(8, 1.0, 1.0, server=exact)) == "3:71 5:75 6:243 7:178"


# a report


def test_steps_table_columns_follow_the_data() -> None:
    plain = steps_table(_report([_step(1, 10.0, 1.0), _step(8, 70.0, 2.0)]))
    assert [c.header for c in plain.columns] == [
        "load",
        "req/s",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "max ms",
        "ok",
        "errors",
    ]
    assert plain.row_count == 2
    rich = steps_table(_report([_step(1, 10.0, 1.0), _step(8, 70.0, 2.0, server=SERVER)]))
    assert [c.header for c in rich.columns][8:] == ["mean batch", "queue wait"]
    good = steps_table(_report([_step(1, 10.0, 1.0, goodput=9.0)]))
    assert [c.header for c in good.columns][8:] == ["goodput req/s"]


def test_steps_table_renders() -> None:
    report = _report([_step(1, 10.0, 1.0), _step(8, 70.0, 2.0, server=SERVER)])
    text = render(steps_table(report))
    assert text.splitlines()[0].rstrip() == "demo on http://127.0.0.1:8000 (http): eager"
    row = next(line for line in text.splitlines() if "8 clients" in line)
    assert row.split("│")[1:-1] == [
        " 8 clients ",
        "  70.0 ",
        "   1.00 ",
        "   1.50 ",
        "   2.00 ",
        "   3.00 ",
        " 700 ",
        " -      ",
        "        8.0 ",
        "        38% ",
    ]
    first = next(line for line in text.splitlines() if "1 clients" in line)
    assert first.split("│")[-3:-1] == ["          - ", "          - "]  # no server data


def test_render_width_is_honoured() -> None:
    text = render(steps_table(_report([_step(1, 10.0, 1.0)])), width=60)
    assert max(len(line) for line in text.splitlines()) <= 60


# reports side by side


def test_compare_table_rows_per_load_and_ratios_to_the_first() -> None:
    first = _report([_step(1, 100.0, 2.0), _step(8, 400.0, 8.0)], label="before")
    second = _report([_step(1, 150.0, 1.0), _step(64, 900.0, 40.0)], label="after")
    third = _report([_step(8, 800.0, None), _step(1, 50.0, 3.0)], label="")
    table = compare_table([first, second, third])
    assert [c.header for c in table.columns] == [
        "load",
        "before req/s",
        "before p99 ms",
        "after req/s",
        "after p99 ms",
        "report 3 req/s",
        "report 3 p99 ms",
        "req/s after/before",
        "p99 after/before",
        "req/s report 3/before",
        "p99 report 3/before",
    ]
    rows = [[str(cell) for cell in column.cells] for column in table.columns]
    by_row = list(zip(*rows, strict=True))
    assert by_row == [
        (
            "1 clients",
            "100.0",
            "2.00",
            "150.0",
            "1.00",
            "50.0",
            "3.00",
            "1.50×",
            "0.50×",
            "0.50×",
            "1.50×",
        ),
        ("8 clients", "400.0", "8.00", "-", "-", "800.0", "-", "-", "-", "2.00×", "-"),
        ("64 clients", "-", "-", "900.0", "40.0", "-", "-", "-", "-", "-", "-"),
    ]


def test_compare_table_sorts_modes_apart_and_needs_a_report() -> None:
    mixed = _report([_step(100, 99.0, 5.0, mode="rate"), _step(4, 300.0, 3.0)])
    table = compare_table([mixed])
    assert list(table.columns[0].cells) == ["4 clients", "100 req/s"]
    with pytest.raises(ValueError, match="at least one report"):
        compare_table([])


# a batching sweep


SWEEP = [
    SweepResult(8, 1.0, _step(64, 3000.0, 10.0)),
    SweepResult(16, 2.0, _step(64, 3500.0, 16.0)),
    SweepResult(32, 2.0, _step(64, 3500.0, 14.0)),  # same throughput, lower p99
    SweepResult(64, 5.0, _step(64, 4000.0, 60.0)),
    SweepResult(128, 5.0, _step(64, 9000.0, None)),  # nothing succeeded
]


def test_best_is_the_fastest_within_the_budget() -> None:
    assert best(SWEEP, 20.0) is SWEEP[2]
    assert best(SWEEP, 60.0) is SWEEP[3]  # the budget is inclusive
    assert best(SWEEP, 10.0) is SWEEP[0]
    assert best(SWEEP, 5.0) is None
    assert best([], 100.0) is None


def test_best_keeps_the_first_of_equals() -> None:
    twins = [
        SweepResult(8, 1.0, _step(64, 100.0, 5.0)),
        SweepResult(16, 1.0, _step(64, 100.0, 5.0)),
    ]
    assert best(twins, 10.0) is twins[0]


def test_sweep_table_marks_the_best() -> None:
    table = sweep_table(SWEEP, p99_budget_ms=20.0)
    assert table.title == "batching sweep (p99 budget 20 ms)"
    assert list(table.columns[-1].cells) == ["", "", "best", "", ""]
    assert list(table.columns[0].cells) == ["8", "16", "32", "64", "128"]
    assert list(table.columns[1].cells) == ["1", "2", "2", "5", "5"]
    assert list(table.columns[5].cells) == ["10.0", "16.0", "14.0", "60.0", "-"]
    unmarked = sweep_table(SWEEP)
    assert unmarked.title == "batching sweep"
    assert list(unmarked.columns[-1].cells) == [""] * 5
