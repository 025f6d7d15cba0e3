"""What every answer a request can end in says, and where it is counted: :func:`error_status`,
the one classification (the app, the access log, ``/metrics`` and gRPC all use it), and the
:class:`Recorder` through which every answer of every protocol is counted once, under its model
or its server. It only classifies and counts; the exceptions it names live in
:mod:`carpool.server.failures`."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from carpool.errors import (
    BatcherClosed,
    BatchSizeMismatch,
    BatchTimeout,
    DeadlineExceeded,
    QueueFull,
    SharedMemoryFull,
    WorkerDied,
)
from carpool.server.failures import (
    ControlUnavailable,
    LoadFailed,
    ModelNotFound,
    ModelOutputError,
    ModelUnavailable,
)
from carpool.server.messages import ProtocolError
from carpool.server.statuses import RETRY, STOPPING, HTTPError, Status
from carpool.stepwise import StepInputError

if TYPE_CHECKING:
    from carpool.server.lifecycle.registry import Registry, ServedModel

__all__ = ["Recorder", "error_status"]


def error_status(exc: BaseException) -> HTTPError:
    """Every exception a request can end in, as the status a client sees.

    Anything that is not an ``Exception`` (cancellation, ``KeyboardInterrupt``) is
    re-raised: it is not a request's outcome.
    """
    if isinstance(exc, HTTPError):
        return exc
    if isinstance(exc, ProtocolError):
        return HTTPError(exc.status, str(exc))
    if isinstance(exc, ModelNotFound):
        return HTTPError(Status.NOT_FOUND, str(exc))
    # a step-wise model refusing the request's row or parameter; a model that failed to load
    if isinstance(exc, StepInputError | ModelUnavailable | LoadFailed):
        return HTTPError(Status.BAD_REQUEST, str(exc))
    if isinstance(exc, ControlUnavailable):
        return HTTPError(Status.UNAVAILABLE, str(exc))
    if isinstance(exc, QueueFull | DeadlineExceeded | SharedMemoryFull):
        return HTTPError(Status.UNAVAILABLE, str(exc), RETRY)
    if isinstance(exc, BatcherClosed):
        return HTTPError(Status.UNAVAILABLE, STOPPING)
    if isinstance(exc, BatchTimeout):  # the model ran too long: a gateway timeout's kind
        return HTTPError(Status.GATEWAY_TIMEOUT, str(exc))
    if isinstance(exc, WorkerDied):
        return HTTPError(Status.INTERNAL_ERROR, str(exc))
    if isinstance(exc, BatchSizeMismatch | ModelOutputError):
        return HTTPError(Status.INTERNAL_ERROR, f"model error: {exc}")
    if isinstance(exc, Exception):  # the model's own exception, isolated to its rows
        return HTTPError(Status.INTERNAL_ERROR, f"model error: {type(exc).__name__}: {exc}")
    raise exc


class Recorder:
    """Where every answer of ``registry``'s server is counted, whatever protocol it came by:
    under its model when one is known, else the server's (``registry.server_counts``)."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    def record(
        self, protocol: str, status: int, served: ServedModel | None = None, seconds: float = 0.0
    ) -> None:
        """One answer that came by ``protocol`` (a label in ``/metrics``) and ended in
        ``status``; ``seconds`` count for a model's successes only, as Triton's do."""
        if served is None:
            self._registry.server_counts.record(protocol, status)
        else:
            served.record(protocol, status, seconds)

    def server(self, protocol: str) -> Callable[[int], None]:
        """What records the answers by ``protocol`` that no model counts (a refused key, a
        connection over the limit), given their status."""
        return partial(self.record, protocol)

    def named(self, protocol: str, status: int, name: str, version: str | None) -> None:
        """An answer to a request for model ``name`` that never reached the inference path
        (a gRPC call cancelled while held for its burst): under that model if it serves,
        else the server's, as the path counts it."""
        try:
            served = self._registry.get(name, version)
        except (ModelNotFound, ModelUnavailable):
            served = None
        self.record(protocol, status, served)
