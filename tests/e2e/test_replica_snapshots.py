"""A restarted replica runs the code of the version it belongs to (issue 31): a real
``carpool serve`` in explicit model control, a repository model on 2 worker processes,
its ``model.py`` edited or broken on disk with no load, its replicas killed with SIGKILL.
The answer (``x * N``) tells which code ran; each loaded version's copy of its files
(:mod:`carpool.loading.snapshots`) shows under the server's ``TMPDIR``.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from conftest import replica_children
from server.conftest import Launcher, Server, wait_until

pytestmark = pytest.mark.slow

SETTINGS = 'inputs = ["x:FP32:1"]\noutputs = ["y:FP32:1"]\nrunner = "process"\nworkers = 2\n'
REQUESTS = 40


def write(path: Path, text: str) -> None:
    """``path`` holding ``text``, rewritten in place (as an editor or ``write_text`` does)."""
    path.write_text(text)


def times(n: float) -> str:
    return f"def model(x):\n    return x * {n}\n"


def answers(server: Server) -> list[Any]:
    """``REQUESTS`` answers of ``m`` to ``[[1.0]]``: each its ``y``, or its error."""
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}
    out = []
    for _ in range(REQUESTS):
        response = server.http.post("/v2/models/m/infer", json=doc)
        body = response.json()
        out.append(body["outputs"][0]["data"][0] if response.status_code == 200 else body)
    return out


def kill_replicas(server: Server) -> None:
    """SIGKILL both replicas; return once two new ones serve."""
    workers = server.stats("m")["workers"]
    pids = replica_children(server.process.pid)
    assert len(pids) == 2
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    wait_until(
        lambda: (
            server.stats("m")["workers"]["restarts"] >= workers["restarts"] + 2
            and server.stats("m")["workers"]["alive"] == 2
        ),
        "both replicas to restart",
    )
    assert not pids & replica_children(server.process.pid)


def snapshots(tmp: Path) -> list[Path]:
    return sorted(tmp.glob("carpool-m-*"))


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    model = tmp_path / "models" / "m"
    model.mkdir(parents=True)
    write(model / "carpool.toml", SETTINGS)
    write(model / "model.py", times(2.0))
    return model


@pytest.fixture
def server(serve: Launcher, folder: Path, tmp_path: Path) -> Server:
    (tmp_path / "tmp").mkdir()
    return serve(
        str(folder.parent),
        "--model-control-mode",
        "explicit",
        "--load-model",
        "m",
        env={"TMPDIR": str(tmp_path / "tmp")},
    )


def test_a_replica_restarts_into_its_versions_code_not_the_edited_file(
    server: Server, folder: Path
) -> None:
    assert answers(server) == [2.0] * REQUESTS
    write(folder / "model.py", times(3.0))  # no load
    kill_replicas(server)
    assert answers(server) == [2.0] * REQUESTS


def test_a_failed_load_leaves_replicas_restarting_into_the_version_serving(
    server: Server, folder: Path, tmp_path: Path
) -> None:
    write(folder / "model.py", 'raise RuntimeError("broken v2")\n')
    response = server.http.post("/v2/repository/models/m/load")
    assert response.status_code == 400
    assert "broken v2" in response.json()["error"]
    kill_replicas(server)
    assert answers(server) == [2.0] * REQUESTS
    assert server.http.get("/v2/health/ready").status_code == 200
    assert len(snapshots(tmp_path / "tmp")) == 1  # the failed load's copy is gone

    write(folder / "model.py", times(4.0))
    assert server.http.post("/v2/repository/models/m/load").status_code == 200
    assert answers(server) == [4.0] * REQUESTS
    kill_replicas(server)
    assert answers(server) == [4.0] * REQUESTS
