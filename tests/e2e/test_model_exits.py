"""A model whose own code exits or interrupts as it loads (``raise SystemExit(3)``,
``KeyboardInterrupt``, a BaseException of its own) is a failed load like any other, in every
path: at start, an explicit load, a reload (the old version serves on), a poll, and in a
replica process. So is a model whose *call* raises one: its request fails (a 500 naming it),
the server serves on. A real ``carpool serve`` process, real sockets, Triton's answers, exactly.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from server.conftest import (
    HERE,
    READY_WITHIN_S,
    Launcher,
    Server,
    float_request,
    free_port,
    wait_until,
)

pytestmark = pytest.mark.slow

SIGNATURE = 'inputs = ["x:FP32:1"]\noutputs = ["y:FP32:1"]\n'
WITHIN_S = 20.0  # how long a poll may take to show on a loaded 2-core machine
# model.py bodies that raise as they are imported, and the reason each load fails with
RAISING = {
    "exits": ("import sys\n\nsys.exit(3)\n", "SystemExit: 3"),
    "interrupts": ("raise KeyboardInterrupt\n", "KeyboardInterrupt"),
    "stops": ("class Stop(BaseException):\n    pass\n\n\nraise Stop('halt')\n", "Stop: halt"),
}
# exits in a replica process only: the main process's import (for the signature) passes
EXITS_IN_REPLICA = """
import multiprocessing

if multiprocessing.parent_process() is not None:
    raise SystemExit(3)


def model(x):
    return x + 1
"""


def write_model(folder: Path, body: str) -> None:
    """``folder`` as a model: ``model.py`` holding ``body`` and its signature, each file
    replaced in one step, so that a poll never sees half a file."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in (("carpool.toml", SIGNATURE), ("model.py", textwrap.dedent(body))):
        staged = folder / f".{name}.staged"  # hidden: no look sees it
        staged.write_text(text)
        os.replace(staged, folder / name)


def adds(n: int) -> str:
    return f"def model(x):\n    return x + {n}\n"


def load(server: Server, name: str) -> tuple[int, Any]:
    """A load's status, and its error (a load that succeeds answers an empty body)."""
    response = server.http.post(f"/v2/repository/models/{name}/load")
    return response.status_code, response.json() if response.content else None


def state(server: Server, name: str) -> tuple[str, str] | None:
    response = server.http.post("/v2/repository/index")
    assert response.status_code == 200, response.text
    entry = {entry["name"]: entry for entry in response.json()}.get(name, {})
    return (entry["state"], entry["reason"]) if "state" in entry else None


def infer(server: Server, name: str, value: float = 1.0) -> tuple[int, Any]:
    """``name``'s answer to ``[[value]]``: the status, and ``y`` or the error."""
    x = {"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [value]}
    response = server.infer_alone(name, {"inputs": [x]})
    body = response.json()
    return response.status_code, body["outputs"][0]["data"][0] if "outputs" in body else body


def not_ready(name: str, reason: str) -> tuple[int, Any]:
    return 400, {"error": f"Model '{name}' is not ready: failed to load: {reason}"}


# ---------------------------------------------------------------- explicit loads


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("exits") / "models"
    write_model(root / "a", adds(1))
    for name, (body, _) in RAISING.items():
        write_model(root / name, body)
        write_model(root / f"reloaded_{name}", adds(1))
    return root


@pytest.fixture(scope="module")
def explicit(serve_module: Launcher, repository: Path) -> Server:
    return serve_module(str(repository), "--model-control-mode", "explicit", "--load-model", "a")


@pytest.mark.parametrize("name", sorted(RAISING))
def test_a_model_that_raises_at_import_fails_to_load_with_the_reason(
    explicit: Server, name: str
) -> None:
    reason = f"importing model.py failed: {RAISING[name][1]}"
    refused = (400, {"error": f"failed to load '{name}': {reason}"})
    assert load(explicit, name) == refused
    assert state(explicit, name) == ("UNAVAILABLE", reason)
    assert infer(explicit, name) == not_ready(name, reason)
    ready = explicit.http.get(f"/v2/models/{name}/ready")
    assert (ready.status_code, reason in ready.text) == (503, True)
    assert load(explicit, name) == refused  # tried again: fails alike, nothing left half-run
    assert explicit.is_live()
    assert infer(explicit, "a") == (200, 2.0)  # the server and the others serve on


@pytest.mark.parametrize("name", sorted(RAISING))
def test_a_reload_that_raises_leaves_the_old_version_serving(
    explicit: Server, repository: Path, name: str
) -> None:
    model = f"reloaded_{name}"
    assert load(explicit, model) == (200, None)
    assert infer(explicit, model) == (200, 2.0)
    write_model(repository / model, RAISING[name][0])
    reason = f"importing model.py failed: {RAISING[name][1]}"
    assert load(explicit, model) == (400, {"error": f"failed to load '{model}': {reason}"})
    assert state(explicit, model) == ("READY", "")
    assert infer(explicit, model) == (200, 2.0)  # the old code answers
    write_model(repository / model, adds(5))
    assert load(explicit, model) == (200, None)
    assert infer(explicit, model) == (200, 6.0)


# ---------------------------------------------------------------- at start


def test_a_model_that_raises_at_start_is_unavailable_and_the_others_serve(
    serve: Launcher, tmp_path: Path
) -> None:
    for name, (body, _) in RAISING.items():
        write_model(tmp_path / "models" / name, body)
    write_model(tmp_path / "models" / "a", adds(1))
    server = serve(str(tmp_path / "models"))
    for name, (_, raised) in RAISING.items():
        reason = f"{tmp_path / 'models' / name}: importing model.py failed: {raised}"
        assert state(server, name) == ("UNAVAILABLE", reason)
        assert infer(server, name) == not_ready(name, reason)
    assert infer(server, "a") == (200, 2.0)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ((), "carpool serve: no model of the repository loaded (exits: "),
        (
            ("--model-control-mode", "explicit", "--load-model", "exits"),
            "carpool serve: ",
        ),
    ],
    ids=["only-model", "load-model"],
)
def test_a_start_whose_models_all_exit_refuses_with_status_2(
    tmp_path: Path, flags: tuple[str, ...], message: str
) -> None:
    """As for any model that fails to load: status 2 and a message, never the model's own
    exit status."""
    write_model(tmp_path / "models" / "exits", RAISING["exits"][0])
    environment = {k: v for k, v in os.environ.items() if not k.startswith("CARPOOL_")}
    command = [sys.executable, "-m", "carpool", "serve", str(tmp_path / "models"), *flags]
    command += ["--port", str(free_port()), "--grpc-port", "0"]
    result = subprocess.run(
        command,
        cwd=HERE,
        env=environment,
        capture_output=True,
        text=True,
        timeout=READY_WITHIN_S,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert message in result.stderr, result.stderr
    assert "importing model.py failed: SystemExit: 3" in result.stderr, result.stderr


# ---------------------------------------------------------------- poll


def test_a_polled_folder_that_raises_is_unavailable_until_it_is_fixed(
    serve: Launcher, tmp_path: Path
) -> None:
    repository = tmp_path / "models"
    write_model(repository / "a", adds(1))
    server = serve(str(repository), "--model-control-mode", "poll", "--repository-poll-secs", "0.2")
    write_model(repository / "later", RAISING["interrupts"][0])
    reason = "importing model.py failed: KeyboardInterrupt"
    wait_until(
        lambda: state(server, "later") == ("UNAVAILABLE", reason), "later's failure", WITHIN_S
    )
    assert infer(server, "later") == not_ready("later", reason)
    assert infer(server, "a") == (200, 2.0)
    write_model(repository / "later", adds(3))
    wait_until(lambda: state(server, "later") == ("READY", ""), "later to load", WITHIN_S)
    assert infer(server, "later") == (200, 4.0)


# ---------------------------------------------------------------- replica processes


def test_a_model_that_exits_in_its_replica_process_fails_to_load(
    serve: Launcher, tmp_path: Path
) -> None:
    repository = tmp_path / "models"
    write_model(repository / "p", adds(1))
    write_model(repository / "q", EXITS_IN_REPLICA)
    server = serve(
        str(repository),
        "--model-control-mode",
        "explicit",
        "--load-model",
        "p",
        "--runner",
        "process",
        "--workers",
        "1",
    )
    status, body = load(server, "q")
    assert status == 400, body
    assert body["error"].startswith("failed to load 'q': "), body
    assert "SystemExit: 3" in body["error"], body
    reason = body["error"].removeprefix("failed to load 'q': ")
    assert state(server, "q") == ("UNAVAILABLE", reason)
    assert infer(server, "q") == not_ready("q", reason)

    write_model(repository / "p", EXITS_IN_REPLICA)  # a reload whose replicas exit
    status, body = load(server, "p")
    assert status == 400, body
    assert "SystemExit: 3" in body["error"], body
    assert state(server, "p") == ("READY", "")
    assert infer(server, "p") == (200, 2.0)  # the old replica answers


@pytest.mark.parametrize("runner", ["thread", "process"])
def test_a_model_call_that_exits_fails_its_request_and_the_server_serves_on(
    serve: Launcher, runner: str
) -> None:
    server = serve("models:exits", "--runner", runner, "--workers", "1")
    for _ in range(2):  # the same worker, again: no worker died, none was restarted
        response = server.infer_alone("exits", float_request(13.0))
        assert response.status_code == 500, response.text
        error = response.json()["error"]
        assert error.startswith("model error: ModelExit: the model raised SystemExit(3)"), error
        response = server.infer_alone("exits", float_request(1.0))
        assert response.status_code == 200, response.text
        assert response.json()["outputs"][0]["data"] == [2.0]
    assert server.is_live()
    assert "died" not in server.stderr(), server.stderr()
