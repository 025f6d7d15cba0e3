"""The HTTP layer under abuse, over raw sockets: malformed request lines, huge and duplicated
headers, bad chunked encoding, lying Content-Lengths, pipelining, bodies cut off, NUL bytes,
invalid UTF-8, absurd methods; then a seeded loop of mutated requests.

For every case the server answers with a 4xx (or a 200 where the request is in fact fine)
or closes the connection: never a 5xx, never a hang (every read has a timeout), and
``/v2/health/live`` answers 200 afterwards. At the end its log holds no traceback.
"""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Iterator

import pytest

from server.conftest import Launcher, Server

BODY_LIMIT = 65536
READ_S = 10.0  # a response the server owes arrives well within this, even on a busy machine
MUTANTS = 400  # mutated requests in the random loop
MUTANT_READ_S = 0.3  # then the client closes its side (the server may wait for more body)
SEED = 20241124
INFER = b"/v2/models/identity/infer"
BODY = b'{"inputs":[{"name":"INPUT0","shape":[1,2],"datatype":"FP32","data":[1,2]}]}'


@pytest.fixture(scope="module")
def server(serve_module: Launcher) -> Iterator[Server]:
    server = serve_module("models:identity", "--max-body-bytes", str(BODY_LIMIT))
    yield server
    log = server.stderr()
    assert "Traceback" not in log, log
    assert "Exception in ASGI application" not in log, log


def post(path: bytes, body: bytes, *extra: bytes, length: bytes | None = None) -> bytes:
    """A POST with ``body``; ``length``: the Content-Length to claim (default: the truth)."""
    head = [b"POST " + path + b" HTTP/1.1", b"Host: x", b"Content-Type: application/json"]
    head += [b"Content-Length: " + (b"%d" % len(body) if length is None else length), *extra]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def chunked(*chunks: bytes, extra: bytes = b"") -> bytes:
    """A chunked POST of ``BODY``'s infer request whose body is exactly ``chunks``."""
    head = b"POST %s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n%s\r\n" % (INFER, extra)
    return head + b"".join(chunks)


def get(path: bytes, *extra: bytes) -> bytes:
    return b"\r\n".join([b"GET " + path + b" HTTP/1.1", b"Host: x", *extra]) + b"\r\n\r\n"


class Reply:
    """What came back on one connection: the statuses of the complete responses, in order,
    and whether the server closed the connection."""

    def __init__(self, statuses: list[int], closed: bool, rest: bytes) -> None:
        self.statuses = statuses
        self.closed = closed
        self.rest = rest  # bytes of an incomplete response, if any


def _responses(buffer: bytes) -> tuple[list[int], bytes]:
    # Complete responses at the front of ``buffer`` (every one carries Content-Length).
    statuses = []
    while b"\r\n\r\n" in buffer:
        head, _, after = buffer.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        fields = dict(line.lower().split(b": ", 1) for line in lines[1:] if b": " in line)
        length = int(fields.get(b"content-length", b"0"))
        if len(after) < length:
            break
        statuses.append(int(lines[0].split()[1]))
        buffer = after[length:]
    return statuses, buffer


def exchange(
    raw: bytes | list[bytes], *, expect: int = 1, close: bool = False, patience: float | None = None
) -> Reply:
    """Send ``raw`` (pieces one by one) and read until ``expect`` responses came or the
    server closed. With ``close`` the client shuts its side at once (a body cut off); with
    ``patience``, after that many seconds without the responses (the server may be waiting
    for more body). Waiting READ_S more for an answer or a close fails the test: a hang."""
    with socket.create_connection(("127.0.0.1", PORT[0]), timeout=READ_S) as sock:
        for piece in raw if isinstance(raw, list) else [raw]:
            sock.sendall(piece)
        if close:
            sock.shutdown(socket.SHUT_WR)
        buffer = b""
        deadline = time.monotonic() + (READ_S if patience is None else patience)
        while True:
            statuses, rest = _responses(buffer)
            if len(statuses) >= expect:
                return Reply(statuses, False, rest)
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                if close:
                    pytest.fail(f"no answer and no close within {READ_S}s to {raw!r:.300}")
                sock.shutdown(socket.SHUT_WR)
                close, deadline = True, time.monotonic() + READ_S
                continue
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return Reply(statuses, True, rest)
            buffer += chunk


PORT: list[int] = []  # the module's server, for exchange()


@pytest.fixture(autouse=True)
def live_after(server: Server) -> Iterator[None]:
    PORT[:] = [server.port]
    yield
    assert server.is_live()


# -- deterministic cases -------------------------------------------------------------------
# (request, the statuses of the responses that come back in order). uvicorn answers what
# its parser refuses with a plain-text 400 and closes; the app answers the rest.

NUL = b"\x00"
CASES = {
    # request lines
    "garbage line": (b"GARBAGE\r\n\r\n", (400,)),
    "no path": (b"GET\r\n\r\n", (400,)),
    "no version": (b"GET /v2/health/live\r\n\r\n", (200,)),  # read as HTTP/0.9
    "http 9.9": (b"GET /v2/health/live HTTP/9.9\r\nHost: x\r\n\r\n", (400,)),
    "http 1.0 no host": (b"GET /v2/health/live HTTP/1.0\r\n\r\n", (200,)),
    "http 1.1 no host": (b"GET /v2/health/live HTTP/1.1\r\n\r\n", (200,)),
    "space in path": (b"GET /v2/health /live HTTP/1.1\r\nHost: x\r\n\r\n", (400,)),
    "absolute uri": (b"GET http://x/v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n", (200,)),
    "asterisk": (b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", (404,)),
    "long path": (get(b"/v2/" + b"a" * 60000), (404,)),
    "bare LF": (b"GET /v2/health/live HTTP/1.1\nHost: x\n\n", (400,)),
    # methods
    "lower-case method": (b"get /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n", (400,)),
    "unknown method": (b"FROB /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n", (400,)),
    "huge method": (b"X" * 5000 + b" /v2 HTTP/1.1\r\nHost: x\r\n\r\n", (400,)),
    "DELETE": (b"DELETE /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n", (405,)),
    "CONNECT": (b"CONNECT x:80 HTTP/1.1\r\nHost: x\r\n\r\n", (400,)),
    # headers
    "huge header": (get(b"/v2/health/live", b"X-Big: " + b"a" * 200_000), (200,)),
    "many headers": (get(b"/v2/health/live", *[b"X-%d: 1" % i for i in range(5000)]), (200,)),
    "no colon": (get(b"/v2/health/live", b"NoColonHere"), (400,)),
    "space before colon": (get(b"/v2/health/live", b"X-A : 1"), (400,)),
    "obsolete folding": (get(b"/v2/health/live", b"X-A: 1", b" folded"), (400,)),
    "two content-lengths": (post(INFER, BODY, b"Content-Length: 3"), (400,)),
    "two header lengths": (
        post(
            INFER,
            BODY,
            b"Inference-Header-Content-Length: 5",
            b"Inference-Header-Content-Length: 7",
        ),
        (400,),
    ),
    "two content-types": (post(INFER, BODY, b"Content-Type: text/plain"), (400,)),  # one only
    "NUL in header value": (get(b"/v2/health/live", b"X-A: a" + NUL + b"b"), (400,)),
    "NUL in header name": (get(b"/v2/health/live", b"X-" + NUL + b": 1"), (400,)),
    "non-latin header": (get(b"/v2/health/live", "X-A: ü€".encode()), (200,)),
    # paths
    "NUL in path": (get(b"/v2/models/" + NUL + b"/ready"), (400,)),
    "encoded NUL in path": (get(b"/v2/models/%00/ready"), (404,)),
    "invalid utf-8 in path": (get(b"/v2/models/\xff\xfe/ready"), (400,)),
    "encoded invalid utf-8": (get(b"/v2/models/%ff%fe/ready"), (404,)),
    "dot segments": (get(b"/v2/models/../../etc/passwd"), (404,)),
    "encoded slash": (get(b"/v2/models/a%2Fb/ready"), (404,)),
    "query and fragment": (get(b"/v2/health/live?x=%zz&&=#frag"), (200,)),
    # bodies
    "length under body": (post(INFER, BODY, length=b"50"), (400,)),  # then the rest is garbage
    "negative length": (post(INFER, BODY, length=b"-1"), (400,)),
    "length not a number": (post(INFER, BODY, length=b"7x"), (400,)),
    "length 2**70": (post(INFER, BODY, length=b"%d" % 2**70), (400,)),
    "length over the limit": (post(INFER, BODY, length=b"%d" % (BODY_LIMIT + 1)), (413,)),
    # chunked bodies
    "chunked": (chunked(b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)), (200,)),
    "chunk size not hex": (chunked(b"zz\r\n%s\r\n0\r\n\r\n" % BODY), (400,)),
    "chunk size huge": (chunked(b"ffffffffffffffffffff\r\nab\r\n0\r\n\r\n"), (400,)),
    "chunk longer than said": (chunked(b"2\r\n%s\r\n0\r\n\r\n" % BODY), (400,)),
    "chunk extension": (chunked(b"%x;a=b\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)), (200,)),
    "chunked and a length": (
        chunked(b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY), extra=b"Content-Length: 5\r\n"),
        (400,),
    ),
    "chunked twice": (
        chunked(b"0\r\n\r\n", extra=b"Transfer-Encoding: chunked\r\n"),
        (400,),
    ),
    "unknown transfer coding": (
        post(INFER, BODY).replace(b"Content-Length", b"Transfer-Encoding: gzip\r\nX"),
        (400,),
    ),
    "NUL in body": (post(INFER, BODY.replace(b"1,2]", b"1,\x002]")), (400,)),
    "invalid utf-8 in body": (post(INFER, BODY.replace(b"INPUT0", b"INPUT\xff")), (400,)),
    "body on a GET": (get(b"/v2/health/live", b"Content-Length: 5") + b"hello", (200,)),
    "expect 100": (post(INFER, BODY, b"Expect: 100-continue"), (100, 200)),
}


@pytest.mark.parametrize(("raw", "statuses"), list(CASES.values()), ids=list(CASES))
def test_malformed_requests_get_4xx_or_a_close(raw: bytes, statuses: tuple[int, ...]) -> None:
    reply = exchange(raw, expect=len(statuses))
    assert tuple(reply.statuses) == statuses, reply.rest[:300]


def test_head_gets_405_without_a_body() -> None:
    reply = exchange(b"HEAD /v2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", expect=2)
    assert reply.closed
    assert reply.rest.startswith(b"HTTP/1.1 405 ")
    assert reply.rest.endswith(b"\r\n\r\n")


def test_pipelined_requests_are_answered_in_order() -> None:
    requests = [get(b"/v2/health/live"), post(INFER, BODY), get(b"/v2/nowhere"),
                post(INFER, b"{"), get(b"/v2/health/ready")]  # fmt: skip
    reply = exchange(b"".join(requests), expect=len(requests))
    assert reply.statuses == [200, 200, 404, 400, 200]


@pytest.mark.parametrize("cut", [1, len(BODY) // 2, len(BODY) - 1])
def test_a_body_cut_off_midway_leaves_the_server_serving(cut: int) -> None:
    reply = exchange(post(INFER, BODY)[: -len(BODY) + cut], expect=1, close=True)
    assert (reply.statuses, reply.closed) == ([], True)
    assert exchange(post(INFER, BODY)).statuses == [200]


def test_a_chunked_body_cut_off_leaves_the_server_serving() -> None:
    reply = exchange(chunked(b"%x\r\n%s" % (len(BODY), BODY[:10])), expect=1, close=True)
    assert (reply.statuses, reply.closed) == ([], True)


# -- a seeded random mutation loop ---------------------------------------------------------

SEEDS = [get(b"/v2/health/ready"), post(INFER, BODY), get(b"/v2/models/identity/config"),
         chunked(b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)),
         post(b"/v2/repository/index", b'{"ready":true}')]  # fmt: skip
TOKENS = [b"\x00", b"\xff", b"\r\n", b"\n", b"\r", b" ", b":", b"%", b"%00", b"/..", b"\t",
          b"Content-Length: 9999\r\n", b"Transfer-Encoding: chunked\r\n", b"HTTP/1.1",
          b"Inference-Header-Content-Length: 3\r\n", b"-1", b"9" * 30, "é".encode()]  # fmt: skip


def mutate(rng: random.Random, raw: bytes) -> bytes:
    """One to four edits: flip a byte, insert a nasty token, delete or repeat a span."""
    data = bytearray(raw)
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(data) + 1)
        kind = rng.randrange(4)
        if kind == 0 and at < len(data):
            data[at] = rng.randrange(256)
        elif kind == 1:
            data[at:at] = rng.choice(TOKENS)
        elif kind == 2:
            del data[at : at + rng.randint(1, 16)]
        else:
            data[at:at] = data[at : at + rng.randint(1, 64)]
    return bytes(data)


@pytest.mark.slow
def test_mutated_requests_never_get_a_5xx_or_hang(server: Server) -> None:
    rng = random.Random(SEED)
    outcomes: dict[str, int] = {}
    for index in range(MUTANTS):
        raw = mutate(rng, rng.choice(SEEDS))
        reply = exchange(raw, patience=MUTANT_READ_S)
        assert all(status < 500 for status in reply.statuses), (index, raw)
        key = str(reply.statuses[0]) if reply.statuses else "closed"
        outcomes[key] = outcomes.get(key, 0) + 1
        if index % 20 == 0:
            assert server.is_live()
    assert sum(outcomes.values()) == MUTANTS
    assert "500" not in outcomes
