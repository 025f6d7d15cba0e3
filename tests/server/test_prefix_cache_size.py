"""``--prefix-cache-size``: its flag, variable and ``[server]`` key, each refusing what is not
a whole number of bytes (an empty value too; 0 is off), and the budget it gives every
step-wise model the server serves, those loaded at start and those model control loads."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from carpool import Model
from carpool.cli import build_parser
from carpool.errors import ConfigError
from carpool.loading import Catalog
from carpool.server.config import ServerConfig
from carpool.server.lifecycle.registry import Registry
from carpool.server.serve import _control
from carpool.stepwise import StepwiseModel
from server.step_models import prompts, words

MIB = 1024 * 1024


def serve_args(argv: list[str], monkeypatch: pytest.MonkeyPatch, **env: str) -> Any:
    """``carpool serve ARGV``'s parsed flags, with only ``env``'s CARPOOL_ variables set."""
    for variable in [v for v in os.environ if v.startswith("CARPOOL_")]:
        monkeypatch.delenv(variable)
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    return build_parser().parse_args(["serve", *argv])


def test_every_step_wise_model_gets_the_budget_by_default() -> None:
    plain = Model(lambda b: b, name="plain")
    config = ServerConfig(models=(words, plain))
    assert config.prefix_cache_size == 256 * MIB
    served_words, served_plain = config.models
    assert isinstance(served_words, StepwiseModel)
    assert served_words.prefix_cache_bytes == 256 * MIB
    assert served_plain is plain  # not step-wise: as it was
    assert words.prefix_cache_bytes == 0  # the library's default: off


def test_zero_turns_it_off() -> None:
    (served,) = ServerConfig(models=(prompts,), prefix_cache_size=0).models
    assert isinstance(served, StepwiseModel)
    assert served.prefix_cache_bytes == 0


@pytest.mark.parametrize("size", [-1, 1.5, True, "", "1024", None])
def test_a_size_that_is_not_bytes_is_refused(size: object) -> None:
    message = r"--prefix-cache-size must be a whole number of bytes >= 0 \(0: off\), got "
    with pytest.raises(ConfigError, match=message):
        ServerConfig(prefix_cache_size=size)  # type: ignore[arg-type]


def test_the_flag_and_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert serve_args([], monkeypatch).prefix_cache_size is None  # unset: [server]'s stands
    assert serve_args(["--prefix-cache-size", "0"], monkeypatch).prefix_cache_size == 0
    env = {"CARPOOL_PREFIX_CACHE_SIZE": "4096"}
    assert serve_args([], monkeypatch, **env).prefix_cache_size == 4096
    given = serve_args(["--prefix-cache-size", "8"], monkeypatch, **env)
    assert given.prefix_cache_size == 8  # the flag over its variable
    # an empty variable is no value, as for every variable (tests/test_envflags.py)
    assert serve_args([], monkeypatch, CARPOOL_PREFIX_CACHE_SIZE="").prefix_cache_size is None


@pytest.mark.parametrize(
    ("argv", "env", "said"),
    [
        (["--prefix-cache-size", ""], {}, "argument --prefix-cache-size: invalid int value: ''"),
        (["--prefix-cache-size", "1MiB"], {}, "invalid int value: '1MiB'"),
        ([], {"CARPOOL_PREFIX_CACHE_SIZE": "lots"}, "CARPOOL_PREFIX_CACHE_SIZE='lots' is invalid"),
    ],
)
def test_a_flag_or_variable_that_is_not_bytes_is_a_usage_error(
    argv: list[str],
    env: dict[str, str],
    said: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        serve_args(argv, monkeypatch, **env)
    assert exited.value.code == 2
    assert said in capsys.readouterr().err


@pytest.mark.parametrize(("value", "shown"), [('""', "''"), ("-5", "-5")])
def test_the_config_files_key_is_refused_empty_or_negative(
    value: str, shown: str, tmp_path: Path
) -> None:
    config = tmp_path / "carpool.toml"
    config.write_text(f"[server]\nprefix_cache_size = {value}\n")
    done = subprocess.run(
        [sys.executable, "-m", "carpool", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip().endswith(
        f"--prefix-cache-size must be a whole number of bytes >= 0 (0: off), got {shown}"
    )


def test_models_loaded_by_model_control_get_the_budget_too() -> None:
    config = ServerConfig(
        model_control_mode="explicit", catalog=Catalog(["demo"]), prefix_cache_size=1000
    )
    control = _control(config, Registry([], load_failures=()))
    assert control is not None
    served = control._serve(prompts)
    assert isinstance(served.model, StepwiseModel)
    assert served.model.prefix_cache_bytes == 1000
    assert served.batcher.steps.prefix_cache_bytes == 1000  # type: ignore[attr-defined]


def test_the_parser_shows_the_default_in_bytes() -> None:
    serve = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    ).choices["serve"]
    (action,) = [a for a in serve._actions if "--prefix-cache-size" in a.option_strings]
    assert action.help is not None
    assert action.help.endswith(f"0: off [{256 * MIB}] (env CARPOOL_PREFIX_CACHE_SIZE)")
