"""The instant v2 server's protocol (``carpool.bench.instant``), fed bytes as a socket would
deliver them: canned answers in order, bodies skipped even when split across reads,
keep-alive and close as HTTP/1.1 and 1.0 say, and refusals that close the connection."""

from __future__ import annotations

import json

import pytest

from carpool.bench.instant import InstantProtocol


class Transport:
    """What the protocol writes, and whether it closed the connection."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def close(self) -> None:
        self.closed = True


def connect() -> tuple[InstantProtocol, Transport]:
    protocol, transport = InstantProtocol(), Transport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    return protocol, transport


def responses(data: bytes) -> list[tuple[str, dict[str, str], bytes]]:
    """Status line, headers and body of each response in ``data``."""
    out = []
    while data:
        head, _, data = data.partition(b"\r\n\r\n")
        status, *lines = head.decode().split("\r\n")
        headers = dict(line.split(": ", 1) for line in lines)
        length = int(headers["Content-Length"])
        out.append((status, headers, data[:length]))
        data = data[length:]
    return out


INFER = b'POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 11\r\n\r\n{"inputs":}'


def test_pipelined_requests_are_answered_in_order_in_one_write() -> None:
    protocol, transport = connect()
    protocol.data_received(INFER + b"GET /v2/models/m HTTP/1.1\r\n\r\n" + INFER)
    assert len(transport.written) == 1
    answers = responses(transport.written[0])
    assert [status for status, _, _ in answers] == ["HTTP/1.1 200 OK"] * 3
    assert all(h["Connection"] == "keep-alive" for _, h, _ in answers)
    infer, metadata, _ = (json.loads(body) for _, _, body in answers)
    assert infer["outputs"][0]["shape"] == [1, 8]
    assert metadata["name"] == "m"
    assert metadata["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 256]}]
    assert not transport.closed


def test_a_body_split_across_reads_is_skipped() -> None:
    protocol, transport = connect()
    protocol.data_received(INFER[:-5])
    assert [status for status, _, _ in responses(b"".join(transport.written))] == [
        "HTTP/1.1 200 OK"
    ]
    protocol.data_received(INFER[-5:] + b"GET /v2/health/rea")
    assert len(transport.written) == 1  # the rest of the body, and half a head: nothing yet
    protocol.data_received(b"dy HTTP/1.1\r\n\r\n")
    (ready,) = responses(transport.written[1])
    assert ready[2] == b'{"ready":true}'


@pytest.mark.parametrize(
    ("path", "status", "body"),
    [
        ("/v2/health/live", "200 OK", b'{"live":true}'),
        ("/v2", "200 OK", b'{"name":"instant","version":"1","extensions":[]}'),
        ("/v2/models/m/ready", "200 OK", b'{"name": "m", "ready": true}'),
        ("/v2/models/m/versions/1?x=1", "200 OK", None),
        ("/v2/models/", "404 Not Found", b'{"error":"not found"}'),
        ("/metrics", "404 Not Found", b'{"error":"not found"}'),
    ],
)
def test_get_endpoints(path: str, status: str, body: bytes | None) -> None:
    protocol, transport = connect()
    protocol.data_received(f"GET {path} HTTP/1.1\r\nHost: h\r\n\r\n".encode())
    ((line, _, got),) = responses(transport.written[0])
    assert line == f"HTTP/1.1 {status}"
    if body is not None:
        assert got == body
    else:
        assert json.loads(got)["name"] == "m"


def test_connection_close_and_http_1_0_close_after_the_answer() -> None:
    for request in (
        b"GET /v2 HTTP/1.1\r\nConnection: close\r\n\r\nGET /v2 HTTP/1.1\r\n\r\n",
        b"GET /v2 HTTP/1.0\r\n\r\nGET /v2 HTTP/1.1\r\n\r\n",
    ):
        protocol, transport = connect()
        protocol.data_received(request)
        ((status, headers, _),) = responses(transport.written[0])  # the second is not read
        assert (status, headers["Connection"], transport.closed) == (
            "HTTP/1.1 200 OK",
            "close",
            True,
        )
    protocol, transport = connect()
    protocol.data_received(b"GET /v2 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    ((_, headers, _),) = responses(transport.written[0])
    assert (headers["Connection"], transport.closed) == ("keep-alive", False)


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"NONSENSE\r\n\r\n", "400 Bad Request"),
        (
            b"POST /v2/models/m/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            "501 Not Implemented",
        ),
        (b"GET /" + b"x" * (64 * 1024 + 1), "431 Request Header Fields Too Large"),
    ],
)
def test_refusals_close_the_connection(data: bytes, status: str) -> None:
    protocol, transport = connect()
    protocol.data_received(INFER + data)
    answers = responses(b"".join(transport.written))
    assert [s for s, _, _ in answers] == ["HTTP/1.1 200 OK", f"HTTP/1.1 {status}"]
    assert answers[1][1]["Connection"] == "close"
    assert transport.closed


def test_nothing_is_written_after_the_connection_is_lost() -> None:
    protocol, transport = connect()
    protocol.connection_lost(None)
    protocol.data_received(INFER)
    assert transport.written == []
