"""The carpool command, run as a user runs it: a real subprocess; and its parser, built in
process, whose model flags are the settings records' fields."""

import argparse
import dataclasses
import os
import subprocess
import sys

import pytest

from carpool import Batching, Model
from carpool.cli import build_parser
from carpool.engine.options import DEFAULTS, BatcherOptions
from carpool.server.config import ServerConfig


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "carpool", *args], capture_output=True, text=True, timeout=120
    )


def test_demo_batches_and_checks_every_row() -> None:
    done = run("demo", "--requests", "300", "--concurrency", "32", "--max-batch-size", "16")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "300 requests, 32 concurrent callers" in out
    assert "every caller got its own row (same as running it alone): True" in out
    assert "completed=300 failed=0 expired=0 cancelled=0" in out
    assert "max_batch_size=16" in out


def test_help_explains_the_commands() -> None:
    done = run("--help")
    assert done.returncode == 0
    assert "demo" in done.stdout
    demo = run("demo", "--help")
    assert "CARPOOL_REQUESTS" in demo.stdout


def test_unknown_command_is_a_usage_error() -> None:
    done = run("fly")
    assert done.returncode == 2
    assert "invalid choice: 'fly'" in done.stderr


def parser_of(command: str, monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    """``carpool COMMAND``'s parser, built in this process with no CARPOOL_ variable set."""
    for variable in [v for v in os.environ if v.startswith("CARPOOL_")]:
        monkeypatch.delenv(variable)
    commands = next(
        action
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    return commands.choices[command]


def test_serve_takes_each_flagged_option_from_the_record(monkeypatch: pytest.MonkeyPatch) -> None:
    actions = {action.dest: action for action in parser_of("serve", monkeypatch)._actions}
    flagged = [f for f in dataclasses.fields(BatcherOptions) if "help" in f.metadata]
    own = [  # a model's settings that are not the batcher's, stated the same way
        f for record in (Batching, Model) for f in dataclasses.fields(record) if f.metadata
    ]
    assert {f.name for f in own} == {
        "default_timeout_ms",
        "ray_address",
        "max_rows_per_request",
        "openai",
    }
    for spec in flagged + own:
        action = actions[spec.name]
        assert action.option_strings == ["--" + spec.name.replace("_", "-")]
        assert action.default is None  # unset: the config file's value, else the model's
        shown = spec.default if spec.metadata["shown"] is None else spec.metadata["shown"]
        text = spec.metadata["help"] if shown is None else f"{spec.metadata['help']} [{shown}]"
        assert action.help == f"{text} (env CARPOOL_{spec.name.upper()})"
    assert (
        actions["max_batch_size"].help
        == "rows per model call at most [32] (env CARPOOL_MAX_BATCH_SIZE)"
    )
    assert actions["max_queue_size"].help == (
        "rows allowed to wait; then 503 [no limit] (env CARPOOL_MAX_QUEUE_SIZE)"
    )
    given = {
        "max_batch_size": "4",
        "max_wait_ms": "2",
        "policy": "adaptive",
        "max_queue_size": "9",
        "workers": "3",
        "latency_slo_ms": "50",
        "runner": "process",
        "batch_timeout_ms": "100",
        "max_batch_tokens": "64",
    }
    assert set(given) == {spec.name for spec in flagged}
    argv = [
        part for name, value in given.items() for part in ("--" + name.replace("_", "-"), value)
    ]
    args = build_parser().parse_args(["serve", *argv])
    parsed = {name: getattr(args, name) for name in given}
    assert parsed == {
        "max_batch_size": 4,
        "max_wait_ms": 2.0,
        "policy": "adaptive",
        "max_queue_size": 9,
        "workers": 3,
        "latency_slo_ms": 50.0,
        "runner": "process",
        "batch_timeout_ms": 100.0,
        "max_batch_tokens": 64,
    }
    assert [type(parsed[n]) for n in ("max_batch_size", "max_wait_ms")] == [int, float]
    assert BatcherOptions(**parsed).max_batch_tokens == 64  # each parses as its option's type


def test_the_demos_batch_size_is_the_batchers_default(monkeypatch: pytest.MonkeyPatch) -> None:
    action = next(a for a in parser_of("demo", monkeypatch)._actions if a.dest == "max_batch_size")
    assert action.default == DEFAULTS.max_batch_size
    default = DEFAULTS.max_batch_size
    assert (
        action.help
        == f"rows per model call at most (env CARPOOL_MAX_BATCH_SIZE; default {default})"
    )


def test_each_server_flag_is_a_field_stating_its_type_default_and_help(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    flagged = {f.name: f for f in dataclasses.fields(ServerConfig) if "help" in f.metadata}
    assert set(flagged) == {f.name for f in dataclasses.fields(ServerConfig)} - {
        "api_keys",  # a repeatable flag whose variable is read once and removed
        "models",
        "unavailable",
        "catalog",
    }
    serve = parser_of("serve", monkeypatch)
    actions = {a.option_strings[0]: a for a in serve._actions if a.option_strings}
    argv, given = [], {}
    for name, spec in flagged.items():
        flag = spec.metadata["flag"] or "--" + name.replace("_", "-")
        shown = str(spec.default).lower() if isinstance(spec.default, bool) else spec.default
        text = spec.metadata["help"] if shown is None else f"{spec.metadata['help']} [{shown}]"
        variable = "CARPOOL_" + flag.lstrip("-").replace("-", "_").upper()
        assert actions[flag].help == f"{text} (env {variable})", flag
        assert actions[flag].default is None  # unset: the config file's [server] value stands
        if spec.default is not None:  # the default, given as a flag, is read back as it
            argv += [flag, str(shown)]
            given[name] = actions[flag].dest
    assert actions["--drain-timeout"].help == (
        "seconds to finish requests on SIGTERM [30] (env CARPOOL_DRAIN_TIMEOUT)"
    )
    args = build_parser().parse_args(["serve", *argv])
    assert ServerConfig(**{name: getattr(args, dest) for name, dest in given.items()}) == (
        ServerConfig()
    )
