"""``carpool serve --runner process``, end to end: real worker processes, real signals, the
real tritonclient. Each fault has one outcome, and every request gets exactly one answer.

Worker processes are found by PID: the server's children that run multiprocessing's
``spawn_main`` (``carpool-worker ...`` in ``ps``).
"""

from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from backends import onnx_graphs
from conftest import replica_children
from server.conftest import Launcher, Server, wait_until
from server.models import HANG, POISON, SLOW

pytestmark = pytest.mark.slow


def children(pid: int) -> set[int]:
    """Live worker processes of the server ``pid``."""
    return replica_children(pid)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):  # gone, or reaped as we read
        return False
    return state != "Z"


def workers(server: Server, model: str) -> dict[str, Any]:
    return server.stats(model)["workers"]  # type: ignore[no-any-return]


def request(value: float) -> tuple[list[triton.InferInput], np.ndarray[Any, Any]]:
    row = np.full((1, 4), 1.0, dtype=np.float32)
    row[0, 0] = value
    tensor = triton.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(row, binary_data=True)
    return [tensor], row


def infer(client: triton.InferenceServerClient, value: float) -> np.ndarray[Any, Any]:
    inputs, _ = request(value)
    result = client.infer("troublemaker", inputs)
    out = result.as_numpy("OUTPUT0")
    assert out is not None
    return out


@pytest.fixture(scope="module")
def pool(serve_module: Launcher) -> Server:
    """2 worker processes of the troublemaker model; the tests below leave both alive."""
    return serve_module("models:troublemaker", "--runner", "process", "--workers", "2")


def test_the_workers_are_children_of_the_server(pool: Server) -> None:
    assert len(children(pool.process.pid)) == 2
    assert workers(pool, "troublemaker") == {
        "runner": "process",
        "alive": 2,
        "restarts": 0,
        "retried_batches": 0,
        "timed_out_batches": 0,
    }
    assert pool.metric("carpool_workers_alive", model="troublemaker") == 2
    assert pool.http.get("/v2/models/troublemaker/ready").status_code == 200


def test_a_worker_killed_under_200_concurrent_requests_loses_none(pool: Server) -> None:
    before = workers(pool, "troublemaker")
    pids = children(pool.process.pid)
    client = triton.InferenceServerClient(pool.address, concurrency=200)
    try:
        pending = []
        for i in range(200):
            inputs, row = request(float(i + 1))
            pending.append((client.async_infer("troublemaker", inputs), row))
            if i == 100:
                victim = min(pids)
                os.kill(victim, signal.SIGKILL)
        outcomes = [(_outcome(handle), row) for handle, row in pending]
        errors = [out for out, _ in outcomes if isinstance(out, str)]
        assert errors == []  # the killed worker's batch ran again on the other one
        for out, row in outcomes:
            assert np.array_equal(out, row * 2)
    finally:
        client.close()
    wait_until(lambda: workers(pool, "troublemaker")["alive"] == 2, "the worker to restart")
    after = workers(pool, "troublemaker")
    assert after["restarts"] == before["restarts"] + 1
    assert after["retried_batches"] <= before["retried_batches"] + 1
    assert victim not in children(pool.process.pid)
    assert len(children(pool.process.pid)) == 2
    assert pool.metric("carpool_worker_restarts_total", model="troublemaker") == after["restarts"]
    with triton.InferenceServerClient(pool.address) as again:
        assert np.array_equal(infer(again, 5.0), request(5.0)[1] * 2)


def test_a_row_that_kills_its_worker_fails_alone(pool: Server) -> None:
    values = [float(v) for v in range(1, 8)] + [POISON]
    with ThreadPoolExecutor(8) as threads:
        answers = list(threads.map(lambda v: pool.infer_alone("troublemaker", _doc(v)), values))
    statuses = [a.status_code for a in answers]
    assert statuses == [200] * 7 + [500]
    error = answers[-1].json()["error"]
    assert error.startswith("model worker died (exit code 1) while running the batch")
    for value, answer in zip(values[:-1], answers[:-1], strict=True):
        assert answer.json()["outputs"][0]["data"] == [value * 2, 2.0, 2.0, 2.0]
    wait_until(lambda: workers(pool, "troublemaker")["alive"] == 2, "the workers to restart")
    assert pool.infer_alone("troublemaker", _doc(3.0)).status_code == 200


def _outcome(handle: Any) -> np.ndarray[Any, Any] | str:
    """The output of an async_infer, or the error message it ended in."""
    try:
        out = handle.get_result().as_numpy("OUTPUT0")
    except InferenceServerException as exc:
        return str(exc)
    assert out is not None
    return out


def _doc(value: float) -> dict[str, Any]:
    return {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [value, 1, 1, 1]}
        ]
    }


def test_a_hung_batch_gets_504_and_its_worker_is_replaced(serve: Launcher) -> None:
    server = serve(
        "models:troublemaker", "--runner", "process", "--workers", "1", "--batch-timeout-ms", "500"
    )
    (first,) = children(server.process.pid)
    answer = server.infer_alone("troublemaker", _doc(HANG))
    assert answer.status_code == 504
    assert answer.json()["error"].startswith("model batch ran past batch_timeout_ms=500")
    wait_until(lambda: not alive(first), "the hung worker to be killed")
    wait_until(lambda: workers(server, "troublemaker")["alive"] == 1, "its replacement")
    assert server.infer_alone("troublemaker", _doc(2.0)).json()["outputs"][0]["data"] == [
        4.0,
        2.0,
        2.0,
        2.0,
    ]
    assert workers(server, "troublemaker")["timed_out_batches"] == 1
    labels = {"model": "troublemaker", "outcome": "timeout", "protocol": "http"}
    assert server.metric("carpool_requests_total", **labels) == 1


def test_sigterm_drains_then_leaves_no_worker(serve: Launcher) -> None:
    server = serve("models:troublemaker", "--runner", "process", "--workers", "2")
    pids = children(server.process.pid)
    assert len(pids) == 2
    with ThreadPoolExecutor(4) as threads:
        slow = threads.submit(server.infer_alone, "troublemaker", _doc(SLOW))
        wait_until(lambda: server.stats("troublemaker")["pending"] == 1, "the slow request")
        server.send_signal(signal.SIGTERM)
        assert slow.result().status_code == 200  # drained, not dropped
    assert server.wait_exit() == 0
    assert not [pid for pid in pids if alive(pid)]


def test_sigkill_of_the_server_takes_its_workers_down(serve: Launcher) -> None:
    server = serve("models:troublemaker", "--runner", "process", "--workers", "2")
    pids = children(server.process.pid)
    assert len(pids) == 2
    server.kill()  # SIGKILL: no drain, no goodbye; the workers must notice on their own
    wait_until(lambda: not [pid for pid in pids if alive(pid)], "the workers to exit")


def test_a_model_no_worker_can_load_is_unavailable_and_the_others_serve(
    serve: Launcher,
) -> None:
    server = serve(
        "models:fails_in_worker", "models:troublemaker", "--runner", "process", "--workers", "1"
    )
    reason = "RuntimeError: weights file /nowhere/model.bin is missing"
    ready = server.http.get("/v2/models/fails_in_worker/ready")
    assert ready.status_code == 503
    assert reason in ready.json()["error"]
    answer = server.infer_alone("fails_in_worker", _doc(1.0))
    assert answer.status_code == 400
    assert reason in answer.json()["error"]
    index = {m["name"]: m for m in server.http.post("/v2/repository/index").json()}
    assert index["fails_in_worker"]["state"] == "UNAVAILABLE"
    assert reason in index["fails_in_worker"]["reason"]
    assert index["troublemaker"]["state"] == "READY"
    assert server.infer_alone("troublemaker", _doc(1.0)).status_code == 200
    assert len(children(server.process.pid)) == 1


@pytest.mark.parametrize("model", ["demo", "onnx", "repository"])
def test_process_workers_answer_bit_for_bit_as_threads(
    serve: Launcher, tmp_path: Path, model: str
) -> None:
    if model in ("onnx", "repository"):
        # a model file, or a repository folder that each worker loads from its own folder
        path = tmp_path / "repo" / "mixed" / "model.onnx" if model == "repository" else None
        path = path or tmp_path / "mixed.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx_graphs.mixed(path)
        target = str(tmp_path / "repo") if model == "repository" else str(path)
        rng = np.random.default_rng(7)
        bodies = [
            {
                "x": rng.standard_normal((n, 4)).astype(np.float32),
                "ids": rng.integers(0, 100, (n, 5)).astype(np.int64),
            }
            for n in (1, 3, 8)
        ]
        name = "mixed"
    else:
        target, name = "demo", "demo"
        rng = np.random.default_rng(7)
        bodies = [{"INPUT0": rng.standard_normal((n, 256)).astype(np.float32)} for n in (1, 5)]
    threads = serve(target)
    processes = serve(target, "--runner", "process", "--workers", "2")
    for body in bodies:
        got = _infer_binary(processes, name, body)
        want = _infer_binary(threads, name, body)
        assert got.keys() == want.keys()
        for key in want:
            assert (got[key].dtype, got[key].shape) == (want[key].dtype, want[key].shape)
            assert got[key].tobytes() == want[key].tobytes(), key


def _infer_binary(
    server: Server, model: str, body: dict[str, np.ndarray[Any, Any]]
) -> dict[str, np.ndarray[Any, Any]]:
    inputs = []
    for name, array in body.items():
        datatype = "FP32" if array.dtype == np.float32 else "INT64"
        tensor = triton.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array, binary_data=True)
        inputs.append(tensor)
    with triton.InferenceServerClient(server.address) as client:
        result = client.infer(model, inputs)
        outputs = result.get_response()["outputs"]
        return {o["name"]: result.as_numpy(o["name"]) for o in outputs}
