"""The target seam of ``carpool bench`` (``carpool.bench.targets.base``): its usage error, and
what a TARGET that is a URL looks like."""

from __future__ import annotations

import pickle

import pytest

from carpool.bench.targets.base import BenchError, is_url
from carpool.errors import CarpoolError


def test_bench_error_is_a_carpool_value_error_that_pickles() -> None:
    assert issubclass(BenchError, CarpoolError)
    assert issubclass(BenchError, ValueError)
    error = pickle.loads(pickle.dumps(BenchError("--rate values must be > 0")))
    assert type(error) is BenchError
    assert (str(error), error.message) == ("--rate values must be > 0",) * 2


@pytest.mark.parametrize(
    ("text", "url"),
    [
        ("http://127.0.0.1:8000/v2/models/demo", True),
        ("https://h/v2/models/m", True),
        ("demo", False),
        ("models:add_one", False),
        ("model.onnx", False),
    ],
)
def test_a_target_is_a_url_when_it_names_the_scheme(text: str, url: bool) -> None:
    assert is_url(text) is url
