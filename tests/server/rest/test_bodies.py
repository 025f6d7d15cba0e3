"""Request bodies: read from ASGI messages within the limit, inflated within it too.

The ASGI channel is driven directly with scripted messages; the same limits are checked end
to end over HTTP in ``test_error_responses.py``.
"""

from __future__ import annotations

import gzip
import zlib
from typing import Any

import pytest

from carpool.server.rest.asgi import Receive
from carpool.server.rest.bodies import decompress, read_body, request_headers
from carpool.server.statuses import HTTPError

LIMIT = 64


def script(*chunks: bytes, disconnect: bool = False) -> tuple[Receive, list[dict[str, Any]]]:
    """A ``receive`` that hands out ``chunks`` as one streamed body, and what it handed out."""
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
        for i, chunk in enumerate(chunks)
    ]
    if disconnect:
        messages[-1]["more_body"] = True
        messages.append({"type": "http.disconnect"})
    given: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        given.append(messages[len(given)])
        return given[-1]

    return receive, given


async def refused(
    headers: dict[bytes, bytes], *chunks: bytes, disconnect: bool = False
) -> HTTPError:
    receive, _ = script(*chunks, disconnect=disconnect)
    with pytest.raises(HTTPError) as info:
        await read_body(headers, receive, LIMIT)
    return info.value


async def test_a_body_in_one_message() -> None:
    receive, _ = script(b'{"inputs": []}')
    assert await read_body({}, receive, LIMIT) == b'{"inputs": []}'


async def test_a_streamed_body_is_joined_in_order() -> None:
    receive, given = script(b"ab", b"", b"cd", b"e")
    assert await read_body({}, receive, LIMIT) == b"abcde"
    assert len(given) == 4


async def test_a_body_at_the_limit_is_accepted() -> None:
    receive, _ = script(b"x" * (LIMIT - 1), b"y")
    assert await read_body({b"content-length": str(LIMIT).encode()}, receive, LIMIT) == (
        b"x" * (LIMIT - 1) + b"y"
    )


async def test_a_declared_length_over_the_limit_is_413_before_reading() -> None:
    receive, given = script(b"x")
    with pytest.raises(HTTPError) as info:
        await read_body({b"content-length": b"65"}, receive, LIMIT)
    assert info.value.status == 413
    assert info.value.message == (
        "request body of 65 bytes exceeds the limit of 64 bytes; "
        "raise --max-body-bytes or send smaller requests"
    )
    assert given == []


async def test_a_streamed_body_over_the_limit_is_413_as_soon_as_it_passes() -> None:
    error = await refused({}, b"x" * 40, b"y" * 40, b"z")
    assert error.status == 413
    assert "request body of 80 bytes exceeds the limit of 64 bytes" in error.message


async def test_a_client_that_leaves_mid_body_is_499() -> None:
    error = await refused({}, b"abc", disconnect=True)
    assert (error.status, error.message) == (
        499,
        "client disconnected before sending the whole body",
    )


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [(b"gzip", gzip.compress), (b"deflate", zlib.compress), (b" GZip ", gzip.compress)],
)
async def test_a_compressed_body_is_inflated(encoding: bytes, compress: Any) -> None:
    receive, _ = script(compress(b'{"inputs": []}'))
    body = await read_body({b"content-encoding": encoding}, receive, LIMIT)
    assert body == b'{"inputs": []}'


def test_identity_is_the_body_itself() -> None:
    assert decompress(b"{}", b"identity", LIMIT) == b"{}"


def test_a_bomb_is_stopped_at_the_limit_after_decompression() -> None:
    bomb = gzip.compress(b" " * (LIMIT * 1024))
    assert len(bomb) < LIMIT * 2
    with pytest.raises(HTTPError) as info:
        decompress(bomb, b"gzip", LIMIT)
    assert info.value.status == 413
    assert info.value.message.endswith(" (after decompression)")


def test_inflated_to_exactly_the_limit_is_accepted() -> None:
    assert decompress(zlib.compress(b"x" * LIMIT), b"deflate", LIMIT) == b"x" * LIMIT


@pytest.mark.parametrize(
    ("encoding", "content", "status", "message"),
    [
        (b"br", b"{}", 415, "Content-Encoding 'br' is not supported"),
        (b"\xff", b"{}", 415, "Content-Encoding '\ufffd' is not supported"),
        (b"gzip", b"not gzip at all", 400, "cannot decompress the gzip body"),
        (
            b"gzip",
            gzip.compress(b'{"inputs": []}', mtime=0)[:-4],
            400,
            "cannot decompress the gzip body",
        ),
        (b"deflate", zlib.compress(b"{") + b"trailing", 400, "cannot decompress the deflate"),
    ],
)
def test_bodies_that_cannot_be_inflated(
    encoding: bytes, content: bytes, status: int, message: str
) -> None:
    with pytest.raises(HTTPError) as info:
        decompress(content, encoding, LIMIT)
    assert info.value.status == status
    assert message in info.value.message


@pytest.mark.parametrize(
    "name", [b"content-encoding", b"content-type", b"inference-header-content-length"]
)
def test_a_header_that_says_how_to_read_the_body_may_come_only_once(name: bytes) -> None:
    twice = [(b"host", b"x"), (name, b"a"), (b"x-other", b"1"), (name, b"b")]
    with pytest.raises(HTTPError) as info:
        request_headers({"headers": twice})
    assert (info.value.status, info.value.message) == (
        400,
        f"the {name.decode()} header came more than once; send it once",
    )


def test_other_headers_may_repeat_and_the_usual_request_costs_no_count() -> None:
    pairs = [(b"accept", b"a"), (b"accept", b"b"), (b"content-type", b"application/json")]
    assert request_headers({"headers": pairs}) == {
        b"accept": b"b",
        b"content-type": b"application/json",
    }
