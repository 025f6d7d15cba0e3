"""``--ssl-certfile``/``--ssl-keyfile``: HTTPS and gRPC over TLS with one certificate, made by
``trustme`` for the test, spoken to by tritonclient (http and grpc) that trust only its CA."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import gevent.ssl
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
import trustme

from .conftest import Launcher, Server

KEY = "tls-SECRET-0c1d2e"
ROW = np.array([[1.0, 2.0]], np.float32)


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def server(
    serve_module: Launcher, ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory
) -> Server:
    folder = tmp_path_factory.mktemp("tls")
    certificate = ca.issue_cert("127.0.0.1", "localhost")
    certfile, keyfile = folder / "cert.pem", folder / "key.pem"
    certificate.cert_chain_pems[0].write_to_path(str(certfile))
    for blob in certificate.cert_chain_pems[1:]:
        blob.write_to_path(str(certfile), append=True)
    certificate.private_key_pem.write_to_path(str(keyfile))
    trusted = ssl.create_default_context()
    ca.configure_trust(trusted)
    args = ["models:add_one", "--ssl-certfile", str(certfile), "--ssl-keyfile", str(keyfile)]
    return serve_module(*args, "--api-key", KEY, grpc=True, verify=trusted)


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
