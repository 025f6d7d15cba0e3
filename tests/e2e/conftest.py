"""Tests that start a real ``carpool serve``, a Ray cluster or a benchmark script: each is
marked ``e2e``. The server harness and its fixtures are ``tests/server/conftest.py``'s."""

from __future__ import annotations

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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.e2e)
