"""Which status every exception a request can end in answers with: :func:`error_status`, the one
classification. The app sends it, the access log and ``/metrics`` count it and gRPC names it,
so no two protocols can disagree; each answer is counted once, under its model or its server.
Pure."""

from __future__ import annotations

from carpool.errors import (
    BatcherClosed,
    BatchSizeMismatch,
    BatchTimeout,
    DeadlineExceeded,
    QueueFull,
    SharedMemoryFull,
    WorkerDied,
)
from carpool.server.inference.admission import ModelOutputError
from carpool.server.lifecycle.control import ControlUnavailable, LoadFailed
from carpool.server.lifecycle.registry import ModelNotFound, ModelUnavailable
from carpool.server.messages import ProtocolError
from carpool.server.statuses import RETRY, STOPPING, HTTPError, Status

__all__ = ["error_status"]


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
    if isinstance(exc, ModelUnavailable | LoadFailed):
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
