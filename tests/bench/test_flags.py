"""``carpool bench``'s flags (``carpool.bench.flags``): every flag with its ``CARPOOL_BENCH_*``
variable (a contract with scripts and containers), the help's examples, and "1,8,64" lists."""

from __future__ import annotations

import argparse

import pytest

from carpool.bench.flags import add_bench_command, parse_list
from carpool.cli import main

# flag -> its environment variable; the names are a contract, so this table is written out.
FLAGS = {
    "--concurrency": "CARPOOL_BENCH_CONCURRENCY",
    "--rate": "CARPOOL_BENCH_RATE",
    "--trace": "CARPOOL_BENCH_TRACE",
    "--duration": "CARPOOL_BENCH_DURATION",
    "--requests": "CARPOOL_BENCH_REQUESTS",
    "--warmup": "CARPOOL_BENCH_WARMUP",
    "--seed": "CARPOOL_BENCH_SEED",
    "--input-data": "CARPOOL_BENCH_INPUT_DATA",
    "--strings": "CARPOOL_BENCH_STRINGS",
    "--rows": "CARPOOL_BENCH_ROWS",
    "--distinct": "CARPOOL_BENCH_DISTINCT",
    "--repeat-fraction": "CARPOOL_BENCH_REPEAT_FRACTION",
    "--unique": "CARPOOL_BENCH_UNIQUE",
    "--encoding": "CARPOOL_BENCH_ENCODING",
    "--model": "CARPOOL_BENCH_MODEL",
    "--lengths": "CARPOOL_BENCH_LENGTHS",
    "--length-parameter": "CARPOOL_BENCH_LENGTH_PARAMETER",
    "--client-processes": "CARPOOL_BENCH_CLIENT_PROCESSES",
    "--connections": "CARPOOL_BENCH_CONNECTIONS",
    "--timeout": "CARPOOL_BENCH_TIMEOUT",
    "--max-batch-size": "CARPOOL_BENCH_MAX_BATCH_SIZE",
    "--max-wait-ms": "CARPOOL_BENCH_MAX_WAIT_MS",
    "--policy": "CARPOOL_BENCH_POLICY",
    "--workers": "CARPOOL_BENCH_WORKERS",
    "--max-queue-size": "CARPOOL_BENCH_MAX_QUEUE_SIZE",
    "--p99-budget-ms": "CARPOOL_BENCH_P99_BUDGET_MS",
    "--slo-ms": "CARPOOL_BENCH_SLO_MS",
    "--json": "CARPOOL_BENCH_JSON",
    "--plot": "CARPOOL_BENCH_PLOT",
    "--label": "CARPOOL_BENCH_LABEL",
}
SWITCHES = ("--shape", "--stream", "--sweep-batching", "--compare")  # no environment variable


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="carpool")
    add_bench_command(top.add_subparsers(dest="command"))
    return top


def help_entries() -> dict[str, str]:
    """``carpool bench``'s options: flag -> its help text, as --help shows it unwrapped."""
    bench = add_bench_command(argparse.ArgumentParser().add_subparsers())
    return {flag: str(a.help) for a in bench._actions for flag in a.option_strings}


def test_every_flag_reads_its_environment_variable() -> None:
    entries = help_entries()
    assert set(entries) == {"-h", "--help", *FLAGS, *SWITCHES}
    for flag, env in FLAGS.items():
        assert entries[flag].endswith(f"(env {env})"), entries[flag]
    for flag in SWITCHES:
        assert "(env " not in entries[flag]


def test_an_environment_variable_is_the_flags_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CARPOOL_BENCH_CONCURRENCY", "2,4")
    monkeypatch.setenv("CARPOOL_BENCH_MAX_WAIT_MS", "0,2.5")
    args = parser().parse_args(["bench", "demo"])
    assert (args.concurrency, args.max_wait_ms) == ([2, 4], [0.0, 2.5])
    assert parser().parse_args(["bench", "demo", "--concurrency", "8"]).concurrency == [8]


def test_flags_read_their_environment_variables(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CARPOOL_BENCH_CONCURRENCY", "1,x")
    with pytest.raises(SystemExit) as exited:
        main(["bench", "demo"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "environment variable CARPOOL_BENCH_CONCURRENCY='1,x' is invalid" in err
    assert "Traceback" not in err


def test_a_bad_list_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parser().parse_args(["bench", "demo", "--concurrency", "1,x"])
    assert exited.value.code == 2
    assert "argument --concurrency: invalid integer list value: '1,x'" in capsys.readouterr().err


def test_help_explains_every_flag_and_gives_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench", "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    flags = [
        "--concurrency",
        "--rate",
        "--trace",
        "--duration",
        "--requests",
        "--warmup",
        "--seed",
        "--input-data",
        "--strings",
        "--shape",
        "--rows",
        "--client-processes",
        "--max-batch-size",
        "--max-wait-ms",
        "--policy",
        "--workers",
        "--sweep-batching",
        "--p99-budget-ms",
        "--slo-ms",
        "--json",
        "--plot",
        "--compare",
    ]
    for flag in flags:
        assert flag in out
    assert "CARPOOL_BENCH_CONCURRENCY" in out
    assert "examples:" in out
    assert "carpool bench --compare a.json b.json" in out


# Option lists


def test_parse_list() -> None:
    assert parse_list("1,8,64", int) == [1, 8, 64]
    assert parse_list(" 1, 8 ,64 ", int) == [1, 8, 64]
    assert parse_list("7", int) == [7]
    assert parse_list("0.5,2", float) == [0.5, 2.0]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "--concurrency expects a comma-separated list like '1,8,64', got nothing"),
        ("1,,8", r"--concurrency expects a comma-separated list of int like '1,8,64'; '' in"),
        ("1,8,", r"'' in '1,8,' is not one"),
        ("1,eight", r"'eight' in '1,eight' is not one"),
        ("1.5", r"'1.5' in '1.5' is not one"),
    ],
)
def test_parse_list_refuses(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_list(text, int, option="--concurrency")


def test_parse_list_without_an_option_name() -> None:
    with pytest.raises(ValueError, match=r"^expects a comma-separated list of float"):
        parse_list("fast", float)
