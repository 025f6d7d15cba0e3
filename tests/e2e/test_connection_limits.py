"""Connection limits and timeouts over raw sockets: connections that never finish their
headers (or trickle them) are closed within ``--header-timeout``, a body that stalls gets a
408 within ``--body-timeout`` and a close, and past ``--limit-concurrency`` connections a
request gets a JSON 503 while the others are held in a gated model. The server stays live.

Timeouts are set short (0.5 s) so that the tests are quick; every wait for the server to act
is bounded well above them (``CLOSED_WITHIN_S``), and only what the server sent decides.
"""

from __future__ import annotations

import asyncio
import json
import resource
import select
import socket
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from server.conftest import Launcher, Server, float_request, wait_until

TIMEOUT_S = 0.5
CLOSED_WITHIN_S = 10.0  # far above the timeouts: a server that never closes fails here
HALF_A_HEAD = b"POST /v2/models/add_one/infer HTTP/1.1\r\nHost: carpool\r\nContent-Le"


@pytest.fixture(scope="module")
def server(serve_module: Launcher) -> Server:
    timeouts = ["--header-timeout", str(TIMEOUT_S), "--body-timeout", str(TIMEOUT_S)]
    return serve_module("models:add_one", *timeouts, access_log=True)


def connect(server: Server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=CLOSED_WITHIN_S)
    sock.settimeout(CLOSED_WITHIN_S)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes; a socket timeout (the server never
    closed) fails the test."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def split_response(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines)
    return int(status_line.split()[1]), headers, body


def test_60_connections_that_never_finish_their_headers_are_closed(server: Server) -> None:
    """Half of them send nothing (closed silently), half send half a request head (a 408,
    then closed); all within the header timeout, where before they stayed open."""
    sockets = [connect(server) for _ in range(60)]
    for sock in sockets[30:]:
        sock.sendall(HALF_A_HEAD)
    opened = time.monotonic()
    answers = [read_until_closed(sock) for sock in sockets]
    took = time.monotonic() - opened
    for sock in sockets:
        sock.close()
    assert answers[:30] == [b""] * 30
    for answer in answers[30:]:
        status, headers, body = split_response(answer)
        assert (status, headers["connection"]) == (408, "close")
        assert json.loads(body) == {
            "error": "the request headers did not arrive in time; raise --header-timeout"
        }
    assert took < CLOSED_WITHIN_S
    assert server.is_live()


def test_headers_trickled_a_byte_at_a_time_are_cut_off(server: Server) -> None:
    """A slowloris: data keeps arriving, but the timer runs from the request's first byte."""
    with connect(server) as sock:
        answer = b""
        for byte in (HALF_A_HEAD * 100)[: int(CLOSED_WITHIN_S / 0.05)]:
            sock.sendall(bytes([byte]))
            if select.select([sock], [], [], 0.05)[0]:
                answer = read_until_closed(sock)
                break
        else:
            pytest.fail("the server let the headers trickle in for 10 s")
    assert split_response(answer)[0] == 408
    assert server.is_live()


def test_a_body_that_stalls_gets_408_and_a_close(server: Server) -> None:
    body = json.dumps(float_request(1.0)).encode()
    head = (
        b"POST /v2/models/add_one/infer HTTP/1.1\r\nHost: carpool\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    with connect(server) as sock:
        sock.sendall(head + body[:10])  # the rest never comes
        status, headers, answer = split_response(read_until_closed(sock))
    assert (status, headers["connection"]) == (408, "close")
    assert json.loads(answer) == {
        "error": f"the request body did not arrive within {TIMEOUT_S:g} s; send it faster, "
        "or raise --body-timeout"
    }
    assert "Traceback" not in server.stderr_showing('"POST /v2/models/add_one/infer" 408')
    assert server.is_live()


def test_a_request_on_a_kept_alive_connection_is_not_timed_between_requests(
    server: Server,
) -> None:
    """Between requests the idle connection is uvicorn's keep-alive's (5 s), not the header
    timer's: a second request after a pause longer than the header timeout is answered."""
    with httpx.Client(base_url=server.url) as client:
        assert client.get("/v2/health/live").status_code == 200
        time.sleep(TIMEOUT_S * 2)  # sets up the case; the outcome is the answer below
        assert client.get("/v2/health/live").status_code == 200


@pytest.mark.slow
def test_past_limit_concurrency_a_request_gets_503_while_n_are_held(
    serve: Launcher, threads: ThreadPoolExecutor
) -> None:
    limit = 3
    server = serve(
        "models:gated", "--max-batch-size", "1", "--workers", str(limit),
        "--limit-concurrency", str(limit),
    )  # fmt: skip
    with server.gate_closed("gated"):
        held = [
            threads.submit(server.infer_alone, "gated", float_request(float(i)))
            for i in range(limit)
        ]
        server.wait_started("gated", limit)  # each on a connection of its own, in the model
        refused = httpx.get(f"{server.url}/v2/health/live", timeout=CLOSED_WITHIN_S)
        assert refused.status_code == 503
        assert refused.json() == {
            "error": f"Overloaded: over --limit-concurrency={limit} connections; retry later"
        }
        assert refused.headers["retry-after"] == "1"
    for i, future in enumerate(held):
        response = future.result()
        assert response.status_code == 200, response.text
        assert response.json()["outputs"][0]["data"] == [float(i)]
    wait_until(  # their connections close as their answers go out, then one more is served
        lambda: httpx.get(f"{server.url}/v2/health/live").status_code == 200,
        "a request to be served once the held ones left",
    )


def _trickled_until_closed(sock: socket.socket) -> tuple[bytes, float]:
    """Read what the server sends while sending it a byte every 0.2 s: what came, and the
    seconds until the server ended the connection (a socket timeout fails the test)."""
    started = time.monotonic()
    received = b""
    while time.monotonic() - started < CLOSED_WITHIN_S:
        if select.select([sock], [], [], 0.2)[0]:
            chunk = sock.recv(65536)
            if not chunk:
                return received, time.monotonic() - started
            received += chunk
        try:
            sock.sendall(b"x")
        except (BrokenPipeError, ConnectionResetError):
            return received, time.monotonic() - started
    pytest.fail(f"the connection was still open after {CLOSED_WITHIN_S:g} s of trickling")


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"GET /v2/health/live HTTP/1.1\r\nHost: carpool\r\nContent-Length: 100000\r\n\r\n", 200),
        (b"POST /v2/nowhere HTTP/1.1\r\nHost: carpool\r\nContent-Length: 100000\r\n\r\n", 404),
        (
            b"POST /v2/models/add_one/infer HTTP/1.1\r\nHost: carpool\r\n"
            b"Content-Length: 999999999999\r\n\r\n",
            413,
        ),
    ],
    ids=["health", "not-found", "declared-413"],
)
def test_an_answer_sent_before_the_body_ends_the_connection_whatever_trickles_in(
    server: Server, head: bytes, status: int
) -> None:
    """Before, one more body byte after such an answer cancelled uvicorn's keep-alive timer
    and nothing re-armed it: a byte a second held the connection for ever."""
    with connect(server) as sock:
        sock.sendall(head + b"abc")
        received, _ = _trickled_until_closed(sock)
    assert split_response(received)[0] == status


def test_a_client_that_takes_none_of_its_answer_is_cut_off(serve: Launcher) -> None:
    """A response of megabytes to a client that reads none of it: once the buffers are
    full and nothing more is taken for --body-timeout, the connection is cut (it was held
    for as long as the client held it), and the server goes on."""
    server = serve("models:expand", "--body-timeout", str(TIMEOUT_S))
    body = json.dumps(float_request(1.0)).encode()
    head = (
        b"POST /v2/models/expand/infer HTTP/1.1\r\nHost: carpool\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window
    sock.settimeout(CLOSED_WITHIN_S)
    with sock:
        sock.connect(("127.0.0.1", server.port))
        sock.sendall(head + body)
        server.stderr_showing("took none of its answer")
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:
            pass
    status, headers, sent = split_response(received)
    assert status == 200
    assert len(sent) < int(headers["content-length"])  # the rest was never sent
    assert server.infer("expand", float_request(2.0)).status_code == 200


# -- 500 held connections (issue 19's "how to show it") ------------------------------------

HELD = 500
ATTACK_TIMEOUT_S = 2.0  # --header-timeout and --body-timeout of the attacked server
LINGER_S = 2.0  # what the rest of a body answered before it was read may take (documented)
ATTACK_KEY = "attack-SECRET-4f5e"
BODY_AFTER = b"Content-Length: 100000\r\n\r\n{"  # a body that would take 100,000 bytes
# How each of the held connections starts; the trickling ones then send a body byte every
# 0.5 s until the server ends the connection.
HOLDS = {
    "half a request line": (b"POST /v2/models/add_one/inf", False),
    "one byte": (b"P", False),
    "401, then a trickled body": (
        b"POST /v2/models/add_one/infer HTTP/1.1\r\nHost: carpool\r\n" + BODY_AFTER,
        True,
    ),
    "health, then a trickled body": (
        b"GET /v2/health/ready HTTP/1.1\r\nHost: carpool\r\n" + BODY_AFTER,
        True,
    ),
}


@pytest.fixture
def fds() -> Iterator[None]:
    """Enough file descriptors for this process and the servers it starts (which inherit
    the limit) to hold HELD connections each, with room to spare."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = HELD + 500
    if soft != resource.RLIM_INFINITY and soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            pytest.fail(f"{wanted} file descriptors needed; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def _hold(
    port: int, kind: str, answered: asyncio.Queue[str]
) -> tuple[str, bytes, float, float]:
    """One held connection: what the server sent; the seconds from before the connect until
    the server ended the connection (what the server took, and a little more); and those
    until its answer came, if it came before the body (else 0.0), where its linger starts."""
    first, trickles = HOLDS[kind]
    opened = time.monotonic()
    answer_s = 0.0
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(first)
    received = b""
    while True:
        try:
            reading = asyncio.wait_for(reader.read(65536), 0.5) if trickles else reader.read(65536)
            chunk = await reading
        except TimeoutError:
            writer.write(b" ")  # one more body byte; the answer came already
            continue
        except ConnectionResetError:
            break
        if not chunk:
            break
        if trickles and not received:
            answered.put_nowait(kind)
            answer_s = time.monotonic() - opened
        received += chunk
    took = time.monotonic() - opened
    writer.close()
    return kind, received, took, answer_s


async def _attack(port: int, held: int) -> tuple[list[tuple[str, bytes, float, float]], int, float]:
    """``held`` connections, a quarter of each kind; once every trickling one has its
    answer (all accepted before the probe: accepts are in order), a fresh client asks
    /v2/health/ready. Each held connection's outcome; the probe's status and seconds."""
    answered: asyncio.Queue[str] = asyncio.Queue()
    kinds = [kind for _ in range(held // len(HOLDS)) for kind in HOLDS]
    holds = [asyncio.create_task(_hold(port, kind, answered)) for kind in kinds]
    trickling = sum(HOLDS[kind][1] for kind in kinds)
    for _ in range(trickling):
        await asyncio.wait_for(answered.get(), CLOSED_WITHIN_S)
    asked = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /v2/health/ready HTTP/1.1\r\nHost: carpool\r\nConnection: close\r\n\r\n")
    answer = await asyncio.wait_for(reader.read(), CLOSED_WITHIN_S)
    probe_s = time.monotonic() - asked
    writer.close()
    outcomes = await asyncio.wait_for(asyncio.gather(*holds), CLOSED_WITHIN_S)
    return outcomes, split_response(answer)[0], probe_s


@pytest.mark.usefixtures("fds")
def test_500_held_connections_neither_starve_health_nor_outlive_their_timeouts(
    serve: Launcher,
) -> None:
    """500 connections held the ways a slow or hostile client holds them (half a request
    line; one byte; a request answered before its body is read, a 401 or a health answer,
    then a body byte every 0.5 s) with the default --limit-concurrency (1000: 500 are under
    it). Meanwhile a fresh client's health check is answered within 1 s, and the server
    ends every held connection within its documented bound: the header timeout from the
    connection's start, or the 2 s linger after an answer sent before the body."""
    timeouts = ["--header-timeout", str(ATTACK_TIMEOUT_S), "--body-timeout", str(ATTACK_TIMEOUT_S)]
    server = serve("models:add_one", *timeouts, "--api-key", ATTACK_KEY)
    outcomes, probe_status, probe_s = asyncio.run(_attack(server.port, HELD))
    assert probe_status == 200
    assert probe_s < 1.0, f"health was answered after {probe_s:.3f}s"
    statuses = Counter((kind, split_response(sent)[0]) for kind, sent, *_ in outcomes)
    assert statuses == {
        ("half a request line", 408): HELD // 4,
        ("one byte", 408): HELD // 4,
        ("401, then a trickled body", 401): HELD // 4,
        ("health, then a trickled body", 200): HELD // 4,
    }
    took = sorted(seconds for _, _, seconds, _ in outcomes)
    assert took[0] > ATTACK_TIMEOUT_S - 0.05  # none cut before its timeout
    bound = max(ATTACK_TIMEOUT_S, LINGER_S) + 1.0  # the documented bound, 1 s to spare
    # A linger's bound runs from the answer, which a loaded machine is slow to send to 250
    # connections at once (0.15-0.5 s on 2 cores, spent from the 1 s to spare before):
    # that time is not the linger's.
    last = max(seconds - answer_s for _, _, seconds, answer_s in outcomes)
    assert last < bound, f"a held connection was closed {last:.2f}s after its bound began"
    assert server.is_live()
