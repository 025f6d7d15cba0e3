"""Errors of process workers: a worker that died, a batch that ran too long, a model that
could not load, a pool that is closed; imports only :mod:`carpool.errors`.

They join the tree of :mod:`carpool.errors` (and will move there)::

    CarpoolError
    ├── WorkerDied (RuntimeError)         a model process died running the batch (twice)
    ├── BatchTimeout (TimeoutError)       the batch ran past batch_timeout_ms
    ├── WorkerStartError (RuntimeError)   no model process could load the model
    └── BatcherClosed (RuntimeError)
        └── WorkerPoolClosed              the process pool was closed

Each keeps its data as attributes and survives pickling (see ``CarpoolError.__reduce__``).
"""

from __future__ import annotations

from typing import Any

from carpool.errors import BatcherClosed, CarpoolError

__all__ = ["BatchTimeout", "WorkerDied", "WorkerPoolClosed", "WorkerStartError", "describe_exit"]


def describe_exit(exitcode: int) -> str:
    """``signal 9`` for a process killed by a signal (``multiprocessing``'s negative
    exit codes), ``exit code 1`` otherwise."""
    return f"signal {-exitcode}" if exitcode < 0 else f"exit code {exitcode}"


class WorkerDied(CarpoolError, RuntimeError):
    """The model process running the batch died (killed, segfault, ``os._exit``).

    ``worker`` is the process's name (``demo#1``), ``exitcode`` its exit code (negative: the
    signal that killed it), ``retried`` whether the batch had already been retried once on
    another process (so two processes died on it).
    """

    def __init__(self, *, worker: str, exitcode: int, retried: bool = False) -> None:
        self.worker = worker
        self.exitcode = exitcode
        self.retried = retried
        again = " after one retry on another worker" if retried else ""
        super().__init__(
            f"model worker {worker} died ({describe_exit(exitcode)}) while running the "
            f"batch{again}; the worker is being restarted. Check the server log for why."
        )

    def _fields(self) -> dict[str, Any]:
        return {"worker": self.worker, "exitcode": self.exitcode, "retried": self.retried}


class BatchTimeout(CarpoolError, TimeoutError):
    """The batch did not finish within ``batch_timeout_ms``.

    ``stage`` says where: ``"running"`` (its worker ran past the limit and was killed and
    replaced) or ``"waiting"`` (no worker was alive to take it within the limit).
    """

    def __init__(self, *, timeout_ms: float, worker: str, stage: str = "running") -> None:
        self.timeout_ms = timeout_ms
        self.worker = worker
        self.stage = stage
        if stage == "running":
            message = (
                f"model batch ran past batch_timeout_ms={timeout_ms:g} on worker {worker}; "
                "the worker was killed and replaced. Raise batch_timeout_ms if the model "
                "is just slow."
            )
        else:
            message = (
                f"no model worker of {worker} was alive to run the batch within "
                f"batch_timeout_ms={timeout_ms:g}; its workers are restarting."
            )
        super().__init__(message)

    def _fields(self) -> dict[str, Any]:
        return {"timeout_ms": self.timeout_ms, "worker": self.worker, "stage": self.stage}


class WorkerStartError(CarpoolError, RuntimeError):
    """A model process could not load (or warm up) its model; ``reason`` is the error it
    reported, e.g. ``"ModuleNotFoundError: No module named 'mymodel'"``."""

    def __init__(self, *, worker: str, reason: str) -> None:
        self.worker = worker
        self.reason = reason
        super().__init__(f"model worker {worker} could not load its model: {reason}")

    def _fields(self) -> dict[str, Any]:
        return {"worker": self.worker, "reason": self.reason}


class WorkerPoolClosed(BatcherClosed):
    """The process pool was closed (or never started) and runs no more batches; a
    :class:`carpool.errors.BatcherClosed`, so it is answered the same way."""

    def __init__(self, name: str, reason: str = "is closed") -> None:
        self.name = name
        self.reason = reason
        RuntimeError.__init__(
            self, f"model worker pool {name!r} {reason} and runs no more batches."
        )
