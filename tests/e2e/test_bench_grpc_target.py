"""A model behind a v2 gRPC server (``carpool.bench.targets.grpc_target``): targets, the
``ModelInferRequest`` bytes sent, ``ModelStatistics`` as server-side figures, and load sent
through a real ``grpc.aio`` channel: to a small servicer on a loopback port here, and to
``carpool serve demo --grpc-port``."""

from __future__ import annotations

import pickle
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from carpool.bench.report.data import Report, ServerSide
from carpool.bench.targets.base import BenchError, target_kind
from carpool.bench.targets.grpc_target import (
    GrpcAddress,
    GrpcClient,
    GrpcStats,
    GrpcTarget,
    encode_request,
    parse_grpc,
    stats_of,
)
from carpool.bench.targets.payload import InputSpec, RequestSpec, is_unique
from carpool.cli import main
from server.conftest import Launcher, Server, free_port

METADATA = {
    "name": "echo",
    "versions": ["1"],
    "platform": "fake",
    "inputs": [{"name": "X", "datatype": "FP32", "shape": [-1, 3]}],
    "outputs": [{"name": "Y", "datatype": "FP32", "shape": [-1, 3]}],
}


# ----------------------------------------------------------------------------- targets


@pytest.mark.parametrize(
    ("text", "model", "expected"),
    [
        ("grpc://127.0.0.1:8001", "demo", GrpcAddress("127.0.0.1:8001", "demo")),
        ("grpc://h:1/", "m", GrpcAddress("h:1", "m")),
        ("grpc://h:1/v2/models/demo", None, GrpcAddress("h:1", "demo")),
        ("grpc://h:1/v2/models/demo", "demo", GrpcAddress("h:1", "demo")),
        ("grpc://h:1/v2/models/m/versions/3", None, GrpcAddress("h:1", "m", "3")),
    ],
)
def test_grpc_targets(text: str, model: str | None, expected: GrpcAddress) -> None:
    assert parse_grpc(text, model) == expected
    assert target_kind(text) == "grpc"


def test_a_grpc_target_prints_as_the_model_it_names() -> None:
    assert str(GrpcAddress("h:1", "m", "3")) == "grpc://h:1/v2/models/m/versions/3"
    assert str(GrpcAddress("h:1", "demo")) == "grpc://h:1/v2/models/demo"


@pytest.mark.parametrize(
    ("text", "model", "message"),
    [
        ("grpc://h:1", None, "TARGET 'grpc://h:1' names no model: add --model NAME"),
        ("grpc://h", "m", "TARGET 'grpc://h' must be grpc://HOST:PORT (with --model NAME) or "
         "grpc://HOST:PORT/v2/models/NAME"),
        ("grpc://h:1/models/m", "m", "TARGET 'grpc://h:1/models/m' must be grpc://HOST:PORT "
         "(with --model NAME) or grpc://HOST:PORT/v2/models/NAME"),
        ("grpc://h:1/v2/models/a", "b", "TARGET 'grpc://h:1/v2/models/a' names model 'a' but "
         "--model says 'b'"),
    ],
)  # fmt: skip
def test_a_grpc_target_without_one_model_is_refused(
    text: str, model: str | None, message: str
) -> None:
    with pytest.raises(BenchError) as caught:
        parse_grpc(text, model)
    assert str(caught.value) == message


# ----------------------------------------------------------------------------- requests


def test_a_request_is_a_model_infer_request_with_raw_contents() -> None:
    spec = RequestSpec((InputSpec("X", "FP32", (1, 3)), InputSpec("T", "BYTES", (1, 2))))
    x = np.array([[1.0, -2.0, 0.5]], np.float32)
    texts = np.array([[b"hi", "h\u00e9".encode()]], object)
    message = pb.ModelInferRequest.FromString(
        encode_request({"X": x, "T": texts}, spec, model="m", version="2")
    )
    assert (message.model_name, message.model_version) == ("m", "2")
    assert [(t.name, t.datatype, list(t.shape)) for t in message.inputs] == [
        ("X", "FP32", [1, 3]),
        ("T", "BYTES", [1, 2]),
    ]
    assert list(message.outputs) == []  # every output comes back
    assert list(message.raw_input_contents) == [
        x.tobytes(),
        b"\x02\x00\x00\x00hi\x03\x00\x00\x00h\xc3\xa9",  # 4-byte little-endian lengths
    ]


def test_a_request_the_spec_cannot_carry_is_a_value_error() -> None:
    spec = RequestSpec((InputSpec("X", "INT32", (1, 3)),))
    with pytest.raises(ValueError, match="the request has no input 'X'"):
        encode_request({"Y": np.zeros((1, 3))}, spec, model="m")
    with pytest.raises(ValueError, match="input 'X': a float64 array cannot be sent as INT32"):
        encode_request({"X": np.zeros((1, 3))}, spec, model="m")


def test_a_client_pickles_for_client_processes() -> None:
    client = GrpcClient("h:1", (b"a", b"b"), 3.0)
    assert pickle.loads(pickle.dumps(client)) == client


# ----------------------------------------------------------------------------- statistics


def statistics(executions: int, sizes: dict[int, int], *, model_ns: int = 0) -> Any:
    """A ``ModelStatistics`` with model time in the request-level ``compute_infer`` only
    (0 ns in ``batch_stats``); queue waits of 1 ms per row."""
    rows = sum(size * n for size, n in sizes.items())
    stats = pb.ModelStatistics(name="m", inference_count=rows, execution_count=executions)
    stats.inference_stats.queue.count = rows
    stats.inference_stats.queue.ns = rows * 1_000_000
    stats.inference_stats.compute_infer.count = rows
    stats.inference_stats.compute_infer.ns = model_ns
    for size, n in sizes.items():
        stats.batch_stats.add(batch_size=size).compute_infer.count = n
    return stats


def test_statistics_read_as_counters() -> None:
    assert stats_of(statistics(3, {1: 1, 4: 2}, model_ns=6_000_000)) == GrpcStats(
        executions=3,
        inferences=9,
        batch_sizes={1: 1, 4: 2},
        queue_count=9,
        queue_ns=9_000_000,
        model_ns=6_000_000,
    )


def test_model_time_per_batch_size_is_preferred_where_the_server_gives_it() -> None:
    triton = statistics(2, {2: 2}, model_ns=99)  # Triton: request-level is per request
    triton.batch_stats[0].compute_infer.ns = 8_000_000
    assert stats_of(triton).model_ns == 8_000_000


def test_a_window_of_statistics_is_the_steps_server_side() -> None:
    target = GrpcTarget(GrpcAddress("h:1", "m"), METADATA, stub=None)
    before = stats_of(statistics(2, {1: 2}, model_ns=2_000_000))
    after = stats_of(statistics(6, {1: 3, 4: 2, 8: 1}, model_ns=10_000_000))
    assert target.server_side(before, after, latency_sum_s=0.05) == ServerSide(
        batches=4,
        rows=17,  # 1 + 2 * 4 + 8
        batch_size_mean=17 / 4,
        batch_sizes={"1": 1, "4": 2, "8": 1},
        queue_wait_ms_mean=1.0,
        model_ms_mean=2.0,  # 8 ms over 4 model calls
        queue_wait_share=0.017 / 0.05,
        batch_size_floors={},  # each size exactly: "4" is 4 rows, not 2 to 4
    )
    assert target.server_side(None, after, latency_sum_s=1.0) is None
    idle = stats_of(statistics(0, {}))
    assert target.server_side(idle, idle, latency_sum_s=1.0) == ServerSide(
        batches=0,
        rows=0,
        batch_size_mean=0.0,
        batch_sizes={},
        queue_wait_ms_mean=0.0,
        model_ms_mean=0.0,
        queue_wait_share=0.0,
        batch_size_floors={},
    )


# ----------------------------------------------------------------------------- a servicer here


class Echo(pb_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """``echo``: metadata, statistics counting its calls; infer fails on a negative X."""

    def __init__(self) -> None:
        self.calls = 0
        self.requests: list[Any] = []

    async def ModelMetadata(self, request: Any, context: Any) -> Any:  # gRPC's method names
        if request.name != "echo":
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no model {request.name!r}")
        answer = pb.ModelMetadataResponse(name="echo", versions=["1"], platform="fake")
        answer.inputs.add(name="X", datatype="FP32", shape=[-1, 3])
        answer.outputs.add(name="Y", datatype="FP32", shape=[-1, 3])
        return answer

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        self.requests.append(request)
        x = np.frombuffer(request.raw_input_contents[0], np.float32)
        if (x < 0).any():
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "negative")
        self.calls += 1
        return pb.ModelInferResponse(model_name="echo", raw_output_contents=[x.tobytes()])

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        answer = pb.ModelStatisticsResponse()
        answer.model_stats.append(statistics(self.calls, {1: self.calls} if self.calls else {}))
        return answer


@pytest.fixture
async def echo() -> AsyncIterator[tuple[str, Echo]]:
    server = grpc.aio.server()
    servicer = Echo()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield f"grpc://127.0.0.1:{port}", servicer
    await server.stop(None)


async def test_load_through_a_grpc_channel_counts_status_codes(echo: tuple[str, Echo]) -> None:
    url, servicer = echo
    async with GrpcTarget.connect(url, "echo") as target:
        assert target.metadata == METADATA
        assert (target.kind, target.name, str(target)) == ("grpc", "echo", url + "/v2/models/echo")
        spec = RequestSpec((InputSpec("X", "FP32", (1, 3)),))
        rows = [np.full((1, 3), v, np.float32) for v in (1.0, -1.0, 2.0)]
        client = target.client([{"X": r} for r in rows], spec, timeout_s=10.0)
        before = await target.snapshot()
        async with client.open(4) as send:
            kinds = [await send(i) for i in range(6)]
        after = await target.snapshot()
    assert kinds == [None, "INVALID_ARGUMENT", None] * 2
    assert [np.frombuffer(r.raw_input_contents[0], np.float32)[0] for r in servicer.requests] == [
        1.0,
        -1.0,
        2.0,
    ] * 2
    assert before == GrpcStats(0, 0, {}, 0, 0, 0)
    assert after is not None
    assert (after.executions, after.inferences, after.batch_sizes) == (4, 4, {1: 4})


async def test_a_share_of_the_sends_are_the_others(echo: tuple[str, Echo]) -> None:
    url, servicer = echo
    async with GrpcTarget.connect(url, "echo") as target:
        spec = RequestSpec((InputSpec("X", "FP32", (1, 3)),))
        repeated = [{"X": np.full((1, 3), v, np.float32)} for v in (1.0, 2.0)]
        others = [{"X": np.full((1, 3), 10.0 + v, np.float32)} for v in range(50)]
        client = target.client(repeated, spec, timeout_s=10.0, others=others, repeat_fraction=0.5)
        async with client.open(4) as send:
            assert [await send(i) for i in range(40)] == [None] * 40
    sent = [float(np.frombuffer(r.raw_input_contents[0], np.float32)[0]) for r in servicer.requests]
    expected = [10.0 + i % 50 if is_unique(i, 0.5) else 1.0 + i % 2 for i in range(40)]
    assert sent == expected
    assert 10 < sum(v >= 10.0 for v in sent) < 30


async def test_a_model_the_server_does_not_have_is_a_usage_error(echo: tuple[str, Echo]) -> None:
    url, _ = echo
    with pytest.raises(BenchError) as caught:
        async with GrpcTarget.connect(url, "nope"):
            pass
    assert str(caught.value) == f"{url}/v2/models/nope answered NOT_FOUND: no model 'nope'"


async def test_an_unreachable_grpc_server_is_a_one_line_usage_error() -> None:
    url = f"grpc://127.0.0.1:{free_port()}"
    with pytest.raises(BenchError) as caught:
        async with GrpcTarget.connect(url, "demo"):
            pass
    message = str(caught.value)
    assert message.startswith(f"cannot reach {url}: ")
    assert message.endswith("; is the server running?")
    assert "\n" not in message


# ----------------------------------------------------------------------------- carpool serve


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    launcher = Launcher(tmp_path_factory.mktemp("servers"))
    yield launcher("demo", grpc=True)
    launcher.close()


def test_carpool_bench_over_grpc_against_carpool_serve(
    demo: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = demo.stats("demo")["inference_count"]
    path = tmp_path / "grpc.json"
    target = f"grpc://{demo.grpc_address}"
    code = main(["bench", target, "--model", "demo", "--concurrency", "4", "--requests", "60",
                 "--warmup", "0", "--json", str(path)])  # fmt: skip
    out, err = capsys.readouterr()
    assert (code, err) == (0, ""), out
    report = Report.load(path)
    assert (report.kind, report.model) == ("grpc", "demo")
    assert report.target == f"{target}/v2/models/demo"
    assert (report.settings["encoding"], report.settings["model"]) == ("raw", "demo")
    assert report.client["connections"] == "one HTTP/2 channel per client process"
    (step,) = report.steps
    assert (step.requests, step.ok, step.errors) == (60, 60, {})
    assert step.server is not None  # ModelStatistics was read around the window
    assert 1 <= step.server.batches <= step.server.rows <= 60
    assert demo.stats("demo")["inference_count"] == before + 60
    assert f"demo on {target}/v2/models/demo (grpc)" in out


def test_a_grpc_target_takes_no_http_encoding(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "grpc://127.0.0.1:1", "--model", "demo", "--encoding", "binary"])
    assert code == 2
    assert capsys.readouterr().err == (
        "carpool bench: --encoding applies to HTTP targets; gRPC sends raw tensors\n"
    )
