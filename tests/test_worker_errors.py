"""carpool.worker_errors: the exact messages, the builtins each error also is, and that each
survives pickling and copying with its data (they cross process boundaries)."""

from __future__ import annotations

import copy
import pickle

import pytest

from carpool.errors import BatcherClosed, CarpoolError
from carpool.worker_errors import (
    BatchTimeout,
    WorkerDied,
    WorkerPoolClosed,
    WorkerStartError,
    describe_exit,
)


def examples() -> list[CarpoolError]:
    return [
        WorkerDied(worker="demo#1", exitcode=-9),
        WorkerDied(worker="demo#0", exitcode=1, retried=True),
        BatchTimeout(timeout_ms=2000, worker="demo#1"),
        BatchTimeout(timeout_ms=250.5, worker="demo", stage="waiting"),
        WorkerStartError(worker="demo#0", reason="ImportError: no module named 'x'"),
        WorkerPoolClosed("demo"),
    ]


@pytest.mark.parametrize("error", examples(), ids=lambda e: f"{type(e).__name__}")
def test_errors_survive_pickle_and_copy(error: CarpoolError) -> None:
    for clone in (pickle.loads(pickle.dumps(error)), copy.copy(error)):
        assert type(clone) is type(error)
        assert str(clone) == str(error)
        assert vars(clone) == vars(error)


def test_exit_codes_and_signals_are_told_apart() -> None:
    assert describe_exit(-9) == "signal 9"
    assert describe_exit(1) == "exit code 1"
    assert describe_exit(0) == "exit code 0"


def test_messages() -> None:
    assert str(WorkerDied(worker="demo#1", exitcode=-9)) == (
        "model worker demo#1 died (signal 9) while running the batch; the worker is being "
        "restarted. Check the server log for why."
    )
    assert str(WorkerDied(worker="demo#0", exitcode=1, retried=True)) == (
        "model worker demo#0 died (exit code 1) while running the batch after one retry on "
        "another worker; the worker is being restarted. Check the server log for why."
    )
    assert str(BatchTimeout(timeout_ms=2000, worker="demo#1")) == (
        "model batch ran past batch_timeout_ms=2000 on worker demo#1; the worker was killed "
        "and replaced. Raise batch_timeout_ms if the model is just slow."
    )
    assert str(BatchTimeout(timeout_ms=300, worker="demo", stage="waiting")) == (
        "no model worker of demo was alive to run the batch within batch_timeout_ms=300; "
        "its workers are restarting."
    )
    assert str(WorkerStartError(worker="demo#0", reason="OSError: no GPU")) == (
        "model worker demo#0 could not load its model: OSError: no GPU"
    )
    assert str(WorkerPoolClosed("demo")) == (
        "model worker pool 'demo' is closed and runs no more batches."
    )


def test_each_error_is_also_the_builtin_it_resembles() -> None:
    assert isinstance(WorkerDied(worker="w", exitcode=1), RuntimeError)
    assert isinstance(BatchTimeout(timeout_ms=1, worker="w"), TimeoutError)
    assert isinstance(WorkerStartError(worker="w", reason="r"), RuntimeError)
    closed = WorkerPoolClosed("demo", "was closed while the batch ran")
    assert isinstance(closed, BatcherClosed)
    assert isinstance(closed, RuntimeError)
    assert (closed.name, closed.reason) == ("demo", "was closed while the batch ran")
