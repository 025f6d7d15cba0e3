"""Flags that fall back to environment variables (``carpool.envflags``): the variable's name,
its value as the default, the flag over it, and errors that blame the right one."""

from __future__ import annotations

import argparse

import pytest

from carpool.envflags import add_flag, parse_bool


def parser(prefix: str = "CARPOOL_") -> argparse.ArgumentParser:
    built = argparse.ArgumentParser(prog="prog")
    add_flag(built, "--max-batch-size", int, 32, "rows per call", prefix=prefix)
    return built


def test_the_variable_is_the_prefix_and_the_flag_in_capitals(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert parser().parse_args([]).max_batch_size == 32
    monkeypatch.setenv("CARPOOL_MAX_BATCH_SIZE", "8")
    assert parser().parse_args([]).max_batch_size == 8
    assert parser().parse_args(["--max-batch-size", "4"]).max_batch_size == 4  # flag wins
    monkeypatch.setenv("APP_MAX_BATCH_SIZE", "2")
    assert parser(prefix="APP_").parse_args([]).max_batch_size == 2


def test_an_empty_variable_is_no_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CARPOOL_MAX_BATCH_SIZE", "")
    assert parser().parse_args([]).max_batch_size == 32


def test_help_names_the_variable_and_the_default() -> None:
    text = " ".join(parser().format_help().split())
    assert "rows per call (env CARPOOL_MAX_BATCH_SIZE; default 32)" in text
    no_default = argparse.ArgumentParser()
    add_flag(no_default, "--port", int, None, "port to listen on")
    assert "port to listen on (env CARPOOL_PORT)" in " ".join(no_default.format_help().split())


def test_a_bad_variable_is_blamed_on_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CARPOOL_MAX_BATCH_SIZE", "many")
    with pytest.raises(SystemExit) as exited:
        parser().parse_args([])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "environment variable CARPOOL_MAX_BATCH_SIZE='many' is invalid" in err
    assert parser().parse_args(["--max-batch-size", "3"]).max_batch_size == 3  # overridden


def test_a_bad_flag_is_blamed_on_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parser().parse_args(["--max-batch-size", "many"])
    assert exited.value.code == 2
    assert "argument --max-batch-size: invalid int value: 'many'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "value"),
    [
        *[("1", True), ("true", True), (" Yes ", True), ("ON", True)],
        *[("0", False), ("false", False), ("No", False), ("off", False)],
    ],
)
def test_parse_bool(text: str, value: bool) -> None:
    assert parse_bool(text) is value


def test_parse_bool_refuses_anything_else() -> None:
    with pytest.raises(ValueError, match="maybe"):
        parse_bool("maybe")
