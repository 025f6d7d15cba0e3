"""``--ssl-certfile``/``--ssl-keyfile``: HTTPS and gRPC over TLS with one certificate, made by
``trustme`` for the test, spoken to by tritonclient (http and grpc) that trust only its CA.
A TLS handshake has ``--header-timeout``'s seconds (it had asyncio's 60 s) and counts against
``--limit-concurrency`` from accept (it counted once done), tested over raw sockets."""

from __future__ import annotations

import signal
import socket
import ssl
import time
from pathlib import Path
from typing import Any

import gevent.ssl
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
import trustme

from server.conftest import Launcher, Server

KEY = "tls-SECRET-0c1d2e"
ROW = np.array([[1.0, 2.0]], np.float32)


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def tls_args(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The flags that serve HTTPS with a certificate of ``ca``'s."""
    folder = tmp_path_factory.mktemp("tls")
    certificate = ca.issue_cert("127.0.0.1", "localhost")
    certfile, keyfile = folder / "cert.pem", folder / "key.pem"
    certificate.cert_chain_pems[0].write_to_path(str(certfile))
    for blob in certificate.cert_chain_pems[1:]:
        blob.write_to_path(str(certfile), append=True)
    certificate.private_key_pem.write_to_path(str(keyfile))
    return ["--ssl-certfile", str(certfile), "--ssl-keyfile", str(keyfile)]


@pytest.fixture(scope="module")
def trusted(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


@pytest.fixture(scope="module")
def server(serve_module: Launcher, tls_args: list[str], trusted: ssl.SSLContext) -> Server:
    return serve_module("models:add_one", *tls_args, "--api-key", KEY, grpc=True, verify=trusted)


def test_https_serves_and_plain_http_is_closed(server: Server) -> None:
    assert server.url.startswith("https://")
    assert server.http.get("/v2/health/ready").json() == {"ready": True}
    assert server.http.get("/v2", headers={"x-api-key": KEY}).json()["name"] == "carpool"
    assert server.http.get("/v2").status_code == 401  # keys apply over TLS too
    with pytest.raises(httpx.TransportError):  # an untrusted certificate is refused
        httpx.get(f"{server.url}/v2/health/live", timeout=5.0)
    with pytest.raises(httpx.RemoteProtocolError):  # plain HTTP: closed, nothing read
        httpx.get(f"http://{server.address}/v2/health/live", timeout=5.0)


def test_tritonclient_http_over_https(server: Server, ca: trustme.CA) -> None:
    def trusting(**_: Any) -> gevent.ssl.SSLContext:
        context = gevent.ssl.create_default_context()
        ca.configure_trust(context)
        return context

    client = triton_http.InferenceServerClient(
        server.address, ssl=True, ssl_context_factory=trusting
    )
    try:
        headers = {"x-api-key": KEY}
        assert client.is_server_live()
        tensor = triton_http.InferInput("INPUT0", [1, 2], "FP32")
        tensor.set_data_from_numpy(ROW)
        result = client.infer("add_one", [tensor], headers=headers)
        assert result.as_numpy("OUTPUT0").tolist() == [[2.0, 3.0]]
    finally:
        client.close()


@pytest.fixture
def root_certificates(ca: trustme.CA, tmp_path: Path) -> str:
    path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return str(path)


def test_tritonclient_grpc_over_tls(server: Server, root_certificates: str) -> None:
    client = triton_grpc.InferenceServerClient(
        f"localhost:{server.grpc_port}", ssl=True, root_certificates=root_certificates
    )
    try:
        assert client.is_server_live()
        tensor = triton_grpc.InferInput("INPUT0", [1, 2], "FP32")
        tensor.set_data_from_numpy(ROW)
        result = client.infer("add_one", [tensor], headers={"authorization": f"Bearer {KEY}"})
        assert result.as_numpy("OUTPUT0").tolist() == [[2.0, 3.0]]
    finally:
        client.close()
    assert KEY not in server.stderr()


def test_a_plaintext_grpc_client_gets_no_service(server: Server) -> None:
    client = triton_grpc.InferenceServerClient(server.grpc_address)
    try:
        with pytest.raises(Exception, match="UNAVAILABLE"):
            client.is_server_live(client_timeout=5.0)
    finally:
        client.close()


# -- handshakes that stall -----------------------------------------------------------------

HANDSHAKE_S = 1  # --header-timeout, and so each handshake's timeout
CLOSED_WITHIN_S = 5.0  # far below the 60 s a handshake had; a server that waits fails here


@pytest.fixture(scope="module")
def strict(serve_module: Launcher, tls_args: list[str], trusted: ssl.SSLContext) -> Server:
    return serve_module(
        "models:add_one", *tls_args, "--header-timeout", str(HANDSHAKE_S), verify=trusted
    )


def stall(server: Server, sent: bytes = b"") -> socket.socket:
    """A TCP connection to ``server`` that sends ``sent`` and then nothing."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=CLOSED_WITHIN_S)
    sock.sendall(sent)
    return sock


def seconds_until_closed(sock: socket.socket) -> float:
    """Seconds until the server ends the connection, having sent nothing (a socket timeout,
    the server holding it for CLOSED_WITHIN_S, fails the test)."""
    started = time.monotonic()
    try:
        assert sock.recv(65536) == b""
    except ConnectionResetError:
        pass  # the server aborted it: closed as well
    return time.monotonic() - started


def client_hello() -> bytes:
    """The ClientHello a real client sends first."""
    tls = ssl.create_default_context().wrap_bio(
        ssl.MemoryBIO(), outgoing := ssl.MemoryBIO(), server_hostname="localhost"
    )
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:  # it waits for the server's answer
        return outgoing.read()
    raise AssertionError("a handshake with nobody finished")


@pytest.mark.parametrize(
    "sent", [b"", client_hello()[:20]], ids=["nothing", "a-partial-client-hello"]
)
def test_a_handshake_that_stalls_is_closed_at_the_header_timeout(
    strict: Server, sent: bytes
) -> None:
    """The connection is closed, silently, once it has taken --header-timeout's seconds
    (it was held 60 s, whatever --header-timeout said); the server goes on."""
    # Timed from before the connect, which the server's timeout follows: a client held up
    # after connecting (a loaded machine) cannot read the timeout short.
    opened = time.monotonic()
    with stall(strict, sent) as sock:
        seconds_until_closed(sock)
    took = time.monotonic() - opened
    assert HANDSHAKE_S - 0.1 < took < CLOSED_WITHIN_S
    assert strict.http.get("/v2/health/ready").status_code == 200


def test_connections_stalled_in_their_handshake_count_against_limit_concurrency(
    serve: Launcher, tls_args: list[str], trusted: ssl.SSLContext
) -> None:
    """N connections that never say hello fill --limit-concurrency N: a real client is
    answered 503 Overloaded, as past the limit on plain HTTP (they were not counted until
    their handshake ended); once the timeout closed them, it is served."""
    limit = 2
    server = serve(
        "models:add_one", *tls_args, "--limit-concurrency", str(limit),
        "--header-timeout", "2",  # far above what the client below takes
        verify=trusted,
    )  # fmt: skip
    stalled = [stall(server) for _ in range(limit)]  # accepted first: accepts are in order
    try:
        refused = httpx.get(f"{server.url}/v2/health/ready", verify=trusted, timeout=5.0)
        assert refused.status_code == 503
        assert refused.json() == {
            "error": f"Overloaded: over --limit-concurrency={limit} connections; retry later"
        }
        assert refused.headers["retry-after"] == "1"
        assert all(seconds_until_closed(sock) < CLOSED_WITHIN_S for sock in stalled)
    finally:
        for sock in stalled:
            sock.close()
    served = httpx.get(f"{server.url}/v2/health/ready", verify=trusted, timeout=5.0)
    assert served.status_code == 200


def test_a_signal_during_a_handshake_drains_without_waiting_for_it(
    serve: Launcher, tls_args: list[str], trusted: ssl.SSLContext
) -> None:
    """The drain waits for the requests received, not for a handshake (which its timeout,
    here 30 s, would end): the server exits 0 at once."""
    server = serve(
        "models:add_one", *tls_args, "--limit-concurrency", "1", "--header-timeout", "30",
        verify=trusted,
    )  # fmt: skip
    with stall(server) as sock:
        refused = httpx.get(f"{server.url}/v2/health/ready", verify=trusted, timeout=5.0)
        assert refused.status_code == 503  # the handshake is counted: the server has it
        server.send_signal(signal.SIGTERM)
        assert server.wait_exit(within=10.0) == 0
        assert seconds_until_closed(sock) < CLOSED_WITHIN_S
