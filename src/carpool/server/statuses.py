"""THE table of statuses: every HTTP status this server answers with, by name, with its gRPC,
``/metrics`` and OpenAI names; and :class:`HTTPError`. Every other module names a status
through :class:`Status`, never a number. Imports nothing of the server, nor grpc."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

from carpool.errors import CarpoolError

__all__ = [
    "RETRY",
    "STOPPING",
    "HTTPError",
    "Status",
    "grpc_code",
    "is_server_error",
    "openai_code",
    "openai_type",
    "outcome",
]


class Status(enum.IntEnum):
    """The HTTP statuses a request can end in (``int``s: they go on the wire as they are)."""

    OK = 200
    BAD_REQUEST = 400  # a malformed request, a sequence_* parameter, a failed model
    UNAUTHORIZED = 401  # no API key, or not one of the server's
    NOT_FOUND = 404  # an unknown route, model or version
    METHOD_NOT_ALLOWED = 405
    REQUEST_TIMEOUT = 408  # the headers or the body did not arrive in time
    CONTENT_TOO_LARGE = 413  # a body or element count over its limit
    UNSUPPORTED_MEDIA_TYPE = 415  # a Content-Encoding other than gzip or deflate
    CLIENT_CLOSED = 499  # nginx's status for a client that closed the connection first
    INTERNAL_ERROR = 500  # a model error, a worker that died
    UNAVAILABLE = 503  # queue full, overloaded, queue timeout, stopping, not ready
    GATEWAY_TIMEOUT = 504  # the batch ran past batch_timeout_ms; a gRPC call's deadline


STOPPING = "Server is stopping, scheduler for model has stopped accepting new inference requests"
RETRY = [(b"retry-after", b"1")]  # a full queue or a missed deadline may pass in a second

# The statuses as gRPC status codes (``grpc.StatusCode`` names: this module must not import
# grpc), as the KServe v2 gRPC spec pairs them.
_GRPC_CODES: dict[int, str] = {
    Status.OK: "OK",
    Status.BAD_REQUEST: "INVALID_ARGUMENT",
    Status.NOT_FOUND: "NOT_FOUND",
    Status.METHOD_NOT_ALLOWED: "UNIMPLEMENTED",
    Status.CONTENT_TOO_LARGE: "RESOURCE_EXHAUSTED",  # what grpc itself says of a large message
    Status.UNSUPPORTED_MEDIA_TYPE: "INVALID_ARGUMENT",
    Status.CLIENT_CLOSED: "CANCELLED",
    Status.INTERNAL_ERROR: "INTERNAL",
    Status.UNAVAILABLE: "UNAVAILABLE",
    Status.GATEWAY_TIMEOUT: "DEADLINE_EXCEEDED",
}
# The ``outcome`` label of ``carpool_requests_total`` in /metrics.
_OUTCOMES: dict[int, str] = {
    Status.OK: "success",
    Status.BAD_REQUEST: "invalid",
    Status.UNAUTHORIZED: "unauthorized",
    Status.NOT_FOUND: "not_found",
    Status.METHOD_NOT_ALLOWED: "method_not_allowed",
    Status.REQUEST_TIMEOUT: "request_timeout",
    Status.CONTENT_TOO_LARGE: "too_large",
    Status.UNSUPPORTED_MEDIA_TYPE: "unsupported_encoding",
    Status.CLIENT_CLOSED: "client_closed",
    Status.INTERNAL_ERROR: "error",
    Status.UNAVAILABLE: "unavailable",
    Status.GATEWAY_TIMEOUT: "timeout",
}
# OpenAI's error codes for the refusals that are not its own (``OpenAIError``'s), by status.
_OPENAI_CODES: dict[int, str] = {
    Status.BAD_REQUEST: "invalid_request",
    Status.UNAUTHORIZED: "invalid_api_key",  # OpenAI's own code for a missing or wrong key
    Status.NOT_FOUND: "not_found",
    Status.METHOD_NOT_ALLOWED: "method_not_allowed",
    Status.CONTENT_TOO_LARGE: "request_too_large",
    Status.UNSUPPORTED_MEDIA_TYPE: "unsupported_encoding",
    Status.INTERNAL_ERROR: "model_error",
    Status.UNAVAILABLE: "unavailable",
    Status.GATEWAY_TIMEOUT: "timeout",
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


def is_server_error(status: int) -> bool:
    """A 5xx: the server's failure, not the client's (logged; OpenAI's ``server_error``)."""
    return status >= Status.INTERNAL_ERROR


def grpc_code(status: int) -> str:
    """The ``grpc.StatusCode`` name for an HTTP ``status``."""
    code = _GRPC_CODES.get(status)
    if code is None:
        return "INTERNAL" if is_server_error(status) else "INVALID_ARGUMENT"
    return code


def outcome(status: int) -> str:
    """The ``outcome`` label ``/metrics`` counts a request that ended in ``status`` under."""
    return _OUTCOMES.get(status, str(status))


def openai_code(status: int) -> str | None:
    """OpenAI's error ``code`` for a refusal of ``status`` that OpenAI's API has no own
    code for; None for a status it does not name."""
    return _OPENAI_CODES.get(status)


def openai_type(status: int) -> str:
    """OpenAI's error ``type``: the server's fault or the request's."""
    return "server_error" if is_server_error(status) else "invalid_request_error"
