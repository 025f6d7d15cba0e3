"""``error_status``: every exception a request can end in, as its status.

The same table is exercised end to end over HTTP in ``test_error_responses.py``; here every row
is checked directly, with the headers and message each status carries.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from carpool import Model
from carpool.errors import (
    BatcherClosed,
    BatchSizeMismatch,
    CollationError,
    DeadlineExceeded,
    Overloaded,
    QueueFull,
    SharedMemoryFull,
)
from carpool.server.failures import ModelNotFound, ModelOutputError, ModelUnavailable
from carpool.server.inference.outcomes import Recorder, error_status
from carpool.server.lifecycle.registry import Registry
from carpool.server.messages import ProtocolError
from carpool.server.statuses import STOPPING, HTTPError

RETRY = [(b"retry-after", b"1")]


@pytest.mark.parametrize(
    ("exc", "status", "message", "headers"),
    [
        (ProtocolError("bad shape", field="x"), 400, "bad shape", []),
        (ProtocolError("too many", field="x", status=413), 413, "too many", []),
        (ProtocolError("BYTES as FP32", field="y", status=500), 500, "BYTES as FP32", []),
        (ModelNotFound("m"), 404, "Request for unknown model: 'm' is not found", []),
        (
            ModelNotFound("m", "3"),
            404,
            "Request for unknown model: 'm' version '3' is not found",
            [],
        ),
        (
            ModelUnavailable("m", "no such file"),
            400,
            "Model 'm' is not ready: failed to load: no such file",
            [],
        ),
        (QueueFull(max_queue_size=2, queued=2, rows=1), 503, "Exceeds maximum queue size", RETRY),
        (SharedMemoryFull(needed=8, free=4), 503, "shared memory (/dev/shm) has no room", RETRY),
        (
            Overloaded(predicted_ms=80.0, budget_ms=50.0, queued=9, rows=1),
            503,
            "Overloaded: 9 rows queued ahead",
            RETRY,
        ),
        (
            DeadlineExceeded(timeout_ms=20.0, stage="queued"),
            503,
            "Request timeout expired: timeout_ms=20 passed while queued",
            RETRY,
        ),
        (BatcherClosed("m", "is stopping"), 503, STOPPING, []),
        (
            BatchSizeMismatch(expected=2, actual=3),
            500,
            "model error: model_fn returned 3 rows",
            [],
        ),
        (ModelOutputError("model 'm' returned outputs []"), 500, "model error: model 'm'", []),
        (ValueError("negative input"), 500, "model error: ValueError: negative input", []),
        (
            CollationError("ragged rows", field="output"),
            500,
            "model error: CollationError: output: ragged rows",
            [],
        ),
    ],
)
def test_every_outcome_has_one_status(
    exc: Exception, status: int, message: str, headers: list[tuple[bytes, bytes]]
) -> None:
    error = error_status(exc)
    assert error.status == status
    assert error.message.startswith(message), error.message
    assert error.headers == headers


def test_an_http_error_is_its_own_answer() -> None:
    error = HTTPError(405, "Method Not Allowed", [(b"allow", b"GET")])
    assert error_status(error) is error


@pytest.mark.parametrize("exc", [asyncio.CancelledError(), KeyboardInterrupt()])
def test_what_is_not_an_exception_is_not_an_outcome(exc: BaseException) -> None:
    with pytest.raises(type(exc)):
        error_status(exc)


def test_the_classification_imports_none_of_the_modules_that_raise_what_it_classifies() -> None:
    """The registry, model control and admission raise what ``error_status`` maps; their
    exceptions live below them (``carpool.server.failures``), so it needs none of them."""
    code = (
        "import sys, carpool.server.inference.outcomes; "
        "print(sorted(m for m in sys.modules if m.startswith('carpool.server')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = done.stdout
    assert "carpool.server.inference.outcomes" in loaded
    for module in ("lifecycle.registry", "lifecycle.control", "inference.admission"):
        assert f"carpool.server.{module}'" not in loaded


def test_the_recorder_counts_under_the_model_once_known_else_the_servers() -> None:
    registry = Registry([Model(lambda batch: batch, name="m")])
    (served,) = registry
    recorder = Recorder(registry)
    recorder.record("http", 200, served, 0.5)
    recorder.record("http", 404)
    recorder.server("grpc")(401)
    recorder.named("grpc", 499, "m", None)  # withdrawn before the path: under its model
    recorder.named("grpc", 499, "m", "7")  # no such version: the server's
    recorder.named("grpc", 499, "x", None)
    assert served.statuses == {"http": {200: 1}, "grpc": {499: 1}}
    assert served.request_seconds == 0.5
    assert registry.server_counts.totals() == {"http": {404: 1}, "grpc": {401: 1, 499: 2}}
