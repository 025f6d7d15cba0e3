"""THE table from exceptions to HTTP statuses, and :class:`HTTPError`, an answer other than 200.

Every status a request can end in is decided by :func:`error_status`, and only there: the app
sends what it returns, the access log and ``/metrics`` count what it says. gRPC answers the
same classification under its own names (:func:`grpc_code`), so the two protocols cannot
disagree. Pure: it only classifies, and must not import the app, grpc or anything that sends.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from carpool.errors import (
    BatcherClosed,
    BatchSizeMismatch,
    BatchTimeout,
    CarpoolError,
    DeadlineExceeded,
    QueueFull,
    WorkerDied,
)
from carpool.server.inference import ModelOutputError
from carpool.server.messages import ProtocolError
from carpool.server.registry import ModelNotFound, ModelUnavailable

__all__ = ["CLIENT_CLOSED", "STOPPING", "HTTPError", "error_status", "grpc_code"]

CLIENT_CLOSED = 499  # nginx's status for a client that closed the connection first
STOPPING = "Server is stopping, scheduler for model has stopped accepting new inference requests"
_RETRY = [(b"retry-after", b"1")]  # a full queue or a missed deadline may pass in a second

# error_status's HTTP statuses as gRPC status codes (``grpc.StatusCode`` names: this module
# must not import grpc), as the KServe v2 gRPC spec pairs them.
_GRPC_CODES = {
    200: "OK",
    400: "INVALID_ARGUMENT",  # a malformed request, a sequence_* parameter, a failed model
    404: "NOT_FOUND",  # an unknown model or version
    405: "UNIMPLEMENTED",
    413: "RESOURCE_EXHAUSTED",  # over a size limit: what grpc itself says of a large message
    415: "INVALID_ARGUMENT",
    CLIENT_CLOSED: "CANCELLED",
    500: "INTERNAL",  # a model error, a worker that died
    503: "UNAVAILABLE",  # queue full, overloaded, queue timeout, stopping
    504: "DEADLINE_EXCEEDED",  # the batch ran past batch_timeout_ms
}


class HTTPError(CarpoolError):
    """An answer other than 200: its status, the message for the ``error`` body, and headers.

    Raised inside the app to unwind to the one place that answers (a 404 route, a 405
    method, a 413 body); not also a builtin, since its status, not its type, says what
    went wrong.
    """

    def __init__(
        self, status: int, message: str, headers: Sequence[tuple[bytes, bytes]] = ()
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = list(headers)

    def _fields(self) -> dict[str, Any]:
        return {"status": self.status, "message": self.message, "headers": self.headers}


def error_status(exc: BaseException) -> HTTPError:
    """THE table: every exception a request can end in, as the status a client sees.

    Anything that is not an ``Exception`` (cancellation, ``KeyboardInterrupt``) is
    re-raised: it is not a request's outcome.
    """
    if isinstance(exc, HTTPError):
        return exc
    if isinstance(exc, ProtocolError):
        return HTTPError(exc.status, str(exc))
    if isinstance(exc, ModelNotFound):
        return HTTPError(404, str(exc))
    if isinstance(exc, ModelUnavailable):
        return HTTPError(400, str(exc))
    if isinstance(exc, QueueFull | DeadlineExceeded):
        return HTTPError(503, str(exc), _RETRY)
    if isinstance(exc, BatcherClosed):
        return HTTPError(503, STOPPING)
    if isinstance(exc, BatchTimeout):  # the model ran too long: a gateway timeout's kind
        return HTTPError(504, str(exc))
    if isinstance(exc, WorkerDied):
        return HTTPError(500, str(exc))
    if isinstance(exc, BatchSizeMismatch | ModelOutputError):
        return HTTPError(500, f"model error: {exc}")
    if isinstance(exc, Exception):  # the model's own exception, isolated to its rows
        return HTTPError(500, f"model error: {type(exc).__name__}: {exc}")
    raise exc


def grpc_code(status: int) -> str:
    """The ``grpc.StatusCode`` name for an HTTP ``status`` :func:`error_status` gave."""
    code = _GRPC_CODES.get(status)
    if code is None:
        return "INTERNAL" if status >= 500 else "INVALID_ARGUMENT"
    return code
