"""The table of statuses: their names, what gRPC, /metrics and OpenAI call each, and
``HTTPError``."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest

from carpool.errors import CarpoolError
from carpool.server.statuses import (
    HTTPError,
    Status,
    grpc_code,
    is_server_error,
    openai_code,
    openai_type,
    outcome,
)


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (Status.OK, "OK"),
        (Status.BAD_REQUEST, "INVALID_ARGUMENT"),
        (Status.NOT_FOUND, "NOT_FOUND"),
        (Status.CONTENT_TOO_LARGE, "RESOURCE_EXHAUSTED"),
        (Status.CLIENT_CLOSED, "CANCELLED"),
        (Status.INTERNAL_ERROR, "INTERNAL"),
        (Status.UNAVAILABLE, "UNAVAILABLE"),
        (Status.GATEWAY_TIMEOUT, "DEADLINE_EXCEEDED"),
        (Status.REQUEST_TIMEOUT, "INVALID_ARGUMENT"),  # unnamed: a client's error
        (Status.UNAUTHORIZED, "INVALID_ARGUMENT"),
        (502, "INTERNAL"),  # unnamed: a server's error
    ],
)
def test_every_status_has_a_grpc_code(status: int, code: str) -> None:
    assert grpc_code(status) == code


def test_metrics_and_openai_name_statuses_by_the_table() -> None:
    assert (outcome(Status.OK), outcome(Status.CLIENT_CLOSED), outcome(418)) == (
        "success",
        "client_closed",
        "418",
    )
    assert (openai_code(Status.CONTENT_TOO_LARGE), openai_code(418)) == ("request_too_large", None)
    assert (openai_type(Status.NOT_FOUND), openai_type(Status.UNAVAILABLE)) == (
        "invalid_request_error",
        "server_error",
    )
    assert not is_server_error(Status.CLIENT_CLOSED)
    assert is_server_error(Status.GATEWAY_TIMEOUT)


def test_statuses_are_the_numbers_on_the_wire() -> None:
    assert (Status.NOT_FOUND == 404, str(Status.UNAVAILABLE), f"{Status.CLIENT_CLOSED}") == (
        True,
        "503",
        "499",
    )


def test_http_error_is_a_carpool_error_with_status_message_and_headers() -> None:
    error = HTTPError(413, "too large")
    assert isinstance(error, CarpoolError)
    assert (error.status, error.message, error.headers, str(error)) == (
        413,
        "too large",
        [],
        "too large",
    )


@pytest.mark.parametrize(
    "clone", [lambda e: pickle.loads(pickle.dumps(e)), copy.copy, copy.deepcopy]
)
def test_http_error_survives_pickling_and_copying(clone: Any) -> None:
    error = HTTPError(405, "Method Not Allowed", [(b"allow", b"POST")])
    again = clone(error)
    assert type(again) is HTTPError
    assert (again.status, again.message, again.headers, str(again)) == (
        405,
        "Method Not Allowed",
        [(b"allow", b"POST")],
        "Method Not Allowed",
    )
