"""API keys (``--api-key``, ``CARPOOL_API_KEY``): the pure check of
:mod:`carpool.server.auth`, then a real server over REST (v2 and OpenAI's routes, through
httpx and the openai client) and gRPC (tritonclient.grpc): a key in either header opens every
route, a missing or wrong one gets exactly 401 ``{"error": "unauthorized"}`` (gRPC:
``UNAUTHENTICATED``), the health routes stay open, ``/metrics`` is open unless
``--metrics-need-key``, and no key ever reaches the server's log.
"""

from __future__ import annotations

import contextlib
import hmac
import select
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc as triton
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from carpool.server.auth import ApiKeys, is_open, presented
from conftest import replica_children
from server.conftest import Launcher, Server, json_tensor

from .test_cli_serve import assert_refused, run_serve

KEYS = ("first-SECRET-3f9a1c", "second-SECRET-77be20")
WRONG = "wrong-SECRET-d41d8c"
INFER = {"inputs": [json_tensor("INPUT0", "FP32", [1, 2], [1.0, 2.0])]}
UNAUTHORIZED_BODY = {"error": "unauthorized"}


# ---------------------------------------------------------------- the pure check


def test_presented_reads_bearer_tokens_and_x_api_key() -> None:
    headers = [
        (b"authorization", b"Bearer one"),
        (b"authorization", b"bearer  two "),
        (b"authorization", b"Basic dXNlcjpwYXNz"),  # a key header with no key in it
        (b"x-api-key", b"three"),
        (b"x-other", b"four"),
    ]
    assert presented(headers) == [b"one", b"two", None, b"three"]


def test_api_keys_allow_any_of_several_keys_by_either_header() -> None:
    keys = ApiKeys(KEYS)
    assert keys.allows([(b"authorization", f"Bearer {KEYS[0]}".encode())])
    assert keys.allows([(b"x-api-key", KEYS[1].encode())])
    assert not keys.allows([(b"x-api-key", WRONG.encode())])
    assert not keys.allows([(b"x-api-key", KEYS[0][:-1].encode())])  # a prefix is not the key
    assert not keys.allows([(b"authorization", KEYS[0].encode())])  # no Bearer scheme
    assert not keys.allows([])
    assert KEYS[0] not in repr(keys)
    assert len(keys) == 2


@pytest.mark.parametrize(
    "headers",
    [
        [(b"x-api-key", WRONG.encode()), (b"x-api-key", KEYS[1].encode())],
        [(b"x-api-key", KEYS[1].encode()), (b"x-api-key", KEYS[1].encode())],
        [(b"authorization", f"Bearer {WRONG}".encode()), (b"x-api-key", KEYS[0].encode())],
        [(b"authorization", b"Basic dXNlcjpwYXNz"), (b"x-api-key", KEYS[0].encode())],
    ],
    ids=["wrong-then-right", "right-twice", "bearer-and-x-api-key", "basic-and-x-api-key"],
)
def test_several_key_headers_are_refused_whatever_they_hold(
    headers: list[tuple[bytes, bytes]],
) -> None:
    """One request tests one guess: several key headers, of one kind or both, are refused."""
    assert not ApiKeys(KEYS).allows(headers)


def test_every_key_is_compared_in_constant_time_without_early_exit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """hmac.compare_digest, of equal-length digests, against every key for every presented
    key, even after a match: the time taken says nothing about which key matched."""
    compared: list[tuple[int, int]] = []
    real = hmac.compare_digest

    def compare_digest(a: bytes, b: bytes) -> bool:
        compared.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", compare_digest)  # as auth calls it
    keys = ApiKeys(("a", "bb", "ccc"))
    assert keys.allows([(b"x-api-key", b"a")])  # matches the first key
    assert len(compared) == 3
    assert not keys.matches([b"zz", b"y"])
    assert len(compared) == 3 + 6
    assert not keys.allows([(b"x-api-key", b"a"), (b"x-api-key", b"zz")])  # two: no compare
    assert len(compared) == 3 + 6
    assert set(compared) == {(32, 32)}  # SHA-256 digests: lengths are not timed either


def test_only_health_and_by_default_metrics_are_open() -> None:
    assert is_open(["v2", "health", "live"], metrics_need_key=True)
    assert is_open(["v2", "health", "ready"], metrics_need_key=True)
    assert is_open(["metrics"], metrics_need_key=False)
    assert not is_open(["metrics"], metrics_need_key=True)
    for path in ("v2", "v2/models/m/infer", "v2/health", "v2/health/other", "v1/models"):
        assert not is_open(path.split("/"), metrics_need_key=False), path


def test_api_keys_refuse_to_be_empty() -> None:
    with pytest.raises(ValueError, match="at least one key"):
        ApiKeys(())


# ---------------------------------------------------------------- a real server


@pytest.fixture(scope="module")
def server(serve_module: Launcher) -> Server:
    args = ["models:add_one", "--api-key", KEYS[0], "--api-key", KEYS[1]]
    return serve_module(*args, access_log=True, grpc=True)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize(
    "headers", [bearer(KEYS[0]), {"x-api-key": KEYS[1]}, {"X-Api-Key": KEYS[0]}]
)
def test_a_key_in_either_header_opens_inference(server: Server, headers: dict[str, str]) -> None:
    response = server.infer("add_one", INFER, headers=headers)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [2.0, 3.0]


ROUTES = [
    ("GET", "/v2"),
    ("GET", "/v2/openapi.json"),
    ("GET", "/v2/models/add_one"),
    ("GET", "/v2/models/add_one/ready"),
    ("GET", "/v2/models/stats"),
    ("POST", "/v2/models/add_one/infer"),
    ("POST", "/v2/models/unknown/infer"),  # no hint that the model does not exist
    ("POST", "/v2/repository/index"),
    ("GET", "/v2/nowhere"),
]


@pytest.mark.parametrize(("method", "path"), ROUTES)
@pytest.mark.parametrize(
    "headers",
    [{}, bearer(WRONG), {"x-api-key": WRONG}, {"Authorization": KEYS[0]}, {"x-api-key": ""}],
    ids=["missing", "wrong-bearer", "wrong-x-api-key", "no-scheme", "empty"],
)
def test_a_missing_or_wrong_key_gets_401_with_no_detail(
    server: Server, method: str, path: str, headers: dict[str, str]
) -> None:
    response = server.http.request(method, path, json=INFER, headers=headers)
    assert response.status_code == 401
    assert response.json() == UNAUTHORIZED_BODY
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.headers["content-type"] == "application/json"


def test_health_and_metrics_stay_open(server: Server) -> None:
    assert server.http.get("/v2/health/live").json() == {"live": True}
    assert server.http.get("/v2/health/ready").json() == {"ready": True}
    assert server.http.get("/metrics", headers=bearer(WRONG)).status_code == 200
    assert "carpool_requests_total" in server.metrics()


@pytest.fixture(scope="module")
def openai_client(server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEYS[1], max_retries=0) as client:
        yield client


def test_openai_routes_take_the_key_openai_clients_send(
    server: Server, openai_client: openai.OpenAI
) -> None:
    assert openai_client.models.list().data == []  # add_one did not opt in; still a 200
    wrong = openai.OpenAI(base_url=f"{server.url}/v1", api_key=WRONG, max_retries=0)
    with wrong, pytest.raises(openai.AuthenticationError) as info:
        wrong.models.list()
    assert info.value.status_code == 401
    response = server.http.post("/v1/embeddings", json={"model": "add_one", "input": "x"})
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json() == {
        "error": {
            "message": "unauthorized",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }


# ---------------------------------------------------------------- gRPC


@pytest.fixture(scope="module")
def grpc_client(server: Server) -> Iterator[triton.InferenceServerClient]:
    client = triton.InferenceServerClient(server.grpc_address)
    yield client
    client.close()


def grpc_failure(call: Any, *args: Any, **kwargs: Any) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as info:
        call(*args, **kwargs)
    return str(info.value.status()).removeprefix("StatusCode."), str(info.value.message())


def one_input() -> list[Any]:
    tensor = triton.InferInput("INPUT0", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.array([[1.0, 2.0]], np.float32))
    return [tensor]


@pytest.mark.parametrize("headers", [bearer(KEYS[0]), {"x-api-key": KEYS[1]}])
def test_grpc_calls_with_a_key_in_their_metadata_are_served(
    grpc_client: triton.InferenceServerClient, headers: dict[str, str]
) -> None:
    metadata = {key.lower(): value for key, value in headers.items()}  # gRPC: lower case
    assert grpc_client.get_server_metadata(headers=metadata).name == "carpool"
    result = grpc_client.infer("add_one", one_input(), headers=metadata)
    assert result.as_numpy("OUTPUT0").tolist() == [[2.0, 3.0]]


@pytest.mark.parametrize("headers", [None, {"authorization": f"Bearer {WRONG}"}])
def test_grpc_calls_without_a_key_are_unauthenticated_with_no_detail(
    grpc_client: triton.InferenceServerClient, headers: dict[str, str] | None
) -> None:
    expected = ("UNAUTHENTICATED", "unauthorized")
    assert grpc_failure(grpc_client.get_server_metadata, headers=headers) == expected
    assert grpc_failure(grpc_client.get_model_metadata, "add_one", headers=headers) == expected
    assert grpc_failure(grpc_client.infer, "add_one", one_input(), headers=headers) == expected
    assert grpc_failure(grpc_client.infer, "unknown", one_input(), headers=headers) == expected
    # the health RPCs stay open, as REST's routes
    assert grpc_client.is_server_live(headers=headers)
    assert grpc_client.is_server_ready(headers=headers)


def test_a_grpc_stream_without_a_key_ends_unauthenticated(
    grpc_client: triton.InferenceServerClient,
) -> None:
    """Refused as it opens, before any message is read: a request sent on it may find the
    stream already ended (tritonclient then raises), and the callback gets the status."""
    errors: list[Any] = []
    ended = threading.Event()

    def callback(result: Any, error: Any) -> None:
        errors.append(error)
        ended.set()

    grpc_client.start_stream(callback=callback)
    with contextlib.suppress(InferenceServerException):
        grpc_client.async_stream_infer("add_one", one_input())
    assert ended.wait(timeout=10.0)
    grpc_client.stop_stream()
    (error,) = errors
    assert (str(error.status()), error.message()) == ("StatusCode.UNAUTHENTICATED", "unauthorized")


# ---------------------------------------------------------------- logs and settings


def test_no_key_ever_reaches_the_log(server: Server, grpc_client: Any) -> None:
    for key in (*KEYS, WRONG):
        for headers in (bearer(key), {"x-api-key": key}):
            server.infer("add_one", INFER, headers=headers)
            server.http.get(f"/v2/models/add_one?key={len(key)}", headers=headers)
            server.http.post("/v1/embeddings", json={"input": "x"}, headers=headers)
        metadata = {"authorization": f"Bearer {key}"}
        try:
            grpc_client.infer("add_one", one_input(), headers=metadata)
        except InferenceServerException:
            pass
    log = server.stderr_showing('"POST /v1/embeddings"', count=2 * (len(KEYS) + 1))
    assert '"POST /v2/models/add_one/infer" 401' in log  # the access log is on, and saw them
    assert '"POST /v2/models/add_one/infer" 200' in log
    for secret in (*KEYS, WRONG, "SECRET"):
        assert secret not in log


def test_metrics_need_a_key_with_the_setting(serve: Launcher) -> None:
    """Keys from CARPOOL_API_KEY (comma-separated) and the setting from its variable."""
    server = serve(
        "models:add_one",
        env={"CARPOOL_API_KEY": ",".join(KEYS), "CARPOOL_METRICS_NEED_KEY": "true"},
    )
    refused = server.http.get("/metrics")
    assert (refused.status_code, refused.json()) == (401, UNAUTHORIZED_BODY)
    assert server.http.get("/metrics", headers={"x-api-key": KEYS[1]}).status_code == 200
    assert server.http.get("/v2/health/live").status_code == 200
    assert server.infer("add_one", INFER, headers=bearer(KEYS[0])).status_code == 200


def test_without_keys_every_route_is_open(serve: Launcher) -> None:
    server = serve("models:add_one")
    assert server.infer("add_one", INFER).status_code == 200
    assert httpx.get(f"{server.url}/v2", headers=bearer(WRONG)).status_code == 200


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--api-key", "has space-SECRET"], {}, "an API key must not contain spaces or commas"),
        ([], {"CARPOOL_API_KEY": "ok-SECRET,\x07bell"}, "printable ASCII"),
        ([], {"CARPOOL_API_KEY": ""}, "CARPOOL_API_KEY is set but holds no key"),
        ([], {"CARPOOL_API_KEY": " "}, "CARPOOL_API_KEY is set but holds no key"),
        ([], {"CARPOOL_API_KEY": ",, ,"}, "CARPOOL_API_KEY is set but holds no key"),
        (["--ssl-certfile", "cert.pem"], {}, "TLS needs both --ssl-certfile and --ssl-keyfile"),
        (["--ssl-certfile", "no.pem", "--ssl-keyfile", "no.pem"], {}, "'no.pem': no such file"),
        (["--header-timeout", "0"], {}, "--header-timeout must be > 0 seconds"),
        (["--limit-concurrency", "-1"], {}, "--limit-concurrency must be >= 0"),
    ],
)
def test_bad_access_settings_refuse_to_start_without_quoting_a_key(
    args: list[str], env: dict[str, str], message: str
) -> None:
    result = run_serve("models:add_one", *args, env=env)
    assert_refused(result, message)
    assert "SECRET" not in result.stderr


def test_an_empty_api_keys_table_entry_refuses_to_start(tmp_path: Path) -> None:
    config = tmp_path / "carpool.toml"
    config.write_text("[server]\napi_keys = []\n")
    result = run_serve("models:add_one", "--config", str(config))
    assert_refused(result, "[server] api_keys is empty")


@pytest.mark.parametrize(
    "headers",
    [
        [("x-api-key", WRONG), ("x-api-key", KEYS[0])],
        [("authorization", f"Bearer {KEYS[0]}"), ("x-api-key", KEYS[0])],
    ],
    ids=["x-api-key-twice", "both-kinds"],
)
def test_a_request_with_several_key_headers_gets_401(
    server: Server, headers: list[tuple[str, str]]
) -> None:
    response = httpx.post(
        f"{server.url}/v2/models/add_one/infer", json=INFER, headers=httpx.Headers(headers)
    )
    assert (response.status_code, response.json()) == (401, {"error": "unauthorized"})
    # gRPC metadata with the same headers (tritonclient takes a dict: one of each)
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.ServerMetadata(service_pb2.ServerMetadataRequest(), metadata=headers)
        assert (info.value.code(), info.value.details()) == (
            grpc.StatusCode.UNAUTHENTICATED,
            "unauthorized",
        )
        one = [headers[-1]]  # the same call with one of them: served
        assert stub.ServerMetadata(service_pb2.ServerMetadataRequest(), metadata=one).name


def test_worker_processes_do_not_inherit_the_key(serve: Launcher) -> None:
    server = serve("models:add_one", "--runner", "process", env={"CARPOOL_API_KEY": KEYS[0]})
    assert server.infer("add_one", INFER, headers=bearer(KEYS[0])).status_code == 200
    workers = replica_children(server.process.pid)
    assert workers
    for pid in workers:
        environment = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert not any(entry.startswith(b"CARPOOL_API_KEY=") for entry in environment)
        assert KEYS[0].encode() not in Path(f"/proc/{pid}/environ").read_bytes()


def test_a_401_sent_before_the_body_ends_the_connection(server: Server) -> None:
    """A 401 is sent without reading the body; a client that keeps trickling body bytes no
    longer holds the connection open (it did for as long as it trickled)."""
    head = b"POST /v2/models/add_one/infer HTTP/1.1\r\nHost: c\r\nContent-Length: 100000\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(head + b"{")
        received = b""
        for _ in range(100):  # a byte each 0.1 s for up to 10 s
            if select.select([sock], [], [], 0.1)[0]:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                received += chunk
            try:
                sock.sendall(b" ")
            except (BrokenPipeError, ConnectionResetError):
                break
        else:
            pytest.fail("the connection was still open after 10 s of trickling")
    assert received.startswith(b"HTTP/1.1 401 ")


def test_a_401_before_a_body_that_then_comes_whole_keeps_the_connection(server: Server) -> None:
    """The answer may go before the body arrives (a client that writes its head, then its
    body); a body that then comes whole leaves the connection in use."""
    head = b"POST /v2/models/add_one/infer HTTP/1.1\r\nHost: c\r\nContent-Length: 10\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(head)
        first = b""
        while b"unauthorized" not in first:
            first += sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 401 ")
        sock.sendall(b"0123456789" + b"GET /v2/health/live HTTP/1.1\r\nHost: c\r\n\r\n")
        second = b""
        while b'{"live":true}' not in second:
            chunk = sock.recv(65536)
            assert chunk, "the connection was closed"
            second += chunk
    assert second.startswith(b"HTTP/1.1 200 ")


def test_a_grpc_call_without_a_key_is_refused_before_its_message_is_parsed(
    server: Server,
) -> None:
    """Garbage where a ModelInferRequest belongs: refused as UNAUTHENTICATED, not failed as
    a message that does not parse (it was parsed, megabytes of it, before the refusal)."""
    with grpc.insecure_channel(server.grpc_address) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as info:
            call(b"\xff\xfe not a protobuf message" * 1000)
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.UNAUTHENTICATED,
        "unauthorized",
    )
