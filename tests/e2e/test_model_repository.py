"""``carpool serve ./models``: a model repository end to end, through tritonclient.

One repository holds an ONNX graph with no carpool.toml, a graph without a batch axis, a
Python model with ragged inputs padded in length buckets, a static-shape model with allowed
batch sizes, a model in numbered version folders, a TorchScript file, and a broken folder
that must not stop the others.
"""

from __future__ import annotations

import textwrap
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
import pytest
import torch
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from backends import onnx_graphs
from server.conftest import Server, json_tensor

# One server for the module, importing torch and onnxruntime and loading nine models: ~4 s.
pytestmark = pytest.mark.slow

Array = np.ndarray[Any, Any]

TOKENS_MODEL = """
import numpy as np

def model(batch):
    ids = batch["ids"]
    rows = len(ids)
    return {
        "doubled": ids * 2,
        "count": batch["lengths"].reshape(rows, 1),
        "padded_to": np.full((rows, 1), ids.shape[1], dtype=np.int64),
    }
"""

TOKENS_TOML = """
max_batch_size = 16
policy = "fixed"
max_wait_ms = 400
inputs = ["ids:INT64:-1"]
outputs = ["doubled:INT64:-1", "count:INT64:1", "padded_to:INT64:1"]

[padding]
inputs = { ids = -7 }
buckets = [4, 16]
lengths = "lengths"
outputs = { doubled = 0 }
"""

MODULE_MODEL = """
import torch


class Affine(torch.nn.Module):
    def forward(self, x, shift):
        return x * 3, x.sum(dim=1, keepdim=True) + shift


model = Affine()
"""

MODULE_TOML = """
inputs = ["x:FP32:3", "shift:FP32:1"]
outputs = ["scaled:FP32:3", "total:FP32:1"]
"""

STATIC_MODEL = """
import numpy as np

def model(x):
    return {"y": x + 1, "seen": np.full((len(x), 1), len(x), dtype=np.int64)}
"""

STATIC_TOML = """
allowed_batch_sizes = [4, 8]
policy = "fixed"
max_wait_ms = 200
inputs = ["x:FP32:2"]
outputs = ["y:FP32:2", "seen:INT64:1"]
"""


class Doubler(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 - 1


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def make_repository(root: Path) -> Path:
    for folder in ("scorer", "fixed", "torchy"):
        (root / folder).mkdir(parents=True)
    onnx_graphs.batch_probe(root / "scorer" / "model.onnx")  # nothing else: the graph says it
    onnx_graphs.static(root / "fixed" / "model.onnx")
    _write(root / "tokens" / "model.py", TOKENS_MODEL)
    _write(root / "tokens" / "carpool.toml", TOKENS_TOML)
    _write(root / "module" / "model.py", MODULE_MODEL)
    _write(root / "module" / "carpool.toml", MODULE_TOML)
    _write(root / "static" / "model.py", STATIC_MODEL)
    _write(root / "static" / "carpool.toml", STATIC_TOML)
    for version, offset in (("1", 100), ("3", 300)):
        _write(
            root / "versioned" / version / "model.py", f"def model(x):\n    return x + {offset}\n"
        )
    with warnings.catch_warnings():  # TorchScript is deprecated in torch 2.13, still common
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.script(Doubler()).save(str(root / "torchy" / "model.pt"))
    _write(root / "torchy" / "carpool.toml", 'inputs = ["x:FP32:3"]\noutputs = ["y:FP32:3"]\n')
    _write(root / "broken" / "model.onnx", "this is not an ONNX graph")
    _write(root / "empty" / "README.md", "no model here")
    return root


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repository(tmp_path_factory.mktemp("repo") / "models")


@pytest.fixture(scope="module")
def server(serve_module: Any, repository: Path) -> Server:
    return serve_module(str(repository))  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[triton.InferenceServerClient]:
    client = triton.InferenceServerClient(server.address)
    yield client
    client.close()


def infer(
    client: triton.InferenceServerClient, model: str, name: str, array: Array, datatype: str
) -> triton.InferResult:
    tensor = triton.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=True)
    return client.infer(model, [tensor])


def infer_concurrently(
    server: Server, model: str, name: str, arrays: list[Array], datatype: str
) -> list[triton.InferResult]:
    """One request per array, all at once, each on its own connection (a tritonclient
    client is not shared between threads)."""

    def one(array: Array) -> triton.InferResult:
        client = triton.InferenceServerClient(server.address)
        try:
            return infer(client, model, name, array, datatype)
        finally:
            client.close()

    with ThreadPoolExecutor(len(arrays)) as pool:
        return list(pool.map(one, arrays))


# ---------------------------------------------------------------- what loaded


def test_repository_index_lists_every_model_with_its_state(
    server: Server, repository: Path
) -> None:
    index = server.http.post("/v2/repository/index").json()
    states = {entry["name"]: entry["state"] for entry in index}
    assert states == {
        "broken": "UNAVAILABLE",
        "empty": "UNAVAILABLE",
        "fixed": "READY",
        "module": "READY",
        "scorer": "READY",
        "static": "READY",
        "tokens": "READY",
        "torchy": "READY",
        "versioned": "READY",
    }
    reasons = {entry["name"]: entry["reason"] for entry in index}
    assert reasons["broken"].startswith(f"{repository / 'broken'}: ")
    assert "model.onnx" in reasons["broken"]
    assert reasons["empty"] == (
        f"{repository / 'empty'}: no model file in {repository / 'empty'}: add a .onnx, .pt "
        'or model.py file (or name it with file = "..." in carpool.toml)'
    )


def test_broken_model_is_reported_and_the_others_serve(
    server: Server, client: triton.InferenceServerClient
) -> None:
    assert client.is_server_ready()
    assert not client.is_model_ready("broken")
    assert client.is_model_ready("scorer")
    ready = server.http.get("/v2/models/broken/ready")
    assert ready.status_code == 503
    assert "broken" in ready.json()["error"]
    metadata = server.http.get("/v2/models/broken")
    assert metadata.status_code == 400
    assert metadata.json()["error"].startswith("Model 'broken' is not ready: failed to load: ")
    assert "model 'broken' is unavailable" in server.stderr()


def test_onnx_folder_without_carpool_toml_takes_its_signature_from_the_graph(
    client: triton.InferenceServerClient,
) -> None:
    metadata = client.get_model_metadata("scorer")
    assert metadata["platform"] == "onnxruntime_onnx"
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    assert metadata["outputs"] == [
        {"name": "y", "datatype": "FP32", "shape": [-1, 4]},
        {"name": "seen", "datatype": "INT64", "shape": [-1, 1]},
    ]
    assert client.get_model_config("scorer")["max_batch_size"] == 32  # the server default
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    result = infer(client, "scorer", "x", x, "FP32")
    np.testing.assert_array_equal(result.as_numpy("y"), x * 2)


def test_graph_without_a_batch_axis_is_served_unbatched(
    server: Server, client: triton.InferenceServerClient
) -> None:
    metadata = client.get_model_metadata("fixed")
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [2, 3]}]
    config = client.get_model_config("fixed")
    assert config["max_batch_size"] == 0
    assert "dynamic_batching" not in config
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    result = infer(client, "fixed", "x", x, "FP32")
    np.testing.assert_array_equal(result.as_numpy("y"), x * 2)
    wrong = infer_status(server, "fixed", [1, 2, 3])
    assert wrong == (
        400,
        "unexpected shape for input 'x' for model 'fixed'. Expected [2,3], got [1,2,3] "
        "(the model does not batch: send exactly its shape)",
    )
    assert "batching off" in server.stderr()


def infer_status(server: Server, model: str, shape: list[int]) -> tuple[int, str]:
    count = int(np.prod(shape))
    response = server.infer(model, {"inputs": [json_tensor("x", "FP32", shape, [0.0] * count)]})
    return response.status_code, response.json().get("error", "")


def test_highest_version_folder_is_served(client: triton.InferenceServerClient) -> None:
    assert client.get_model_metadata("versioned")["versions"] == ["3"]
    result = infer(client, "versioned", "INPUT0", np.zeros((1, 2), np.float32), "FP32")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [[300.0, 300.0]])


def test_torchscript_file_in_a_folder(client: triton.InferenceServerClient) -> None:
    metadata = client.get_model_metadata("torchy")
    assert metadata["platform"] == "pytorch_libtorch"
    x = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32)
    result = infer(client, "torchy", "x", x, "FP32")
    np.testing.assert_array_equal(result.as_numpy("y"), x * 2 - 1)


def test_torch_module_with_two_inputs_and_two_outputs(client: triton.InferenceServerClient) -> None:
    assert client.get_model_metadata("module")["platform"] == "pytorch"
    x = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32)
    shift = np.array([[10], [20]], dtype=np.float32)
    tensors = []
    for name, array in (("shift", shift), ("x", x)):  # not in forward's order
        tensor = triton.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    result = client.infer("module", tensors)
    np.testing.assert_array_equal(result.as_numpy("scaled"), x * 3)
    np.testing.assert_array_equal(result.as_numpy("total"), [[16], [35]])


# ---------------------------------------------------------------- padding


def test_ragged_requests_are_padded_per_bucket_and_come_back_unpadded(
    server: Server, client: triton.InferenceServerClient
) -> None:
    before = server.stats("tokens")["execution_count"]
    requests = [
        np.array([[1, 2]], dtype=np.int64),  # bucket 4
        np.array([[3, 4, 5]], dtype=np.int64),  # bucket 4
        np.array([[6, 7, 8], [9, 10, 11]], dtype=np.int64),  # bucket 4, two rows
        np.arange(10, dtype=np.int64).reshape(1, 10),  # bucket 16
        np.arange(12, dtype=np.int64).reshape(1, 12),  # bucket 16
    ]
    results = infer_concurrently(server, "tokens", "ids", requests, "INT64")
    for ids, result in zip(requests, results, strict=True):
        np.testing.assert_array_equal(result.as_numpy("doubled"), ids * 2)
        np.testing.assert_array_equal(result.as_numpy("count"), [[ids.shape[1]]] * len(ids))
    padded = [int(result.as_numpy("padded_to")[0, 0]) for result in results]
    assert padded == [3, 3, 3, 12, 12]  # to the longest of its bucket's batch, not beyond
    assert server.stats("tokens")["execution_count"] - before == 2  # one batch per bucket


# ---------------------------------------------------------------- allowed batch sizes


def test_static_model_sees_only_allowed_batch_sizes(
    server: Server, client: triton.InferenceServerClient
) -> None:
    assert client.get_model_config("static")["max_batch_size"] == 8
    inputs = [np.full((1, 2), i, dtype=np.float32) for i in range(5)]
    results = infer_concurrently(server, "static", "x", inputs, "FP32")
    for x, result in zip(inputs, results, strict=True):
        np.testing.assert_array_equal(result.as_numpy("y"), x + 1)
    seen = {int(result.as_numpy("seen")[0, 0]) for result in results}
    assert seen <= {4, 8}


def test_unknown_model_is_still_404(client: triton.InferenceServerClient) -> None:
    with pytest.raises(
        InferenceServerException, match="Request for unknown model: 'nope' is not found"
    ):
        client.get_model_metadata("nope")


def test_onnx_results_equal_onnxruntime_alone(
    server: Server, client: triton.InferenceServerClient, tmp_path: Path
) -> None:
    path = onnx_graphs.batch_probe(tmp_path / "probe.onnx")
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rows = [
        np.random.default_rng(i).normal(size=(1 + i % 3, 4)).astype(np.float32) for i in range(12)
    ]
    results = infer_concurrently(server, "scorer", "x", rows, "FP32")
    for x, result in zip(rows, results, strict=True):
        (alone, _) = session.run(None, {"x": x})
        np.testing.assert_allclose(result.as_numpy("y"), alone, rtol=0, atol=0)
