"""Fixtures of the model-loading tests: importable test modules, written fresh or shared."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import pytest

SERVER_TESTS = Path(__file__).resolve().parent.parent / "server"  # holds models.py

_names = itertools.count()


@pytest.fixture
def test_models(monkeypatch: pytest.MonkeyPatch) -> None:
    """``tests/server/models.py`` importable as ``models``, as ``carpool serve`` finds it."""
    monkeypatch.syspath_prepend(str(SERVER_TESTS))


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], str]:
    """Writes a module with a fresh name; returns the name."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(source: str) -> str:
        name = f"carpool_config_test_{next(_names)}"
        (tmp_path / f"{name}.py").write_text(source)
        return name

    return write


def declared_model(module: Callable[[str], str]) -> str:
    """The target of a Model that declares its batching: 16 rows, 2 ms, 3 workers."""
    name = module(
        "from carpool import Batching, Model\n"
        "net = Model(lambda b: b, name='net',\n"
        "            batching=Batching(max_batch_size=16, max_wait_ms=2.0, workers=3))\n"
    )
    return f"{name}:net"
