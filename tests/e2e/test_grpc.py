"""``carpool serve --grpc-port`` end to end through tritonclient.grpc (sync, aio, streaming).

One server per module, REST and gRPC on the same batchers, serves every test model; tests
that read statistics compare before/after snapshots of a model they alone use. Requests are
held in flight with the gated models (tests/server/models.py), never by sleeping.
"""

from __future__ import annotations

import asyncio
import queue
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton
import tritonclient.grpc.aio as triton_aio
from tritonclient.utils import InferenceServerException

import carpool
from carpool.server.grpc.service import STREAM_IN_FLIGHT
from server.conftest import HERE, SAMPLES, Launcher, Server, free_port, wait_until
from server.models import NEGATIVE

MAX_BATCH = 8
BODY_LIMIT = 1_000_000  # --max-body-bytes: the largest gRPC message too
MODELS = ("add_one", "identity", "pair", "upper", "gated", "flaky")
# flaky (gated by its own gate) lets one row wait: queue full is one more request.
CONFIG = "[models.flaky]\nmax_queue_size = 1\n"


@pytest.fixture(scope="module")
def server(serve_module: Launcher, tmp_path_factory: pytest.TempPathFactory) -> Server:
    config = tmp_path_factory.mktemp("grpc") / "carpool.toml"
    config.write_text(CONFIG)
    targets = [f"models:{name}" for name in MODELS]
    flags = ["--max-batch-size", str(MAX_BATCH), "--max-body-bytes", str(BODY_LIMIT)]
    return serve_module(*targets, *flags, "--config", str(config), grpc=True)


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[triton.InferenceServerClient]:
    client = triton.InferenceServerClient(server.grpc_address)
    yield client
    client.close()


@pytest.fixture
async def aio(server: Server) -> AsyncIterator[triton_aio.InferenceServerClient]:
    client = triton_aio.InferenceServerClient(server.grpc_address)
    yield client
    await client.close()


def infer_input(name: str, array: np.ndarray[Any, Any], datatype: str | None = None) -> Any:
    from tritonclient.utils import np_to_triton_dtype

    tensor = triton.InferInput(name, list(array.shape), datatype or np_to_triton_dtype(array.dtype))
    tensor.set_data_from_numpy(array)
    return tensor


def one(value: float) -> list[Any]:
    """One FP32 row ``[value]`` for INPUT0, as the gated models take."""
    return [infer_input("INPUT0", np.array([[value]], np.float32))]


def failure(call: Any, *args: Any, **kwargs: Any) -> tuple[str, str]:
    """The gRPC status name and message of a call that must fail."""
    with pytest.raises(InferenceServerException) as info:
        call(*args, **kwargs)
    return str(info.value.status()).removeprefix("StatusCode."), str(info.value.message())


def requests_total(server: Server, model: str, outcome: str, protocol: str) -> float:
    labels = f'{{model="{model}",outcome="{outcome}",protocol="{protocol}"}} '
    for line in server.metrics().splitlines():
        if line.startswith(f"carpool_requests_total{labels}"):
            return float(line.split()[-1])
    return 0.0


def batch_sizes(stats: Any) -> dict[int, int]:
    return {int(b.batch_size): int(b.compute_infer.count) for b in stats.batch_stats}


def grpc_stats(client: triton.InferenceServerClient, model: str) -> Any:
    (stats,) = client.get_inference_statistics(model).model_stats
    return stats


# ---------------------------------------------------------------- health and metadata


def test_health_metadata_config_and_index(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("pair")
    assert client.is_model_ready("pair", "1")
    assert not client.is_model_ready("no_such_model")
    assert not client.is_model_ready("pair", "2")
    metadata = client.get_server_metadata(as_json=True)
    assert (metadata["name"], metadata["version"]) == ("carpool", carpool.__version__)
    assert "model_configuration" in metadata["extensions"]
    assert client.get_model_metadata("pair", as_json=True) == {
        "name": "pair",
        "versions": ["1"],
        "platform": "python",
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "4"]},
            {"name": "INPUT1", "datatype": "INT64", "shape": ["-1", "4"]},
        ],
        "outputs": [
            {"name": "SUM", "datatype": "FP32", "shape": ["-1", "4"]},
            {"name": "DOUBLED", "datatype": "INT64", "shape": ["-1", "4"]},
        ],
    }
    config = client.get_model_config("pair").config
    assert (config.name, config.max_batch_size) == ("pair", MAX_BATCH)
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("INPUT0", triton.model_config_pb2.TYPE_FP32, [4]),
        ("INPUT1", triton.model_config_pb2.TYPE_INT64, [4]),
    ]
    flaky = client.get_model_config("flaky").config
    assert flaky.dynamic_batching.default_queue_policy.max_queue_size == 1
    index = client.get_model_repository_index().models
    assert sorted((m.name, m.state) for m in index) == sorted((m, "READY") for m in MODELS)
    names = [m.name for m in client.get_inference_statistics().model_stats]
    assert sorted(names) == sorted(MODELS)


# ---------------------------------------------------------------- inference


@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("datatype", sorted(SAMPLES))
def test_identity_round_trips_every_datatype(
    client: triton.InferenceServerClient, datatype: str, rows: int
) -> None:
    array = SAMPLES[datatype][:rows]
    result = client.infer("identity", [infer_input("INPUT0", array, datatype)], request_id="r")
    response = result.get_response()
    assert (response.model_name, response.model_version, response.id) == ("identity", "1", "r")
    (output,) = response.outputs
    assert (output.datatype, list(output.shape)) == (datatype, list(array.shape))
    assert len(response.raw_output_contents) == 1
    got = result.as_numpy("OUTPUT0")
    if datatype == "BYTES":
        assert got.tolist() == array.tolist()
    else:
        assert got.dtype == array.dtype
        assert np.array_equal(got, array)


def test_typed_contents_are_accepted(server: Server) -> None:
    """tritonclient always sends raw contents; other clients send the typed fields."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pb_grpc

    request = pb.ModelInferRequest(model_name="pair", id="typed")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4]).contents.fp32_contents.extend(
        [0.5, 1.5, 2.5, 3.5]
    )
    request.inputs.add(
        name="INPUT1", datatype="INT64", shape=[1, 4]
    ).contents.int64_contents.extend([1, -2, 3, -4])
    with grpc.insecure_channel(server.grpc_address) as channel:
        response = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    result = triton.InferResult(response)
    assert response.id == "typed"
    assert result.as_numpy("SUM").tolist() == [[1.5, -0.5, 5.5, -0.5]]
    assert result.as_numpy("DOUBLED").tolist() == [[2, -4, 6, -8]]


def test_requested_outputs_and_bytes(client: triton.InferenceServerClient) -> None:
    x0 = np.ones((3, 4), np.float32)
    x1 = np.arange(12, dtype=np.int64).reshape(3, 4)
    result = client.infer(
        "pair",
        [infer_input("INPUT0", x0), infer_input("INPUT1", x1)],
        outputs=[triton.InferRequestedOutput("DOUBLED")],
    )
    assert [o.name for o in result.get_response().outputs] == ["DOUBLED"]
    assert np.array_equal(result.as_numpy("DOUBLED"), x1 * 2)
    texts = np.array([[b"hello", b"World"], [b"", "日本".encode()]], object)
    upper = client.infer("upper", [infer_input("TEXT", texts, "BYTES")]).as_numpy("UPPER")
    assert upper.tolist() == [[b"HELLO", b"WORLD"], [b"", "日本".encode()]]


def test_request_larger_than_max_batch_size_is_split_and_reassembled(
    client: triton.InferenceServerClient,
) -> None:
    before = grpc_stats(client, "identity")
    rows = 2 * MAX_BATCH + 4
    x = np.arange(rows * 3, dtype=np.int32).reshape(rows, 3)
    result = client.infer("identity", [infer_input("INPUT0", x)])
    assert np.array_equal(result.as_numpy("OUTPUT0"), x)
    after = grpc_stats(client, "identity")
    assert after.inference_count - before.inference_count == rows
    assert after.execution_count - before.execution_count == 3


def payload(i: int) -> np.ndarray[Any, Any]:
    """Request ``i``'s distinct rows: 1 to 3 rows of 4 values that encode ``i``."""
    rows = 1 + i % 3
    return (i * 100 + np.arange(rows * 4, dtype=np.float32)).reshape(rows, 4)


async def test_200_concurrent_requests_each_get_their_own_answer(
    aio: triton_aio.InferenceServerClient, client: triton.InferenceServerClient
) -> None:
    n = 200
    before = grpc_stats(client, "add_one"), grpc_stats(client, "pair")

    async def call(i: int) -> tuple[str, Any]:
        x = payload(i)
        if i % 2:
            result = await aio.infer("add_one", [infer_input("INPUT0", x)], request_id=str(i))
            return result.get_response().id, result.as_numpy("OUTPUT0")
        inputs = [infer_input("INPUT0", x), infer_input("INPUT1", x.astype(np.int64) - 7)]
        result = await aio.infer("pair", inputs, request_id=str(i))
        return result.get_response().id, (result.as_numpy("SUM"), result.as_numpy("DOUBLED"))

    answers = await asyncio.gather(*(call(i) for i in range(n)))
    for i, (request_id, got) in enumerate(answers):
        assert request_id == str(i)
        x = payload(i)
        if i % 2:
            assert np.array_equal(got, x + 1)
        else:
            x1 = x.astype(np.int64) - 7
            assert np.array_equal(got[0], (x + x1).astype(np.float32))
            assert np.array_equal(got[1], x1 * 2)
    after = grpc_stats(client, "add_one"), grpc_stats(client, "pair")
    for parity, old, new in zip((1, 0), before, after, strict=True):
        rows = sum(len(payload(i)) for i in range(n) if i % 2 == parity)
        assert new.inference_count - old.inference_count == rows
        assert max(batch_sizes(new)) <= MAX_BATCH
    executions = sum(
        n.execution_count - o.execution_count for o, n in zip(before, after, strict=True)
    )
    assert executions < n  # batched: fewer model calls than requests


def test_stream_answers_each_request_on_the_stream(
    client: triton.InferenceServerClient, server: Server
) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for i in range(20):
            client.async_stream_infer(
                "add_one", [infer_input("INPUT0", payload(i))], request_id=str(i)
            )
        client.async_stream_infer("no_such_model", one(1.0), request_id="lost")
        client.async_stream_infer("pair", one(1.0), request_id="bad")
        client.async_stream_infer("add_one", [infer_input("INPUT0", payload(99))], request_id="99")
        got = [answers.get(timeout=30) for _ in range(23)]
    finally:
        client.stop_stream()
    errors = sorted(str(error.message()) for result, error in got if error is not None)
    assert errors[0] == "Request for unknown model: 'no_such_model' is not found"
    assert "missing required input(s) ['INPUT1']" in errors[1]
    results = {r.get_response().id: r.as_numpy("OUTPUT0") for r, e in got if e is None}
    assert sorted(results, key=int) == [*map(str, range(20)), "99"]  # the stream went on
    for request_id, output in results.items():
        assert np.array_equal(output, payload(int(request_id)) + 1)


def test_concurrent_requests_share_one_batch(
    client: triton.InferenceServerClient, server: Server
) -> None:
    """One request holds the worker; MAX_BATCH more queue behind it and leave as one batch:
    statistics over gRPC prove it (inference_count > execution_count)."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        with server.gate_closed("gated"):
            client.async_stream_infer("gated", one(-1.0))
            server.wait_started("gated", 1)
            for i in range(MAX_BATCH):
                client.async_stream_infer("gated", one(float(i)), request_id=str(i))
            wait_until(lambda: server.stats("gated")["pending"] == MAX_BATCH + 1, "queued")
        got = [answers.get(timeout=30) for _ in range(MAX_BATCH + 1)]
    finally:
        client.stop_stream()
    assert all(error is None for _, error in got)
    assert server.batches_started("gated") == [1, MAX_BATCH]
    stats = grpc_stats(client, "gated")
    assert (stats.inference_count, stats.execution_count) == (MAX_BATCH + 1, 2)
    assert batch_sizes(stats) == {1: 1, MAX_BATCH: 1}


def test_batch_stats_time_each_batch_size_over_grpc(
    client: triton.InferenceServerClient, server: Server
) -> None:
    """``ModelStatistics.batch_stats`` carries each size's compute time, as REST does."""
    x = np.zeros((MAX_BATCH + 3, 3), np.float32)
    client.infer("add_one", [infer_input("INPUT0", x)])  # batches of 8 and 3 rows
    stats = grpc_stats(client, "add_one")
    sizes = {int(b.batch_size): b for b in stats.batch_stats}
    assert {3, MAX_BATCH} <= set(sizes)
    for size in (3, MAX_BATCH):
        b = sizes[size]
        for phase in (b.compute_input, b.compute_infer, b.compute_output):
            assert (phase.count, phase.ns > 0) == (b.compute_infer.count, True), size
    per_size = sum(int(b.compute_infer.ns) for b in stats.batch_stats)
    total = int(stats.inference_stats.compute_infer.ns)
    assert abs(per_size - total) <= len(stats.batch_stats)  # ns rounding
    assert server.stats("add_one")["batch_stats"] == [
        {
            "batch_size": int(b.batch_size),
            **{
                phase: {"count": int(getattr(b, phase).count), "ns": int(getattr(b, phase).ns)}
                for phase in ("compute_input", "compute_infer", "compute_output")
            },
        }
        for b in stats.batch_stats
    ]


# ---------------------------------------------------------------- errors


def test_errors_map_to_their_status_codes(client: triton.InferenceServerClient) -> None:
    x = np.ones((1, 4), np.float32)
    assert failure(client.infer, "no_such_model", one(1.0)) == (
        "NOT_FOUND",
        "Request for unknown model: 'no_such_model' is not found",
    )
    assert failure(client.get_model_metadata, "no_such_model")[0] == "NOT_FOUND"
    code, message = failure(
        client.infer, "pair", [infer_input("INPUT0", np.ones((1, 3), np.float32)),
                               infer_input("INPUT1", np.ones((1, 4), np.int64))]
    )  # fmt: skip
    assert (code, "unexpected shape for input 'INPUT0'" in message) == ("INVALID_ARGUMENT", True)
    code, message = failure(
        client.infer, "pair", [infer_input("INPUT0", x), infer_input("INPUT1", x)]
    )
    assert code == "INVALID_ARGUMENT"
    assert "inference input 'INPUT1' data-type is 'FP32'" in message
    code, message = failure(client.infer, "identity", one(1.0), sequence_id=3)
    assert (code, "parameter 'sequence_id'" in message) == ("INVALID_ARGUMENT", True)
    code, message = failure(client.infer, "flaky", one(-1.0))
    assert (code, message) == ("INTERNAL", f"model error: ValueError: {NEGATIVE}")
    code, message = failure(client.register_system_shared_memory, "region", "/key", 64)
    assert (code, "shared memory is not supported" in message) == ("UNIMPLEMENTED", True)
    code, message = failure(client.load_model, "identity")
    assert (code, "--model-control-mode explicit" in message) == ("UNAVAILABLE", True)


def test_a_message_over_the_body_limit_is_resource_exhausted(
    client: triton.InferenceServerClient,
) -> None:
    x = np.zeros(BODY_LIMIT // 4 + 1, np.float32).reshape(1, -1)
    code, message = failure(client.infer, "identity", [infer_input("INPUT0", x)])
    assert code == "RESOURCE_EXHAUSTED"
    assert str(BODY_LIMIT) in message
    assert client.is_server_live()


def test_queue_full_and_queue_timeout_are_unavailable(
    client: triton.InferenceServerClient, server: Server, threads: ThreadPoolExecutor
) -> None:
    with server.gate_closed("flaky"):
        started = len(server.batches_started("flaky"))  # counted before the call can start one
        running = threads.submit(client.infer, "flaky", one(1.0))
        server.wait_started("flaky", started + 1)
        queued = threads.submit(client.infer, "flaky", one(2.0))
        server.wait_queued("flaky", pending=2, queued_rows=1)
        code, message = failure(client.infer, "flaky", one(3.0))
        assert (code, "Exceeds maximum queue size" in message) == ("UNAVAILABLE", True)
    assert running.result().as_numpy("OUTPUT0").tolist() == [[2.0]]
    assert queued.result().as_numpy("OUTPUT0").tolist() == [[3.0]]
    with server.gate_closed("gated"):
        started = len(server.batches_started("gated"))  # counted before the call can start one
        running = threads.submit(client.infer, "gated", one(1.0))
        server.wait_started("gated", started + 1)
        code, message = failure(client.infer, "gated", one(2.0), timeout=50_000)  # 50 ms
        assert (code, "Request timeout expired" in message) == ("UNAVAILABLE", True)
    assert running.result().as_numpy("OUTPUT0").tolist() == [[1.0]]


async def test_a_cancelled_call_withdraws_its_queued_request(
    aio: triton_aio.InferenceServerClient, client: triton.InferenceServerClient, server: Server
) -> None:
    def cancelled() -> float:
        return server.metric("carpool_batcher_requests_total", model="gated", outcome="cancelled")

    before = (
        cancelled(),
        requests_total(server, "gated", "client_closed", "grpc"),
        requests_total(server, "gated", "timeout", "grpc"),
    )
    with server.gate_closed("gated"):
        started = len(server.batches_started("gated"))
        running = asyncio.ensure_future(aio.infer("gated", one(1.0)))
        await asyncio.to_thread(server.wait_started, "gated", started + 1)
        withdrawn = asyncio.ensure_future(aio.infer("gated", one(2.0)))
        await asyncio.to_thread(server.wait_queued, "gated", pending=2, queued_rows=1)
        withdrawn.cancel()
        with pytest.raises(asyncio.CancelledError):
            await withdrawn
        await asyncio.to_thread(wait_until, lambda: cancelled() == before[0] + 1, "a cancel")
        # and a call whose deadline passes while queued
        code, _ = await asyncio.to_thread(
            failure, client.infer, "gated", one(3.0), client_timeout=0.2
        )
        assert code == "DEADLINE_EXCEEDED"
        await asyncio.to_thread(server.wait_queued, "gated", pending=1, queued_rows=0)
        assert server.metric("carpool_requests_in_flight", model="gated") == 1
    assert (await running).as_numpy("OUTPUT0").tolist() == [[1.0]]
    assert server.batches_started("gated")[started:] == [1]  # neither withdrawn call ran
    closed = requests_total(server, "gated", "client_closed", "grpc")
    expired = requests_total(server, "gated", "timeout", "grpc")  # the deadline, server-side
    assert closed - before[1] + expired - before[2] == 2  # withdrawn as its call ended
    assert closed - before[1] >= 1


async def test_rest_and_grpc_at_once_count_consistently(
    aio: triton_aio.InferenceServerClient, server: Server
) -> None:
    n = 40
    labels = [("success", "http"), ("success", "grpc"), ("invalid", "grpc")]
    before = [requests_total(server, "upper", o, p) for o, p in labels]
    rows_before = server.stats("upper")["inference_count"]
    text = np.array([[b"ab"]], object)

    async def over_grpc(i: int) -> None:
        result = await aio.infer("upper", [infer_input("TEXT", text, "BYTES")])
        assert result.as_numpy("UPPER").tolist() == [[b"AB"]]

    async with httpx.AsyncClient(base_url=server.url, timeout=30.0) as http:

        async def over_rest(i: int) -> None:
            doc = {
                "inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": ["ab"]}]
            }
            response = await http.post("/v2/models/upper/infer", json=doc)
            assert response.json()["outputs"][0]["data"] == ["AB"]

        await asyncio.gather(*(f(i) for i in range(n) for f in (over_grpc, over_rest)))
    with pytest.raises(InferenceServerException):
        await aio.infer("upper", one(1.0))  # FP32 for a BYTES input: invalid
    after = [requests_total(server, "upper", o, p) for o, p in labels]
    assert [a - b for a, b in zip(after, before, strict=True)] == [n, n, 1]
    stats = server.stats("upper")
    assert stats["inference_count"] - rows_before == 2 * n
    assert stats["pending"] == 0


# ---------------------------------------------------------------- lifecycle


@pytest.mark.slow
def test_sigterm_answers_grpc_calls_in_flight_and_exits_0(
    serve: Launcher, threads: ThreadPoolExecutor
) -> None:
    server = serve("models:gated", "--max-batch-size", "2", grpc=True)
    clients = [triton.InferenceServerClient(server.grpc_address) for _ in range(4)]
    try:
        with server.gate_closed("gated"):
            calls = [threads.submit(c.infer, "gated", one(float(i))) for i, c in enumerate(clients)]
            wait_until(
                lambda: server.metric("carpool_requests_in_flight", model="gated") == len(calls),
                "gRPC calls in flight",
            )
            server.terminate()

            def refused() -> bool:
                fresh = triton.InferenceServerClient(server.grpc_address)
                try:
                    return not fresh.is_server_ready()
                except InferenceServerException:
                    return True
                finally:
                    fresh.close()

            wait_until(refused, "gRPC to stop accepting calls")
            assert not any(call.done() for call in calls)
        answers = [call.result().as_numpy("OUTPUT0").tolist() for call in calls]
    finally:
        for c in clients:
            c.close()
    assert answers == [[[float(i)]] for i in range(len(calls))]
    assert server.wait_exit() == 0
    assert "Traceback" not in server.stderr()


@pytest.mark.slow
def test_grpc_calls_past_the_drain_timeout_are_unavailable(
    serve: Launcher, threads: ThreadPoolExecutor
) -> None:
    """The drain deadline is REST's: what is unanswered then is told so, never dropped."""
    server = serve("models:gated", "--drain-timeout", "0.2", grpc=True)
    client = triton.InferenceServerClient(server.grpc_address)
    try:
        with server.gate_closed("gated"):
            calls = [threads.submit(failure, client.infer, "gated", one(1.0)) for _ in range(3)]
            wait_until(
                lambda: server.metric("carpool_requests_in_flight", model="gated") == 3,
                "gRPC calls in flight",
            )
            server.terminate()
            outcomes = [call.result() for call in calls]  # while the model is still blocked
    finally:
        client.close()
    for code, message in outcomes:
        assert (code, "stopping" in message) == ("UNAVAILABLE", True)
    assert server.wait_exit() == 0


def test_a_taken_grpc_port_refuses_to_start(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [sys.executable, "-m", "carpool", "serve", "models:identity",
                   "--port", str(free_port()), "--grpc-port", str(port)]  # fmt: skip
        result = subprocess.run(command, cwd=HERE, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert f"cannot listen for gRPC on 127.0.0.1:{port}" in result.stderr


def test_rest_only_paths_never_import_grpc() -> None:
    code = (
        "import sys, carpool, carpool.cli, carpool.server.serve\n"
        "app = carpool.server.serve.build_app(carpool.server.config.ServerConfig(grpc_port=0))\n"
        "assert app.grpc_address is None\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('grpc', 'tritonclient')]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_stream_runs_at_most_its_bound_of_requests_at_once(
    client: triton.InferenceServerClient, server: Server
) -> None:
    """A stream is read no further while STREAM_IN_FLIGHT of its requests run: 100 sent at
    once, a gated model, and never more than the bound in flight; all answered after."""
    sent = STREAM_IN_FLIGHT + 36
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        with server.gate_closed("gated"):
            for i in range(sent):
                client.async_stream_infer("gated", one(float(i)), request_id=str(i))
            wait_until(lambda: server.stats("gated")["pending"] == STREAM_IN_FLIGHT, "the bound")
            for _ in range(20):  # and it stays there: the rest wait unread on the stream
                assert server.stats("gated")["pending"] == STREAM_IN_FLIGHT
        got = [answers.get(timeout=30) for _ in range(sent)]
    finally:
        client.stop_stream()
    assert all(error is None for _, error in got)
    assert sorted(int(result.get_response().id) for result, _ in got) == list(range(sent))


def test_calls_past_grpc_max_concurrent_rpcs_are_resource_exhausted(serve: Launcher) -> None:
    server = serve("models:gated", "--grpc-max-concurrent-rpcs", "2", grpc=True)
    client = triton.InferenceServerClient(server.grpc_address)
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    try:
        with server.gate_closed("gated"):
            for value in (1.0, 2.0):
                client.async_infer(
                    "gated", one(value), lambda result, error: answers.put((result, error))
                )
            wait_until(lambda: server.stats("gated")["pending"] == 2, "two calls running")
            assert failure(client.infer, "gated", one(3.0))[0] == "RESOURCE_EXHAUSTED"
        got = [answers.get(timeout=30) for _ in range(2)]
        assert all(error is None for _, error in got)
        assert client.infer("gated", one(4.0)).as_numpy("OUTPUT0").tolist() == [[4.0]]
    finally:
        client.close()
