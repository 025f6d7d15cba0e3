"""Tests that start a real ``carpool serve``, a Ray cluster or a benchmark script: each is
marked ``e2e``. The server harness and its fixtures are ``tests/server/conftest.py``'s."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from server.conftest import (  # noqa: F401  (fixtures, shared by being imported here)
    minilm_reference,
    sentence_transformer,
    serve,
    serve_module,
    threads,
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
AHEAD = 2  # scripts run at once by ``started``: most are one process on one core

RunOf = Callable[[pytest.Function, Path], tuple[list[str], float]]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.e2e)


def stdout_of(argv: list[str], timeout: float) -> str:
    """Run ``argv`` in the repository's root: its stdout, once it exits 0."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def scenario(module: str, folder: Path, *args: str) -> list[str]:
    """A benchmark scenario's quick run, as a user starts it from the repository's root,
    writing its figures to ``folder/figures.json`` (read by the ``figures`` fixture)."""
    json_path = str(folder / "figures.json")
    return [sys.executable, "-m", module, "--quick", "--cpus", "none", "--json", json_path, *args]


def shape(figures: dict[str, object]) -> dict[str, str]:
    """Each figure's name and type: what a test of a benchmark asserts (never its value,
    these machines are noisy), besides its checks."""
    return {name: type(value).__name__ for name, value in figures.items()}


@pytest.fixture(scope="module")
def started(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, dict[str, Future[str]]]]:
    """The scripts of the module's selected tests (its ``run_of(test, folder)``: the command
    and its timeout), started in the tests' order, AHEAD at a time: a test waits for its own
    script alone. Each test has a folder of its own, named after it, to write in."""
    folders = tmp_path_factory.mktemp("runs")
    run_of: RunOf = request.module.run_of
    pool = ThreadPoolExecutor(AHEAD)
    runs = {}
    for item in request.session.items:
        if isinstance(item, pytest.Function) and item.path == request.path:
            (folders / item.originalname).mkdir(exist_ok=True)
            runs[item.nodeid] = pool.submit(stdout_of, *run_of(item, folders / item.originalname))
    try:
        yield folders, runs
    finally:
        pool.shutdown(cancel_futures=True)  # the scripts of tests that never came (-x)


@pytest.fixture
def out(request: pytest.FixtureRequest, started: tuple[Path, dict[str, Future[str]]]) -> str:
    """This test's script's stdout, once it exits 0."""
    return started[1].pop(request.node.nodeid).result()


@pytest.fixture
def folder(started: tuple[Path, dict[str, Future[str]]], request: pytest.FixtureRequest) -> Path:
    """This test's own folder, where its script writes."""
    return started[0] / request.node.originalname


@pytest.fixture
def figures(out: str, folder: Path) -> dict[str, object]:
    """This test's scenario's figures, by name, once its run exited 0."""
    document = json.loads((folder / "figures.json").read_text())
    return {figure["name"]: figure["value"] for figure in document["figures"]}
