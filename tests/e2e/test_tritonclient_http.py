"""``carpool serve`` end to end through tritonclient.http, the real v2 client.

One server per module serves every test model; tests that read statistics compare
before/after snapshots of the model they alone use, so they do not depend on test order.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

import carpool
from server.conftest import Server, wait_until

MAX_BATCH = 8
MODELS = ("add_one", "identity", "pair", "upper", "gated", "demo")


@pytest.fixture(scope="module")
def server(serve_module: Any) -> Server:
    targets = [f"models:{name}" for name in MODELS if name != "demo"]
    return serve_module(*targets, "demo", "--max-batch-size", str(MAX_BATCH))  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[triton.InferenceServerClient]:
    client = triton.InferenceServerClient(server.address)
    yield client
    client.close()


class ClientPool:
    """A thread pool in which every thread has its own tritonclient connection."""

    def __init__(self, server: Server, threads: int) -> None:
        self._local = threading.local()
        self._clients: list[triton.InferenceServerClient] = []
        self._lock = threading.Lock()
        self._address = server.address
        self.executor = ThreadPoolExecutor(threads)

    def client(self) -> triton.InferenceServerClient:
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = triton.InferenceServerClient(self._address)
            with self._lock:
                self._clients.append(client)
        return client

    def map(self, fn: Callable[[triton.InferenceServerClient, int], Any], n: int) -> list[Any]:
        return list(self.executor.map(lambda i: fn(self.client(), i), range(n)))

    def close(self) -> None:
        self.executor.shutdown()
        for client in self._clients:
            client.close()


@pytest.fixture
def pool(server: Server) -> Iterator[ClientPool]:
    pool = ClientPool(server, threads=16)
    yield pool
    pool.close()


def infer_input(name: str, array: np.ndarray[Any, Any], *, binary: bool = True) -> Any:
    tensor = triton.InferInput(name, list(array.shape), triton_datatype(array))
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def triton_datatype(array: np.ndarray[Any, Any]) -> str:
    from tritonclient.utils import np_to_triton_dtype

    return str(np_to_triton_dtype(array.dtype))


def as_bytes(item: bytes | str) -> bytes:
    """tritonclient gives BYTES from JSON as str, from binary as bytes."""
    return item.encode() if isinstance(item, str) else item


def outputs(*names: str, binary: bool = True) -> list[Any]:
    return [triton.InferRequestedOutput(name, binary_data=binary) for name in names]


def output_names(result: Any) -> list[str]:
    return [o["name"] for o in result.get_response()["outputs"]]


def batch_sizes(stats: dict[str, Any]) -> dict[int, int]:
    return {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}


def delta(after: dict[int, int], before: dict[int, int]) -> dict[int, int]:
    keys = set(after) | set(before)
    return {
        k: after.get(k, 0) - before.get(k, 0)
        for k in sorted(keys)
        if after.get(k, 0) != before.get(k, 0)
    }


# ---------------------------------------------------------------- health and metadata


def test_server_live_and_ready(client: triton.InferenceServerClient, server: Server) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert server.get_json("/v2/health/live") == {"live": True}
    assert server.get_json("/v2/health/ready") == {"ready": True}


@pytest.mark.parametrize("model", MODELS)
def test_model_ready(client: triton.InferenceServerClient, model: str) -> None:
    assert client.is_model_ready(model)
    assert client.is_model_ready(model, model_version="1")


def test_unknown_model_is_not_ready(client: triton.InferenceServerClient) -> None:
    assert not client.is_model_ready("no_such_model")
    assert not client.is_model_ready("add_one", model_version="2")


def test_server_metadata(client: triton.InferenceServerClient) -> None:
    metadata = client.get_server_metadata()
    assert metadata["name"] == "carpool"
    assert metadata["version"] == carpool.__version__
    assert {"binary_tensor_data", "model_configuration", "statistics"} <= set(
        metadata["extensions"]
    )


def tensor(name: str, datatype: str, shape: list[int]) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape}


@pytest.mark.parametrize(
    ("model", "platform", "inputs", "outputs_"),
    [
        ("demo", "carpool_numpy", [tensor("INPUT0", "FP32", [-1, 256])],
         [tensor("OUTPUT0", "FP32", [-1, 8])]),
        ("pair", "python", [tensor("INPUT0", "FP32", [-1, 4]), tensor("INPUT1", "INT64", [-1, 4])],
         [tensor("SUM", "FP32", [-1, 4]), tensor("DOUBLED", "INT64", [-1, 4])]),
        ("upper", "python", [tensor("TEXT", "BYTES", [-1, -1])],
         [tensor("UPPER", "BYTES", [-1, -1])]),
        # undeclared: one input of any datatype and row shape
        ("add_one", "python", [tensor("INPUT0", "FP32", [-1, -1])],
         [tensor("OUTPUT0", "FP32", [-1, -1])]),
    ],
)  # fmt: skip
def test_model_metadata(
    client: triton.InferenceServerClient,
    model: str,
    platform: str,
    inputs: list[dict[str, Any]],
    outputs_: list[dict[str, Any]],
) -> None:
    expected = {
        "name": model,
        "versions": ["1"],
        "platform": platform,
        "inputs": inputs,
        "outputs": outputs_,
    }
    assert client.get_model_metadata(model) == expected
    assert client.get_model_metadata(model, model_version="1") == expected
    for spec in (*inputs, *outputs_):
        assert spec["shape"][0] == -1  # max_batch_size > 0: the batch dimension is shown


def test_model_config(client: triton.InferenceServerClient) -> None:
    config = client.get_model_config("pair")
    assert config["name"] == "pair"
    assert config["max_batch_size"] == MAX_BATCH  # the flag overrides the Model's 16
    assert config["input"] == [
        {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]},
        {"name": "INPUT1", "data_type": "TYPE_INT64", "dims": [4]},
    ]
    assert config["output"] == [
        {"name": "SUM", "data_type": "TYPE_FP32", "dims": [4]},
        {"name": "DOUBLED", "data_type": "TYPE_INT64", "dims": [4]},
    ]
    assert config["dynamic_batching"]["preferred_batch_size"] == [MAX_BATCH]
    assert config["model_transaction_policy"] == {"decoupled": False}
    upper = client.get_model_config("upper")
    assert upper["input"] == [{"name": "TEXT", "data_type": "TYPE_STRING", "dims": [-1]}]
    assert client.get_model_config("demo")["input"][0]["dims"] == [256]


# ---------------------------------------------------------------- inference

SAMPLES: dict[str, np.ndarray[Any, Any]] = {
    "FP32": np.array([[0.5, -1.25, 3.0e38], [1e-38, 0.0, 1 / 3]], np.float32),
    "INT64": np.array([[-(2**63), 0, 2**63 - 1], [7, -8, 9]], np.int64),
    "BOOL": np.array([[True, False, True], [False, False, True]]),
    "FP16": np.array([[0.5, -2.25, 65504], [1e-4, 0, -0.0]], np.float16),
    "BYTES": np.array([[b"", b"hello", b"x"], [b"a b", "日本".encode(), b"z"]], object),
}


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("datatype", sorted(SAMPLES))
def test_identity_round_trips_datatypes(
    client: triton.InferenceServerClient, datatype: str, rows: int, binary: bool
) -> None:
    array = SAMPLES[datatype][:rows]
    result = client.infer(
        "identity",
        [infer_input("INPUT0", array, binary=binary)],
        outputs=outputs("OUTPUT0", binary=binary),
    )
    (output,) = result.get_response()["outputs"]
    assert output["datatype"] == datatype
    assert output["shape"] == list(array.shape)
    assert ("data" in output) is not binary
    got = result.as_numpy("OUTPUT0")
    assert got.shape == array.shape
    if datatype == "BYTES":
        assert [as_bytes(item) for item in got.reshape(-1)] == array.reshape(-1).tolist()
    else:
        assert got.dtype == array.dtype
        assert np.array_equal(got, array)


def test_default_request_is_binary_and_returns_every_output(
    client: triton.InferenceServerClient,
) -> None:
    x0 = np.arange(8, dtype=np.float32).reshape(2, 4)
    x1 = np.array([[1, 2, 3, 4], [-5, 6, -7, 8]], np.int64)
    result = client.infer("pair", [infer_input("INPUT0", x0), infer_input("INPUT1", x1)])
    response = result.get_response()
    assert response["model_name"] == "pair"
    assert response["model_version"] == "1"
    assert "id" not in response
    assert [o["name"] for o in response["outputs"]] == ["SUM", "DOUBLED"]
    for output in response["outputs"]:
        assert "data" not in output
        assert output["parameters"]["binary_data_size"] > 0
    assert result.as_numpy("SUM").dtype == np.float32
    assert np.array_equal(result.as_numpy("SUM"), (x0 + x1).astype(np.float32))
    assert np.array_equal(result.as_numpy("DOUBLED"), x1 * 2)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_requested_output_subset_and_request_id(
    client: triton.InferenceServerClient, binary: bool
) -> None:
    x0 = np.ones((3, 4), np.float32)
    x1 = np.arange(12, dtype=np.int64).reshape(3, 4)
    result = client.infer(
        "pair",
        [infer_input("INPUT0", x0, binary=binary), infer_input("INPUT1", x1, binary=binary)],
        outputs=outputs("DOUBLED", binary=binary),
        request_id="req-42",
    )
    assert result.get_response()["id"] == "req-42"
    assert output_names(result) == ["DOUBLED"]
    assert result.as_numpy("SUM") is None
    assert np.array_equal(result.as_numpy("DOUBLED"), x1 * 2)


def test_outputs_in_the_order_requested_with_mixed_encodings(
    client: triton.InferenceServerClient,
) -> None:
    x0 = np.full((1, 4), 0.5, np.float32)
    x1 = np.array([[1, 2, 3, 4]], np.int64)
    requested = [
        triton.InferRequestedOutput("DOUBLED", binary_data=False),
        triton.InferRequestedOutput("SUM", binary_data=True),
    ]
    result = client.infer(
        "pair", [infer_input("INPUT0", x0), infer_input("INPUT1", x1)], outputs=requested
    )
    doubled, summed = result.get_response()["outputs"]
    assert (doubled["name"], doubled["data"]) == ("DOUBLED", [2, 4, 6, 8])
    assert (summed["name"], summed["parameters"]) == ("SUM", {"binary_data_size": 16})
    assert np.array_equal(result.as_numpy("SUM"), [[1.5, 2.5, 3.5, 4.5]])


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_bytes_model_upper_cases(client: triton.InferenceServerClient, binary: bool) -> None:
    texts = np.array([[b"hello", b"World"], [b"", b"carpool 1.0"]], object)
    result = client.infer(
        "upper",
        [infer_input("TEXT", texts, binary=binary)],
        outputs=outputs("UPPER", binary=binary),
    )
    got = result.as_numpy("UPPER")
    assert got.shape == (2, 2)
    assert [as_bytes(item) for item in got.reshape(-1)] == [b"HELLO", b"WORLD", b"", b"CARPOOL 1.0"]


def test_nan_and_infinity_in_json_outputs_parse(client: triton.InferenceServerClient) -> None:
    x = np.array([[np.nan, np.inf, -np.inf, 1.0]], np.float32)
    result = client.infer(
        "identity", [infer_input("INPUT0", x)], outputs=outputs("OUTPUT0", binary=False)
    )
    got = result.as_numpy("OUTPUT0")
    assert np.isnan(got[0, 0])
    assert got[0, 1:].tolist() == [np.inf, -np.inf, 1.0]


def test_demo_model_answers_as_the_mlp_does(client: triton.InferenceServerClient) -> None:
    from carpool.backends.demo import DemoMLP

    x = np.random.default_rng(7).standard_normal((3, 256)).astype(np.float32)
    result = client.infer("demo", [infer_input("INPUT0", x)])
    got = result.as_numpy("OUTPUT0")
    assert got.shape == (3, 8)
    np.testing.assert_allclose(got, DemoMLP()(x), rtol=1e-5, atol=1e-5)


def test_request_larger_than_max_batch_size_is_split_and_reassembled(
    client: triton.InferenceServerClient, server: Server
) -> None:
    before = server.stats("add_one")
    rows = 2 * MAX_BATCH + 4
    x = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
    result = client.infer("add_one", [infer_input("INPUT0", x)])
    assert np.array_equal(result.as_numpy("OUTPUT0"), x + 1)
    after = server.stats("add_one")
    assert after["inference_count"] - before["inference_count"] == rows
    assert after["execution_count"] - before["execution_count"] == 3
    assert delta(batch_sizes(after), batch_sizes(before)) == {4: 1, MAX_BATCH: 2}


def test_batch_stats_time_each_batch_size(
    client: triton.InferenceServerClient, server: Server
) -> None:
    """Triton's per-size compute phases: each size's batches with the seconds they took,
    which add up to the model's compute time."""
    before = server.stats("add_one")
    x = np.zeros((2 * MAX_BATCH + 4, 3), np.float32)
    client.infer("add_one", [infer_input("INPUT0", x)])  # batches of 8, 8 and 4 rows
    after = server.stats("add_one")
    old = {b["batch_size"]: b for b in before["batch_stats"]}
    for size, n in ((4, 1), (MAX_BATCH, 2)):
        (new,) = [b for b in after["batch_stats"] if b["batch_size"] == size]
        for phase in ("compute_input", "compute_infer", "compute_output"):
            was = old.get(size, {}).get(phase, {"count": 0, "ns": 0})
            assert new[phase]["count"] - was["count"] == n, (size, phase)
            assert new[phase]["ns"] > was["ns"], (size, phase)
    for phase in ("compute_input", "compute_infer", "compute_output"):
        per_size = sum(b[phase]["ns"] for b in after["batch_stats"])
        total = after["inference_stats"][phase]["ns"]
        assert abs(per_size - total) <= len(after["batch_stats"]), phase  # ns rounding


def payload(i: int) -> np.ndarray[Any, Any]:
    """Request ``i``'s distinct rows: 1 to 3 rows of 5 values that encode ``i``."""
    rows = 1 + i % 3
    return (i * 100 + np.arange(rows * 5, dtype=np.float32)).reshape(rows, 5)


def test_many_concurrent_requests_each_get_their_own_answer(
    pool: ClientPool, server: Server
) -> None:
    n = 200
    before = server.stats("add_one"), server.stats("pair")

    def call(client: triton.InferenceServerClient, i: int) -> tuple[str, Any]:
        x = payload(i)
        if i % 2:
            result = client.infer("add_one", [infer_input("INPUT0", x)], request_id=str(i))
            return result.get_response()["id"], result.as_numpy("OUTPUT0")
        x0, x1 = x[:, :4], x[:, :4].astype(np.int64) - 7
        result = client.infer(
            "pair", [infer_input("INPUT0", x0), infer_input("INPUT1", x1)], request_id=str(i)
        )
        return result.get_response()["id"], (result.as_numpy("SUM"), result.as_numpy("DOUBLED"))

    answers = pool.map(call, n)
    for i, (request_id, got) in enumerate(answers):
        assert request_id == str(i)
        x = payload(i)
        if i % 2:
            assert np.array_equal(got, x + 1)
        else:
            x0, x1 = x[:, :4], x[:, :4].astype(np.int64) - 7
            assert np.array_equal(got[0], (x0 + x1).astype(np.float32))
            assert np.array_equal(got[1], x1 * 2)
    after = server.stats("add_one"), server.stats("pair")
    for model, old, new in zip(("add_one", "pair"), before, after, strict=True):
        parity = 1 if model == "add_one" else 0
        rows = sum(len(payload(i)) for i in range(n) if i % 2 == parity)
        assert new["inference_count"] - old["inference_count"] == rows, model
        assert new["pending"] == 0
        assert max(batch_sizes(new)) <= MAX_BATCH


def histogram(metrics: str, name: str, model: str) -> dict[str, float]:
    """``le`` -> count, plus ``sum`` and ``count``, of one model's Prometheus histogram."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics):
        if family.name != name:
            continue
        for sample in family.samples:
            if sample.labels.get("model") != model:
                continue
            if sample.name.endswith("_bucket"):
                out[sample.labels["le"]] = sample.value
            else:
                out[sample.name.rpartition("_")[2]] = sample.value
    return out


def test_concurrent_requests_share_one_batch(pool: ClientPool, server: Server) -> None:
    """One request holds the worker; MAX_BATCH more queue behind it and leave as one batch."""

    def call(client: triton.InferenceServerClient, i: int) -> Any:
        x = np.full((1, 2), i, np.int64)
        result = client.infer("gated", [infer_input("INPUT0", x)])
        return result.as_numpy("OUTPUT0")

    with server.gate_closed("gated"):
        first = pool.executor.submit(lambda: call(pool.client(), -1))
        server.wait_started("gated", 1)
        rest = [pool.executor.submit(lambda i=i: call(pool.client(), i)) for i in range(MAX_BATCH)]
        wait_until(lambda: server.stats("gated")["pending"] == MAX_BATCH + 1, "requests queued")
    assert first.result().tolist() == [[-1, -1]]
    assert [f.result().tolist() for f in rest] == [[[i, i]] for i in range(MAX_BATCH)]
    assert server.batches_started("gated") == [1, MAX_BATCH]

    stats = server.stats("gated")
    assert (stats["inference_count"], stats["execution_count"]) == (MAX_BATCH + 1, 2)
    assert batch_sizes(stats) == {1: 1, MAX_BATCH: 1}
    sizes = histogram(server.metrics(), "carpool_batch_size", "gated")
    assert sizes["1"] == 1  # batches of at most one row
    assert sizes["+Inf"] - sizes["1"] == 1  # batches of more than one row
    assert (sizes["count"], sizes["sum"]) == (2, MAX_BATCH + 1)


def test_errors_reach_tritonclient_as_exceptions(client: triton.InferenceServerClient) -> None:
    x = np.ones((1, 4), np.float32)
    with pytest.raises(InferenceServerException) as info:
        client.infer("pair", [infer_input("INPUT0", x)])
    assert info.value.status() == "400"
    assert "missing required input(s) ['INPUT1']" in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        client.infer("no_such_model", [infer_input("INPUT0", x)])
    assert info.value.status() == "404"
    assert info.value.message() == "Request for unknown model: 'no_such_model' is not found"


def test_binary_response_framing(server: Server) -> None:
    """The raw bytes: JSON header, then the blobs, split where the header says."""
    x = np.array([[1.5, 2.5]], np.float32)
    body = (
        b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,2],'
        b'"parameters":{"binary_data_size":8}}],"parameters":{"binary_data_output":true}}'
    )
    length = len(body)
    response = server.http.post(
        "/v2/models/add_one/infer",
        content=body + x.tobytes(),
        headers={"Inference-Header-Content-Length": str(length)},
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"
    split = int(response.headers["inference-header-content-length"])
    header = json.loads(response.content[:split])
    assert header["outputs"] == [
        {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 2],
         "parameters": {"binary_data_size": 8}}
    ]  # fmt: skip
    assert np.frombuffer(response.content[split:], np.float32).tolist() == [2.5, 3.5]


@pytest.mark.parametrize(
    "data", [[1, 2, 3, 4, 5, 6], [[1, 2, 3], [4, 5, 6]]], ids=["flat", "nested"]
)
def test_json_request_flat_and_nested_data(server: Server, data: Sequence[Any]) -> None:
    request = {
        "id": "j",
        "inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [2, 3], "data": data}],
    }
    response = server.http.post("/v2/models/add_one/infer", json=request)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {
        "model_name": "add_one",
        "model_version": "1",
        "id": "j",
        "outputs": [
            {"name": "OUTPUT0", "datatype": "INT32", "shape": [2, 3], "data": [2, 3, 4, 5, 6, 7]}
        ],
    }


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests_from_tritonclient(
    client: triton.InferenceServerClient, algorithm: str
) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    result = client.infer(
        "add_one", [infer_input("INPUT0", x)], request_compression_algorithm=algorithm
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x + 1)
