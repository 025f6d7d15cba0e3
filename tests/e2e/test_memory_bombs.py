"""Requests built to cost the server memory, one after another, against a ``carpool serve``
held to 1 GiB of data (RLIMIT_DATA: what malloc and numpy's buffers count against): each
gets its answer, a refusal or a result, ``/v2/health/ready`` answers within 1 s all along
(or half the longest bomb's time, on a machine that slow), and the server lives to the end.

Each of these cost a gigabyte or more, or stalled the loop for seconds, before issue 19:
a JSON body of compact floats (16x its size), gRPC typed contents (14x), bytes contents
(100x), a stream that is never read, a large call without a key, tens of thousands of
texts or rows in one small request, and a shape of 2**59 empty rows.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from server.conftest import Launcher, Server

GIB = 1 << 30
MIB = 1 << 20
KEY = "bombs-key"
HEALTH_WITHIN_S = 1.0  # on a machine where no bomb takes more than 2 s (see _Prober.within)
pytestmark = pytest.mark.timeout(240)


class _Prober:
    """``/v2/health/ready`` every 50 ms on a fresh connection: the slowest answer, and every
    answer that was not a 200."""

    def __init__(self, url: str) -> None:
        self._url = url
        self.slowest = 0.0
        self.longest_bomb = 0.0
        self.failures: list[str] = []
        self.probes = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    @contextmanager
    def bomb(self) -> Iterator[None]:
        """Time one bomb, from sending it to its answer."""
        started = time.monotonic()
        yield
        self.longest_bomb = max(self.longest_bomb, time.monotonic() - started)

    def within(self) -> float:
        """The bound on the slowest answer: HEALTH_WITHIN_S, or half the longest bomb's time
        where the machine is slow enough for that to be more. A loop blocked by a bomb keeps
        health waiting about the whole of it; a loop that is not waits in proportion to how
        loaded the machine is (2 cores: the JSON floats took 1.9 s and health 0.4 s at worst
        when quiet, 6.6 s and 1.6 s under a load of 5)."""
        return max(HEALTH_WITHIN_S, self.longest_bomb / 2)

    def _run(self) -> None:
        # One client, keeping no connection: a fresh one a probe, and no SSL context built
        # a probe (some 40 ms of CPU each, counted in the answer's time).
        fresh = httpx.Limits(max_keepalive_connections=0)
        with httpx.Client(timeout=5.0, limits=fresh) as client:
            while not self._done.wait(0.05):
                started = time.monotonic()
                try:
                    status = client.get(self._url).status_code
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))
                    continue
                self.slowest = max(self.slowest, time.monotonic() - started)
                self.probes += 1
                if status != 200:
                    self.failures.append(str(status))


def _floats_json(count: int) -> bytes:
    run = ",".join(["0.125"] * 100_000)  # compact: 6 bytes a number
    numbers = ",".join([run] * (count // 100_000))
    return b'{"inputs":[{"name":"X","datatype":"FP32","shape":[1,%d],"data":[%s]}]}' % (
        count,
        numbers.encode(),
    )


@pytest.fixture
def server(serve: Launcher, tmp_path: Path) -> Server:
    config = tmp_path / "carpool.toml"
    config.write_text("[models.lengths]\nopenai = true\n")
    return serve(
        "models:rowsum",
        "models:lengths",
        "--config", str(config),
        "--api-key", KEY,
        "--max-batch-size", "4",
        grpc=True,
        data_limit=GIB,
    )  # fmt: skip


def _grpc_call(server: Server, request: Any, *, key: bool = True) -> Any:
    metadata = [("x-api-key", KEY)] if key else []
    limit = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    with grpc.insecure_channel(server.grpc_address, options=limit) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        try:
            return stub.ModelInfer(request, metadata=metadata, timeout=60)
        except grpc.RpcError as exc:
            return exc.code()


def _sum_of(reply: Any) -> float:
    return float(np.frombuffer(reply.raw_output_contents[0], dtype=np.float32)[0])


DATA = np.full(12 * MIB, 0.5, dtype=np.float32)  # 48 MiB, summing to DATA.size / 2


def _binary_body() -> tuple[bytes, dict[str, str]]:
    parameters = b'"parameters":{"binary_data_size":%d}' % DATA.nbytes
    header = b'{"inputs":[{"name":"X","datatype":"FP32","shape":[1,%d],%s}]}' % (
        DATA.size,
        parameters,
    )
    return header + DATA.tobytes(), {"Inference-Header-Content-Length": str(len(header))}


def _grpc_requests() -> dict[str, Any]:
    typed = pb.ModelInferRequest(model_name="rowsum")
    tensor = typed.inputs.add(name="X", datatype="FP32", shape=[1, DATA.size])
    tensor.contents.fp32_contents.extend(DATA)
    raw = pb.ModelInferRequest(model_name="rowsum", raw_input_contents=[DATA.tobytes()])
    raw.inputs.add(name="X", datatype="FP32", shape=[1, DATA.size])
    texts = pb.ModelInferRequest(model_name="lengths")
    tensor = texts.inputs.add(name="TEXT", datatype="BYTES", shape=[1_000_000, 1])
    tensor.contents.bytes_contents.extend([b"a"] * 1_000_000)
    return {"typed": typed, "raw": raw, "texts": texts}


def test_memory_bombs_are_answered_one_after_another_within_1_gib(server: Server) -> None:
    # Every body is built first: building one holds this process's GIL, which would stall
    # the prober and read as the server's delay.
    floats, count = _floats_json(10_000_000), 10_000_000
    binary, binary_headers = _binary_body()
    calls = _grpc_requests()
    http = httpx.Client(base_url=server.url, headers={"x-api-key": KEY}, timeout=60.0)
    with http, _Prober(f"{server.url}/v2/health/ready") as prober:
        # 30,001 short texts in a 150 KB body: refused before any is tokenized.
        texts = {"model": "lengths", "input": ["ab"] * 30_001}
        answer = http.post("/v1/embeddings", json=texts)
        assert (answer.status_code, answer.json()["error"]["code"]) == (413, "too_many_inputs")

        # 30,001 rows in one request: refused naming the setting.
        rows = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [30_001, 1],
                            "data": [1.0] * 30_001}]}  # fmt: skip
        answer = http.post("/v2/models/rowsum/infer", json=rows)
        assert answer.status_code == 400
        assert "--max-rows-per-request" in answer.json()["error"]

        # 2**59 empty rows: refused, not 2**59 / max_batch_size empty batches.
        empty = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [2**59, 0], "data": []}]}
        answer = http.post("/v2/models/rowsum/infer", json=empty)
        assert answer.status_code == 400
        assert f"it holds {2**59} rows" in answer.json()["error"]

        # 60 MB of compact JSON floats: read piece by piece, in a thread, answered.
        with prober.bomb():
            answer = http.post("/v2/models/rowsum/infer", content=floats)
        assert answer.status_code == 200, answer.text[:300]
        assert answer.json()["outputs"][0]["data"] == [count * 0.125]

        # 48 MiB of binary FP32: a view of the body, answered.
        with prober.bomb():
            answer = http.post("/v2/models/rowsum/infer", content=binary, headers=binary_headers)
        assert answer.status_code == 200, answer.text[:300]
        assert answer.json()["outputs"][0]["data"] == [DATA.size * 0.5]

        # 48 MiB of gRPC fp32_contents and of raw contents: views of the message, answered.
        for kind in ("typed", "raw"):
            with prober.bomb():
                reply = _grpc_call(server, calls[kind])
            assert _sum_of(reply) == DATA.size * 0.5

        # 1,000,000 one-byte texts in bytes_contents (3 MB): refused as too many rows.
        assert _grpc_call(server, calls["texts"]) == grpc.StatusCode.INVALID_ARGUMENT

        # 48 MiB without a key: refused before it is parsed.
        assert _grpc_call(server, calls["raw"], key=False) == grpc.StatusCode.UNAUTHENTICATED

        # A stream of 4,000 x 64 KiB that never reads its answers: 64 run, the rest wait.
        _unread_stream(server)

        assert server.is_live()
    assert server.process.poll() is None
    assert prober.failures == []
    assert prober.probes > 10
    assert prober.slowest < prober.within(), (prober.slowest, prober.longest_bomb)


def _unread_stream(server: Server) -> None:
    block = np.ones(16 * 1024, dtype=np.float32)  # 64 KiB

    def requests() -> Iterator[Any]:
        for _ in range(4000):
            request = pb.ModelInferRequest(model_name="rowsum")
            request.inputs.add(name="X", datatype="FP32", shape=[1, block.size])
            request.raw_input_contents.append(block.tobytes())
            yield request

    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        call = stub.ModelStreamInfer(requests(), metadata=[("x-api-key", KEY)], timeout=60)
        time.sleep(3.0)  # the client sends what flow control lets it; nobody reads
        assert server.is_live()
        call.cancel()
