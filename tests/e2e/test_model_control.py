"""Model control end to end (``--model-control-mode``): a real ``carpool serve`` process,
real sockets, tritonclient's ``load_model`` / ``unload_model`` / ``get_model_repository_index``
/ ``is_model_ready`` over HTTP and gRPC, and Triton's answers, exactly.

Each model's code answers ``x + N`` (or ``x * N``), so a test tells by the answer which
version served. No sleep decides an outcome: a model held in flight waits on a gate file,
and poll mode's "nothing more happened" is checked after a later folder has loaded, which
takes the poller two more looks.
"""

from __future__ import annotations

import json
import os
import py_compile
import re
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import replica_children
from server.conftest import Launcher, Server, float_request, free_port, wait_until

pytestmark = pytest.mark.slow

CONTROL_OFF = (
    "explicit model load / unload is not allowed: start the server with "
    "--model-control-mode explicit"
)
POLLING = "explicit model load / unload is not allowed if polling is enabled"
SIGNATURE = 'inputs = ["x:FP32:1"]\noutputs = ["y:FP32:1"]\n'
WITHIN_S = 20.0  # how long a condition may take to show on a loaded 2-core machine
KEY = "model-control-key"

Client = Any  # a tritonclient.http or tritonclient.grpc InferenceServerClient (untyped)


# ---------------------------------------------------------------- writing models


def write_model(folder: Path, body: str) -> None:
    """``folder`` as a model: ``model.py`` holding ``body`` (dedented) and its signature,
    each file replaced in one step, so that a poll never sees half a file."""
    folder.mkdir(parents=True, exist_ok=True)
    replace_file(folder / "carpool.toml", SIGNATURE)
    replace_file(folder / "model.py", textwrap.dedent(body))


def replace_file(path: Path, text: str) -> None:
    staged = path.with_name(f".{path.name}.staged")  # hidden: no look sees it
    staged.write_text(text)
    os.replace(staged, path)


def adds(n: int) -> str:
    return f"def model(x):\n    return x + {n}\n"


GATED = """
import os
import time
from pathlib import Path

GATES = Path(os.environ["CARPOOL_TEST_GATES"])


def model(x):
    # conftest's gate: log the batch, then wait while the gate file exists
    with open(GATES / "held.started", "a") as log:
        log.write(f"{len(x)}\\n")
    deadline = time.monotonic() + 60.0
    while (GATES / "held.closed").exists() and time.monotonic() < deadline:
        time.sleep(0.002)
    return x * 10
"""

STEADY = """
import time


def model(x):
    time.sleep(0.005)  # batches are still running when a reload swaps the version
    return x + 1
"""

SLOW_IMPORT = """
import os
import time
from pathlib import Path

# A model that takes a while to load: its import logs that it started, then waits while
# conftest's gate file exists.
GATES = Path(os.environ["CARPOOL_TEST_GATES"])
with open(GATES / "slow.imports", "a") as log:
    log.write("import\\n")
deadline = time.monotonic() + 60.0
while (GATES / "slow.closed").exists() and time.monotonic() < deadline:
    time.sleep(0.002)


def model(x):
    return x + 7
"""


def holding(name: str) -> str:
    """A model whose module holds an object that, once collected, leaves a file
    ``NAME.freed.N`` among the gates (``N``: which load of the module it was)."""
    return f"""
import os
import weakref
from pathlib import Path

GATES = Path(os.environ["CARPOOL_TEST_GATES"])
LOAD = len(list(GATES.glob("{name}.loaded.*")))
(GATES / f"{name}.loaded.{{LOAD}}").touch()


class Weights:
    pass


WEIGHTS = Weights()
_freed = weakref.finalize(WEIGHTS, (GATES / f"{name}.freed.{{LOAD}}").touch)
_freed.atexit = False


def model(x):
    return x + 1
"""


# ---------------------------------------------------------------- asking the server


def x_input(module: Any, value: float) -> list[Any]:
    tensor = module.InferInput("x", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[value]], np.float32))
    return [tensor]


def answer(client: Client, model: str, value: float = 1.0) -> float:
    """``model``'s answer to ``[[value]]``, over ``client``'s protocol."""
    module = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    result = client.infer(model, x_input(module, value))
    return float(result.as_numpy("y")[0, 0])


def refusal(call: Callable[[], Any]) -> tuple[str, str]:
    """The status (HTTP code, or gRPC code name) and message ``call`` is refused with."""
    with pytest.raises(InferenceServerException) as info:
        call()
    return str(info.value.status()).removeprefix("StatusCode."), str(info.value.message())


def index(server: Server) -> dict[str, dict[str, str]]:
    response = server.http.post("/v2/repository/index")
    assert response.status_code == 200, response.text
    return {entry["name"]: entry for entry in response.json()}


def state(server: Server, name: str) -> tuple[str, str] | None:
    entry = index(server).get(name, {})
    return (entry["state"], entry["reason"]) if "state" in entry else None


def logged(server: Server, what: str, name: str) -> int:
    """How often the server logged ``what`` (``loaded``, ``reloaded``, ``unloaded``)
    model ``name``; ``loaded`` does not count ``reloaded`` or ``unloaded``."""
    return len(re.findall(rf"(?<![a-z]){what} model '{re.escape(name)}'", server.stderr()))


def infer_status(server: Server, model: str) -> tuple[int, str]:
    response = server.infer_alone(model, {"inputs": [_x_json(1.0)]})
    return response.status_code, response.json().get("error", "")


def _x_json(value: float) -> dict[str, Any]:
    return {"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [value]}


# ---------------------------------------------------------------- mode none


@pytest.fixture(scope="module")
def fixed(serve_module: Launcher, tmp_path_factory: pytest.TempPathFactory) -> Server:
    """No model control (the default): what loads at start is what serves."""
    repository = tmp_path_factory.mktemp("fixed") / "models"
    write_model(repository / "a", adds(1))
    return serve_module(str(repository), grpc=True)


def test_without_model_control_load_and_unload_are_unavailable(fixed: Server) -> None:
    for action in ("load", "unload"):
        response = fixed.http.post(f"/v2/repository/models/a/{action}")
        assert (response.status_code, response.json()) == (503, {"error": CONTROL_OFF})
    http = httpclient.InferenceServerClient(fixed.address)
    rpc = grpcclient.InferenceServerClient(fixed.grpc_address)
    try:
        assert refusal(lambda: http.load_model("a")) == ("503", CONTROL_OFF)
        assert refusal(lambda: http.unload_model("a")) == ("503", CONTROL_OFF)
        assert refusal(lambda: rpc.load_model("a")) == ("UNAVAILABLE", CONTROL_OFF)
        assert refusal(lambda: rpc.unload_model("a")) == ("UNAVAILABLE", CONTROL_OFF)
        assert answer(http, "a") == 2.0  # and the model serves as before
        assert answer(rpc, "a") == 2.0
    finally:
        http.close()
        rpc.close()


# ---------------------------------------------------------------- mode explicit


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Each test below has models of its own, so that they run in any order."""
    root = tmp_path_factory.mktemp("explicit") / "models"
    write_model(root / "a", adds(1))
    write_model(root / "idle", adds(1))  # no test loads it
    write_model(root / "b", adds(2))
    write_model(root / "broken", 'raise RuntimeError("weights file missing")\n')
    write_model(root / "evolving", adds(1))
    write_model(root / "same", adds(1))
    write_model(root / "slow", SLOW_IMPORT)
    write_model(root / "held", GATED)
    write_model(root / "tuned", adds(3))
    write_model(root / "steady", STEADY)
    write_model(root / "counted", adds(4))
    write_model(root / "roundtrip", adds(1))
    write_model(root / "leaving", adds(6))
    write_model(root / "weighty", holding("weighty"))
    return root


@pytest.fixture(scope="module")
def explicit(serve_module: Launcher, repository: Path) -> Server:
    """Explicit model control: ``a`` loads at start, as does the non-repository target
    ``models:add_one``; every other folder waits for a load."""
    return serve_module(
        str(repository),
        "models:add_one",
        "--model-control-mode",
        "explicit",
        "--load-model",
        "a",
        grpc=True,
    )


@pytest.fixture
def http(explicit: Server) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(explicit.address, network_timeout=60.0)
    yield client
    client.close()


@pytest.fixture
def rpc(explicit: Server) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(explicit.grpc_address)
    yield client
    client.close()


def test_explicit_mode_starts_with_the_named_models_only(explicit: Server) -> None:
    entries = index(explicit)
    assert entries["a"] == {"name": "a", "version": "1", "state": "READY", "reason": ""}
    assert entries["add_one"]["state"] == "READY"  # a non-repository target always loads
    assert entries["idle"] == {"name": "idle"}  # in the repository, never loaded
    ready = explicit.http.post("/v2/repository/index", json={"ready": True}).json()
    names = [entry["name"] for entry in ready]
    assert "a" in names
    assert "add_one" in names
    assert "idle" not in names
    assert infer_status(explicit, "idle") == (404, "Request for unknown model: 'idle' is not found")


def test_load_serve_unload_and_load_again(
    explicit: Server,
    http: httpclient.InferenceServerClient,
    rpc: grpcclient.InferenceServerClient,
) -> None:
    assert not http.is_model_ready("b")
    assert not rpc.is_model_ready("b")
    assert infer_status(explicit, "b") == (404, "Request for unknown model: 'b' is not found")

    http.load_model("b")
    assert http.is_model_ready("b")
    assert rpc.is_model_ready("b")
    assert state(explicit, "b") == ("READY", "")
    assert (answer(http, "b"), answer(rpc, "b"), answer(http, "a")) == (3.0, 3.0, 2.0)

    rpc.unload_model("b")
    assert state(explicit, "b") == ("UNAVAILABLE", "unloaded")
    models = rpc.get_model_repository_index(as_json=True)["models"]
    assert {"name": "b", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"} in models
    assert not http.is_model_ready("b")
    assert not rpc.is_model_ready("b")
    unknown = "Request for unknown model: 'b' is not found"
    assert infer_status(explicit, "b") == (404, unknown)
    assert refusal(lambda: answer(http, "b")) == ("404", unknown)
    assert refusal(lambda: answer(rpc, "b")) == ("NOT_FOUND", unknown)
    assert answer(rpc, "a") == 2.0  # the others serve throughout

    rpc.load_model("b")
    assert state(explicit, "b") == ("READY", "")
    assert (answer(http, "b"), answer(http, "a")) == (3.0, 2.0)
    http.unload_model("b")
    assert not rpc.is_model_ready("b")
    assert explicit.stderr_showing("unloaded model 'b'", 2)
    assert (logged(explicit, "loaded", "b"), logged(explicit, "unloaded", "b")) == (2, 2)


def test_a_model_whose_folder_is_gone_still_unloads(
    explicit: Server,
    repository: Path,
    tmp_path: Path,
    http: httpclient.InferenceServerClient,
) -> None:
    http.load_model("leaving")
    os.rename(repository / "leaving", tmp_path / "leaving")
    try:
        assert answer(http, "leaving") == 7.0  # what loaded serves on
        message = "failed to load 'leaving': no such model in the model repository"
        assert refusal(lambda: http.load_model("leaving")) == ("400", message)
        assert answer(http, "leaving") == 7.0
        http.unload_model("leaving")
        assert state(explicit, "leaving") == ("UNAVAILABLE", "unloaded")
        assert infer_status(explicit, "leaving")[0] == 404
    finally:
        os.rename(tmp_path / "leaving", repository / "leaving")


def test_a_non_repository_target_reloads_by_name(
    explicit: Server, http: httpclient.InferenceServerClient
) -> None:
    http.load_model("add_one")
    explicit.stderr_showing("reloaded model 'add_one'")
    response = explicit.infer("add_one", float_request(2.0))
    assert response.status_code == 200
    assert response.json()["outputs"][0]["data"] == [3.0]
    http.unload_model("add_one")
    assert state(explicit, "add_one") == ("UNAVAILABLE", "unloaded")
    assert explicit.infer("add_one", float_request(2.0)).status_code == 404
    http.load_model("add_one")  # known by name once it has loaded
    assert explicit.infer("add_one", float_request(2.0)).json()["outputs"][0]["data"] == [3.0]


def test_a_load_of_an_unknown_name_is_invalid(
    http: httpclient.InferenceServerClient, rpc: grpcclient.InferenceServerClient
) -> None:
    message = "failed to load 'x': no such model in the model repository"
    assert refusal(lambda: http.load_model("x")) == ("400", message)
    assert refusal(lambda: rpc.load_model("x")) == ("INVALID_ARGUMENT", message)
    unload = "failed to unload 'x': no such model in the model repository"
    assert refusal(lambda: rpc.unload_model("x")) == ("INVALID_ARGUMENT", unload)


def test_a_broken_model_fails_to_load_with_its_reason(
    explicit: Server,
    http: httpclient.InferenceServerClient,
    rpc: grpcclient.InferenceServerClient,
) -> None:
    reason = "importing model.py failed: RuntimeError: weights file missing"
    status, message = refusal(lambda: http.load_model("broken"))
    assert status == "400"
    assert message.startswith("failed to load 'broken': ")
    assert message.endswith(reason)
    assert refusal(lambda: rpc.load_model("broken")) == ("INVALID_ARGUMENT", message)
    entry = index(explicit)["broken"]
    assert (entry["state"], entry["reason"]) == ("UNAVAILABLE", message.split(": ", 1)[1])
    status_code, error = infer_status(explicit, "broken")
    assert status_code == 400
    assert error.startswith("Model 'broken' is not ready: failed to load")
    assert not http.is_model_ready("broken")


def test_a_failed_reload_leaves_the_old_version_serving(
    explicit: Server, repository: Path, http: httpclient.InferenceServerClient
) -> None:
    http.load_model("evolving")
    assert answer(http, "evolving") == 2.0
    write_model(repository / "evolving", "def model(x):\n    return x +\n")  # a syntax error
    status, message = refusal(lambda: http.load_model("evolving"))
    assert status == "400"
    assert message.startswith("failed to load 'evolving': ")
    assert "SyntaxError" in message
    assert state(explicit, "evolving") == ("READY", "")
    assert answer(http, "evolving") == 2.0  # the old code answers
    write_model(repository / "evolving", adds(5))
    http.load_model("evolving")
    assert answer(http, "evolving") == 6.0


def test_a_reload_runs_new_code_written_within_the_second_at_the_same_size(
    repository: Path, http: httpclient.InferenceServerClient
) -> None:
    model_file = repository / "same" / "model.py"
    stamp = model_file.stat().st_mtime_ns // 10**9 * 10**9  # a whole second
    os.utime(model_file, ns=(stamp, stamp))
    # The bytecode Python would cache for it (the tests may run with
    # PYTHONDONTWRITEBYTECODE, so it is written here): it records the source's mtime, in
    # whole seconds, and its size.
    cached = py_compile.compile(
        str(model_file), doraise=True, invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP
    )
    http.load_model("same")
    assert answer(http, "same") == 2.0
    before = model_file.stat()
    model_file.write_text(adds(2))  # "x + 1" -> "x + 2": the same size
    os.utime(model_file, ns=(stamp, stamp))  # and the same mtime: the .pyc looks fresh
    after = model_file.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert cached is not None
    assert Path(cached).exists()  # and says x + 1
    http.load_model("same")
    assert answer(http, "same") == 3.0


def test_a_slow_load_shows_loading_while_the_others_serve(
    explicit: Server,
    http: httpclient.InferenceServerClient,
    rpc: grpcclient.InferenceServerClient,
) -> None:
    with ThreadPoolExecutor(1) as pool:
        with explicit.gate_closed("slow"):  # its import waits here
            loading = pool.submit(_load, explicit, "slow")
            wait_until(lambda: state(explicit, "slow") == ("LOADING", ""), "slow to show LOADING")
            assert not rpc.is_model_ready("slow")
            assert answer(rpc, "a") == 2.0  # a load runs beside the loop, not on it
        loading.result()
    assert state(explicit, "slow") == ("READY", "")
    assert answer(http, "slow") == 8.0

    seen = set()  # a reload: the old version shows READY, and serves, until the new one does
    with ThreadPoolExecutor(1) as pool:
        with explicit.gate_closed("slow"):
            reloading = pool.submit(_load, explicit, "slow")
            wait_until(lambda: imports(explicit, "slow") == 2, "the new version's import")
            seen.add(state(explicit, "slow"))
            assert answer(rpc, "slow") == 8.0
        while not reloading.done():
            seen.add(state(explicit, "slow"))
            assert answer(rpc, "slow") == 8.0
        reloading.result()
    assert seen == {("READY", "")}
    explicit.stderr_showing("reloaded model 'slow'")


def imports(server: Server, name: str) -> int:
    """How many times a gated import (``SLOW_IMPORT``) of ``name`` has started."""
    log = server.gates / f"{name}.imports"
    return log.read_text().count("import") if log.exists() else 0


def _load(server: Server, name: str, **parameters: Any) -> None:
    """``load_model`` on a client of its own (a tritonclient client is one thread's)."""
    client = httpclient.InferenceServerClient(server.address, network_timeout=60.0)
    try:
        client.load_model(name, **parameters)
    finally:
        client.close()


def _unload(server: Server, name: str) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_address)
    try:
        client.unload_model(name)
    finally:
        client.close()


def test_an_unload_drains_what_is_running_and_queued(
    explicit: Server, http: httpclient.InferenceServerClient
) -> None:
    http.load_model("held")
    started = len(explicit.batches_started("held"))  # a warm-up may have run it already
    with ThreadPoolExecutor(4) as pool, explicit.gate_closed("held"):
        running = pool.submit(explicit.infer_alone, "held", {"inputs": [_x_json(1.0)]})
        explicit.wait_started("held", started + 1)
        queued = [
            pool.submit(explicit.infer_alone, "held", {"inputs": [_x_json(value)]})
            for value in (2.0, 3.0)
        ]
        explicit.wait_queued("held", pending=3, queued_rows=2)
        unloading: Future[None] = pool.submit(_unload, explicit, "held")
        wait_until(lambda: state(explicit, "held") == ("UNLOADING", ""), "held to show UNLOADING")
        assert infer_status(explicit, "held") == (
            404,
            "Request for unknown model: 'held' is not found",
        )  # it admits no new request
        assert not unloading.done()
    answers = []
    for request in (running, *queued):
        response = request.result()
        assert response.status_code == 200, response.text
        answers.extend(response.json()["outputs"][0]["data"])
    assert answers == [10.0, 20.0, 30.0]  # nothing accepted was lost
    unloading.result()
    assert state(explicit, "held") == ("UNAVAILABLE", "unloaded")


def test_a_load_config_overrides_the_batching_settings(
    explicit: Server,
    http: httpclient.InferenceServerClient,
    rpc: grpcclient.InferenceServerClient,
) -> None:
    config = {"max_batch_size": 4, "dynamic_batching": {"max_queue_delay_microseconds": 3000}}
    http.load_model("tuned", config=json.dumps(config))
    shown = http.get_model_config("tuned")
    assert shown["max_batch_size"] == 4
    assert shown["dynamic_batching"]["max_queue_delay_microseconds"] == 3000
    over_grpc = rpc.get_model_config("tuned").config
    assert over_grpc.max_batch_size == 4
    assert over_grpc.dynamic_batching.max_queue_delay_microseconds == 3000
    assert answer(rpc, "tuned") == 4.0

    config = {"sequence_batching": {}}
    status, message = refusal(lambda: rpc.load_model("tuned", config=json.dumps(config)))
    assert status == "INVALID_ARGUMENT"
    assert message.startswith("config field 'sequence_batching' cannot be set by a load")
    config = {"dynamic_batching": {"max_queue_delay_microseconds": "soon"}}
    status, message = refusal(lambda: http.load_model("tuned", config=json.dumps(config)))
    assert (status, message) == ("400", "max_queue_delay_microseconds must be a number")
    status, message = refusal(lambda: http.load_model("tuned", config="{not json"))
    assert status == "400"
    assert message.startswith("the load's config is not JSON")
    assert http.get_model_config("tuned")["max_batch_size"] == 4  # the refusals changed nothing

    shown = http.get_model_config("tuned")  # a config read, edited and sent back loads
    shown["max_batch_size"] = 8
    http.load_model("tuned", config=json.dumps(shown))
    assert http.get_model_config("tuned")["max_batch_size"] == 8

    http.load_model("tuned")  # a load without a config reads the repository's again
    assert http.get_model_config("tuned")["max_batch_size"] == 32


def test_a_config_read_over_grpc_as_json_loads_back(
    http: httpclient.InferenceServerClient, rpc: grpcclient.InferenceServerClient
) -> None:
    http.load_model("roundtrip")
    shown = rpc.get_model_config("roundtrip", as_json=True)["config"]
    assert shown["dynamic_batching"]["default_priority_level"] == "1"  # a uint64, as JSON
    shown["max_batch_size"] = 8
    rpc.load_model("roundtrip", config=json.dumps(shown))
    assert http.get_model_config("roundtrip")["max_batch_size"] == 8


def test_no_request_fails_while_a_model_reloads(
    explicit: Server, http: httpclient.InferenceServerClient
) -> None:
    http.load_model("steady")
    stop = threading.Event()
    answered = [0] * 4
    failures: list[str] = []

    def send(slot: int) -> None:
        client: Client = (
            httpclient.InferenceServerClient(explicit.address)
            if slot % 2
            else grpcclient.InferenceServerClient(explicit.grpc_address)
        )
        try:
            while not stop.is_set():
                value = float(slot * 1000 + answered[slot])
                try:
                    got = answer(client, "steady", value)
                except InferenceServerException as exc:
                    failures.append(f"{exc.status()}: {exc.message()}")
                    continue
                if got != value + 1:
                    failures.append(f"{value} + 1 answered {got}")
                answered[slot] += 1
        finally:
            client.close()

    def each_answered_again() -> None:
        since = list(answered)

        def moved_on() -> bool:
            return bool(failures) or all(a > b for a, b in zip(answered, since, strict=True))

        wait_until(moved_on, "every sender to be answered again")

    with ThreadPoolExecutor(len(answered)) as pool:
        senders = [pool.submit(send, slot) for slot in range(len(answered))]
        try:
            for _ in range(5):
                each_answered_again()
                http.load_model("steady")
            each_answered_again()
        finally:
            stop.set()
        for sender in senders:
            sender.result()
    assert failures == []
    assert min(answered) >= 6  # each sender was answered before, between and after reloads
    explicit.stderr_showing("reloaded model 'steady'", 5)
    stats = explicit.stats("steady")  # the version now serving counts its own requests
    assert stats["inference_stats"]["fail"]["count"] == 0


def test_metrics_and_stats_follow_a_model_in_and_out(
    explicit: Server, http: httpclient.InferenceServerClient
) -> None:
    def listed() -> list[str]:
        return [s["name"] for s in explicit.get_json("/v2/models/stats")["model_stats"]]

    series = 'carpool_queue_rows{model="counted"}'
    assert series not in explicit.metrics()
    assert "counted" not in listed()
    assert explicit.http.get("/v2/models/counted/stats").status_code == 404

    http.load_model("counted")
    assert answer(http, "counted") == 5.0
    assert f"{series} 0.0" in explicit.metrics()
    labels = {"model": "counted", "outcome": "success", "protocol": "http"}
    assert explicit.metric("carpool_requests_total", **labels) == 1
    assert "counted" in listed()
    assert explicit.stats("counted")["inference_count"] == 1
    http.load_model("counted")  # a new version counts from zero
    assert explicit.stats("counted")["inference_count"] == 0

    http.unload_model("counted")
    assert 'model="counted"' not in explicit.metrics()
    assert "counted" not in listed()
    assert explicit.http.get("/v2/models/counted/stats").status_code == 404
    assert "a" in listed()


def test_an_unload_lets_go_of_the_models_module(
    explicit: Server, http: httpclient.InferenceServerClient
) -> None:
    http.load_model("weighty")
    assert (explicit.gates / "weighty.loaded.0").exists()
    http.unload_model("weighty")
    assert (explicit.gates / "weighty.freed.0").exists()  # what its code held is gone
    http.load_model("weighty")  # and a load runs the module anew
    assert (explicit.gates / "weighty.loaded.1").exists()
    assert answer(http, "weighty") == 2.0


# ---------------------------------------------------------------- process workers


def test_an_unloaded_process_model_leaves_no_worker_process(
    serve: Launcher, tmp_path: Path
) -> None:
    write_model(tmp_path / "models" / "p", adds(1))
    server = serve(
        str(tmp_path / "models"),
        "--model-control-mode",
        "explicit",
        "--load-model",
        "p",
        "--runner",
        "process",
        "--workers",
        "2",
    )
    pid = server.process.pid
    first = wait_until(lambda: len(replica_children(pid)) == 2 and replica_children(pid), "2")
    client = httpclient.InferenceServerClient(server.address, network_timeout=60.0)
    try:
        assert answer(client, "p") == 2.0
        client.unload_model("p")
        wait_until(lambda: not replica_children(pid), "p's worker processes to end")
        assert server.http.get("/v2/models/p/stats").status_code == 404

        write_model(tmp_path / "models" / "p", adds(2))
        client.load_model("p")
        again = wait_until(lambda: len(replica_children(pid)) == 2 and replica_children(pid), "2")
        assert not again & first
        assert answer(client, "p") == 3.0
        assert server.stats("p")["workers"]["alive"] == 2

        client.load_model("p")  # a reload replaces the workers; the old ones end
        wait_until(lambda: not replica_children(pid) & again, "the old workers to end")
        assert len(replica_children(pid)) == 2
        assert answer(client, "p") == 3.0
    finally:
        client.close()


# ---------------------------------------------------------------- the access key


def test_load_and_unload_need_the_access_key(serve: Launcher, tmp_path: Path) -> None:
    write_model(tmp_path / "models" / "k", adds(1))
    server = serve(
        str(tmp_path / "models"), "--model-control-mode", "explicit", "--api-key", KEY, grpc=True
    )
    for action in ("load", "unload"):
        response = server.http.post(f"/v2/repository/models/k/{action}")
        assert (response.status_code, response.json()) == (401, {"error": "unauthorized"})
    http = httpclient.InferenceServerClient(server.address)
    rpc = grpcclient.InferenceServerClient(server.grpc_address)
    key = {"authorization": f"Bearer {KEY}"}
    try:
        assert refusal(lambda: http.load_model("k")) == ("401", "unauthorized")
        assert refusal(lambda: rpc.load_model("k")) == ("UNAUTHENTICATED", "unauthorized")
        assert not index_ready(server, "k")
        http.load_model("k", headers=key)
        assert index_ready(server, "k")
        assert refusal(lambda: rpc.unload_model("k")) == ("UNAUTHENTICATED", "unauthorized")
        rpc.unload_model("k", headers=key)
        assert not index_ready(server, "k")
        rpc.load_model("k", headers={"x-api-key": KEY})
        assert index_ready(server, "k")
    finally:
        http.close()
        rpc.close()


def index_ready(server: Server, name: str) -> bool:
    response = server.http.post(
        "/v2/repository/index", json={"ready": True}, headers={"x-api-key": KEY}
    )
    assert response.status_code == 200, response.text
    return name in [entry["name"] for entry in response.json()]


# ---------------------------------------------------------------- mode poll


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("watched")
    write_model(root / "models" / "base", adds(1))
    (root / "outside").mkdir()  # where folders go when they leave the repository
    return root


@pytest.fixture(scope="module")
def polling(serve_module: Launcher, watched: Path) -> Server:
    return serve_module(
        str(watched / "models"),
        "--model-control-mode",
        "poll",
        "--repository-poll-secs",
        "0.2",
        grpc=True,
    )


def looks_pass(server: Server, watched: Path) -> None:
    """Until the poller has looked at least twice more and acted on what it saw: a new
    model folder loads only once it has looked the same at two looks."""
    ticks = watched / "ticks"
    ticks.mkdir(exist_ok=True)
    name = f"zz{len(list(ticks.iterdir()))}"  # after the others: they are acted on first
    (ticks / name).touch()
    write_model(watched / "models" / name, adds(0))
    wait_until(lambda: state(server, name) == ("READY", ""), f"{name} to load", WITHIN_S)


def test_in_poll_mode_load_and_unload_are_unavailable(polling: Server) -> None:
    http = httpclient.InferenceServerClient(polling.address)
    rpc = grpcclient.InferenceServerClient(polling.grpc_address)
    try:
        assert refusal(lambda: http.load_model("base")) == ("503", POLLING)
        assert refusal(lambda: http.unload_model("base")) == ("503", POLLING)
        assert refusal(lambda: rpc.load_model("base")) == ("UNAVAILABLE", POLLING)
        assert refusal(lambda: rpc.unload_model("base")) == ("UNAVAILABLE", POLLING)
        assert answer(http, "base") == 2.0
    finally:
        http.close()
        rpc.close()


def test_poll_follows_a_folder_added_changed_and_removed(polling: Server, watched: Path) -> None:
    models, outside = watched / "models", watched / "outside"
    client = httpclient.InferenceServerClient(polling.address)

    def answers(value: float) -> bool:
        return client.is_model_ready("fresh") and answer(client, "fresh") == value

    try:
        write_model(outside / "fresh", adds(1))
        os.rename(outside / "fresh", models / "fresh")  # added whole
        wait_until(lambda: answers(2.0), "fresh to load", WITHIN_S)
        looks_pass(polling, watched)
        assert logged(polling, "loaded", "fresh") == 1

        write_model(models / "fresh", adds(5))  # changed
        wait_until(lambda: answers(6.0), "fresh to reload", WITHIN_S)
        looks_pass(polling, watched)
        assert (logged(polling, "loaded", "fresh"), logged(polling, "reloaded", "fresh")) == (1, 1)

        os.rename(models / "fresh", outside / "fresh")  # removed
        wait_until(
            lambda: state(polling, "fresh") == ("UNAVAILABLE", "unloaded"),
            "fresh to unload",
            WITHIN_S,
        )
        assert infer_status(polling, "fresh") == (
            404,
            "Request for unknown model: 'fresh' is not found",
        )
        assert not client.is_model_ready("fresh")
        looks_pass(polling, watched)
        assert logged(polling, "unloaded", "fresh") == 1
        assert answer(client, "base") == 2.0  # untouched throughout
        assert logged(polling, "reloaded", "base") == 0
    finally:
        client.close()


def test_poll_loads_a_folder_written_in_pieces_once_it_is_complete(
    polling: Server, watched: Path
) -> None:
    folder = watched / "models" / "pieces"
    folder.mkdir()
    replace_file(folder / "carpool.toml", SIGNATURE)  # the settings first, no model yet
    looks_pass(polling, watched)
    entry = index(polling)["pieces"]  # tried once it settled, and shown as failed
    reason = (
        f"no model file in {folder}: add a .onnx, .pt or model.py file "
        '(or name it with file = "..." in carpool.toml)'
    )
    assert (entry["state"], entry["reason"]) == ("UNAVAILABLE", reason)
    assert polling.stderr().count(f"failed to load 'pieces': {reason}") == 1
    looks_pass(polling, watched)
    assert polling.stderr().count("failed to load 'pieces'") == 1  # not again at every look

    replace_file(folder / "model.py", adds(9))  # now complete
    client = httpclient.InferenceServerClient(polling.address)
    try:
        wait_until(lambda: client.is_model_ready("pieces"), "pieces to load", WITHIN_S)
        assert answer(client, "pieces") == 10.0
    finally:
        client.close()
    looks_pass(polling, watched)
    assert logged(polling, "loaded", "pieces") == 1
    assert logged(polling, "reloaded", "pieces") == 0


def test_poll_removal_lets_go_of_the_models_module(polling: Server, watched: Path) -> None:
    models, outside = watched / "models", watched / "outside"
    write_model(outside / "gone", holding("gone"))
    os.rename(outside / "gone", models / "gone")
    wait_until(lambda: state(polling, "gone") == ("READY", ""), "gone to load", WITHIN_S)
    os.rename(models / "gone", outside / "gone")
    wait_until(
        lambda: state(polling, "gone") == ("UNAVAILABLE", "unloaded"), "gone to unload", WITHIN_S
    )
    assert (polling.gates / "gone.loaded.0").exists()
    assert (polling.gates / "gone.freed.0").exists()


# ---------------------------------------------------------------- refused at start


@pytest.mark.parametrize(
    ("flags", "env", "message"),
    [
        (
            ["--load-model", "a"],
            {},
            "--load-model applies to --model-control-mode explicit",
        ),
        (
            ["--model-control-mode", "bogus"],
            {},
            "--model-control-mode must be none, explicit or poll, got 'bogus'",
        ),
        (
            [],
            {"CARPOOL_MODEL_CONTROL_MODE": "bogus"},
            "--model-control-mode must be none, explicit or poll, got 'bogus'",
        ),
        (
            ["--model-control-mode", "explicit", "--frontends", "2"],
            {},
            "--model-control-mode explicit runs with one front end: leave out --frontends "
            "(got 2), or use --model-control-mode none",
        ),
        (
            ["--model-control-mode", "explicit", "--load-model", "nope"],
            {},
            "--load-model 'nope': no such model folder in the repository (there: ['a'])",
        ),
        (
            ["--model-control-mode", "explicit"],
            {"CARPOOL_LOAD_MODEL": "a,nope"},
            "CARPOOL_LOAD_MODEL 'nope': no such model folder in the repository (there: ['a'])",
        ),
        (
            [],
            {"CARPOOL_LOAD_MODEL": "a"},
            "CARPOOL_LOAD_MODEL applies to --model-control-mode explicit",
        ),
        (
            ["--model-control-mode", "poll", "--repository-poll-secs", "0"],
            {},
            "--repository-poll-secs must be > 0 seconds, got 0.0",
        ),
    ],
    ids=[
        "load-model-without-explicit",
        "bogus",
        "bogus-env",
        "frontends",
        "no-folder",
        "no-folder-env",
        "load-model-env-without-explicit",
        "poll-0",
    ],
)
def test_the_command_line_refuses_what_model_control_cannot_do(
    tmp_path: Path, flags: list[str], env: dict[str, str], message: str
) -> None:
    write_model(tmp_path / "models" / "a", adds(1))
    environment = {k: v for k, v in os.environ.items() if not k.startswith("CARPOOL_")}
    command = [sys.executable, "-m", "carpool", "serve", str(tmp_path / "models"), *flags]
    command += ["--port", str(free_port()), "--grpc-port", "0"]
    done = subprocess.run(
        command, env={**environment, **env}, capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stderr) == (2, f"carpool serve: {message}\n")
