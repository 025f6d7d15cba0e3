"""``--lengths`` (``carpool.bench.lengths``): the forms it parses, what each draws, and the
``--stream`` flags as :func:`~carpool.bench.options.options_from` checks them."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from carpool.bench.flags import add_bench_command
from carpool.bench.lengths import Lengths, parse_lengths
from carpool.bench.options import Options, options_from
from carpool.bench.targets.base import BenchError


@pytest.mark.parametrize(
    ("text", "lengths"),
    [
        ("fixed:64", Lengths("fixed", 64)),
        (" uniform:16, 128 ", Lengths("uniform", 16, 128)),
        ("uniform:5,5", Lengths("uniform", 5, 5)),
        ("geometric:64", Lengths("geometric", 64)),
        ("geometric:64,cap=512", Lengths("geometric", 64, cap=512)),
    ],
)
def test_each_form_parses_and_prints_as_written(text: str, lengths: Lengths) -> None:
    parsed = parse_lengths(text)
    assert parsed == lengths
    assert parse_lengths(str(parsed)) == parsed


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("64", "--lengths must be fixed:N, uniform:LOW,HIGH or geometric:MEAN[,cap=N], got '64'"),
        ("normal:64", "--lengths must be fixed:N"),
        ("fixed:", "--lengths must be fixed:N"),
        ("fixed:1,2", "--lengths must be fixed:N"),
        ("uniform:8", "--lengths must be fixed:N"),
        ("fixed:0", "--lengths takes whole numbers >= 1"),
        ("fixed:2.5", "--lengths takes whole numbers >= 1"),
        ("uniform:9,3", "--lengths uniform:LOW,HIGH needs LOW <= HIGH, got 'uniform:9,3'"),
        ("geometric:64,cap=8", "--lengths cap must be >= the mean, got 'geometric:64,cap=8'"),
        ("geometric:64,cap=x", "--lengths takes whole numbers >= 1"),
        ("geometric:64,max=9", "--lengths takes whole numbers >= 1"),
    ],
)
def test_a_bad_form_names_the_forms_it_takes(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("[", r"\[").replace("(", r"\(")):
        parse_lengths(text)


def test_fixed_draws_its_one_length() -> None:
    assert Lengths("fixed", 7).draw(4, seed=3) == [7, 7, 7, 7]


def test_uniform_draws_within_its_bounds_inclusive_and_by_seed() -> None:
    uniform = Lengths("uniform", 3, 5)
    drawn = uniform.draw(2000, seed=1)
    assert set(drawn) == {3, 4, 5}
    assert uniform.draw(2000, seed=1) == drawn
    assert uniform.draw(2000, seed=2) != drawn


def test_geometric_has_its_mean_and_keeps_under_its_cap() -> None:
    drawn = np.asarray(Lengths("geometric", 8).draw(20000, seed=0))
    assert drawn.min() == 1
    assert abs(drawn.mean() - 8) < 0.3  # 20000 draws: the standard error is 0.05
    capped = Lengths("geometric", 8, cap=10).draw(20000, seed=0)
    assert max(capped) == 10
    assert capped == np.minimum(drawn, 10).tolist()


# ----------------------------------------------------------------------------- the flags


def options(*flags: str) -> Options:
    top = argparse.ArgumentParser(prog="carpool")
    add_bench_command(top.add_subparsers(dest="command"))
    return options_from(top.parse_args(["bench", *flags]), check_paths=lambda args: None)


def test_stream_flags_become_options_and_settings() -> None:
    url = "http://h:8000/v2/models/smollm2"
    got = options(url, "--stream", "--lengths", "geometric:64,cap=512")
    assert (got.stream, got.lengths, got.length_parameter) == (
        True,
        Lengths("geometric", 64, cap=512),
        "max_tokens",
    )
    settings = got.settings()
    assert (settings["stream"], settings["lengths"], settings["length_parameter"]) == (
        True,
        "geometric:64,cap=512",
        "max_tokens",
    )
    named = options("m:x", "--stream", "--lengths", "fixed:3", "--length-parameter", "n")
    assert (named.lengths, named.length_parameter) == (Lengths("fixed", 3), "n")
    assert options("m:x", "--stream").lengths is None


def test_a_one_shot_run_records_no_stream_settings() -> None:
    settings = options("http://h:8000/v2/models/demo").settings()
    assert not {"stream", "lengths", "length_parameter"} & set(settings)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["m:x", "--lengths", "fixed:3"], "--lengths applies to streams; add --stream"),
        (["m:x", "--length-parameter", "n"], "--length-parameter applies to streams; add --stream"),
        (
            ["http://h/v1/embeddings", "--stream"],
            "--stream needs a step-wise model; /v1/embeddings answers whole",
        ),
        (
            ["m:x", "--stream", "--sweep-batching"],
            "--sweep-batching applies to one-shot requests, not to --stream",
        ),
        (
            ["http://h/v2/models/m", "--stream", "--repeat-fraction", "0.5"],
            "--repeat-fraction applies to one-shot requests, not to --stream",
        ),
        (
            ["http://h/v2/models/m", "--stream", "--encoding", "binary"],
            "--encoding applies to one-shot requests, not to --stream",
        ),
        (["m:x", "--stream", "--length-parameter", " "], "--length-parameter must name a"),
        (["m:x", "--stream", "--lengths", "fixed:0"], "--lengths takes whole numbers >= 1"),
    ],
)
def test_stream_flags_that_cannot_apply_are_usage_errors(flags: list[str], message: str) -> None:
    with pytest.raises(BenchError, match="^" + message):
        options(*flags)
