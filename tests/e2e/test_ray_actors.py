"""carpool.runners.ray_actors: ``Batcher(runner="ray")`` on a real 3-node Ray cluster on loopback.

One cluster for the module (``ray.cluster_utils.Cluster``; every node binds 127.0.0.1, as
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` makes it), each node offering a resource of its own
(``node_0``..``node_2``) so that a test can place actors on named nodes. Torn down at the end,
and nothing of it may be left running.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

import carpool
import process_models as pm
from carpool.loading import load_target
from conftest import running, wait_until

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parent.parent
SERVE = [sys.executable, "-m", "carpool", "serve", "demo", "--grpc-port", "0"]
NODES = 3


def _ray_processes(session: str) -> set[int]:
    """PIDs of the Ray daemons (raylet, gcs_server) of one cluster: those naming its session
    folder. Another cluster on this machine (another test run, a benchmark) is not counted,
    and an orphaned daemon of this one still is."""
    found = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        program = cmdline.split(b"\0")[0]
        daemon = b"raylet" in program or b"gcs_server" in program
        if daemon and session.encode() in cmdline:
            found.add(int(proc.name))
    return found


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    import ray
    from ray.cluster_utils import Cluster

    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"  # conftest: on 127.0.0.1
    paths = [str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)  # actors import tests/
    nodes = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "resources": {"node_0": 4}, "include_dashboard": False},
    )
    session = nodes.head_node.get_session_dir_path()
    assert _ray_processes(session)  # the check below sees this cluster's daemons
    for i in range(1, NODES):
        nodes.add_node(num_cpus=2, resources={f"node_{i}": 4})
    ray.init(address=nodes.address, log_to_driver=False)
    yield nodes
    ray.shutdown()
    nodes.shutdown()
    wait_until(lambda: not _ray_processes(session), "Ray's daemons to exit", 60)


def run(batcher: carpool.Batcher, xs: list[Any]) -> list[Any]:
    async def main() -> list[Any]:
        async with batcher:
            return list(await asyncio.gather(*(batcher.infer(x) for x in xs)))

    return asyncio.run(main())


def row(first: float, n: int = 3) -> np.ndarray[Any, Any]:
    value = np.arange(n, dtype=np.float64) + 1
    value[0] = first
    return value


def test_every_node_is_on_loopback(cluster: Any) -> None:
    import ray

    nodes = [n for n in ray.nodes() if n["Alive"]]
    assert len(nodes) == NODES
    assert {n["NodeManagerAddress"] for n in nodes} == {"127.0.0.1"}


def test_actors_land_on_the_node_their_resources_name(cluster: Any) -> None:
    import ray

    node_1 = next(n["NodeID"] for n in ray.nodes() if "node_1" in n["Resources"])
    batcher = carpool.Batcher(
        pm.node_and_double,
        runner="ray",
        workers=2,
        max_batch_size=4,
        runner_options={"num_cpus": 0.5, "resources": {"node_1": 1}},
    )
    outs = run(batcher, [row(float(i)) for i in range(12)])
    assert {str(o["node"]) for o in outs} == {node_1}
    assert [float(o["y"][0]) for o in outs] == [2.0 * i for i in range(12)]


def test_ray_results_equal_thread_results_bit_for_bit(cluster: Any) -> None:
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal(256).astype(np.float32) for _ in range(40)]
    threads = run(carpool.Batcher(load_target("demo").fn, max_batch_size=8), xs)
    spec = functools.partial(load_target, "demo")
    actors = run(
        carpool.Batcher(
            spec, runner="ray", workers=3, max_batch_size=8, runner_options={"num_cpus": 0.5}
        ),
        xs,
    )
    for got, want in zip(actors, threads, strict=True):
        assert (got.dtype, got.shape) == (want.dtype, want.shape)
        assert got.tobytes() == want.tobytes()


def test_a_killed_actor_loses_no_request(cluster: Any) -> None:
    async def main() -> None:
        batcher = carpool.Batcher(
            pm.pid_and_double,
            runner="ray",
            workers=2,
            max_batch_size=8,
            runner_options={"num_cpus": 0.5},
        )
        async with batcher:
            first = await batcher.infer(row(1.0))
            victim = int(first["pid"])
            xs = [row(float(i)) for i in range(200)]
            xs[0] = row(pm.SLOW)  # a batch that is running when the kill comes
            pending = [asyncio.ensure_future(batcher.infer(x)) for x in xs]
            await asyncio.to_thread(  # the slow batch is on its way to an actor, or in it
                wait_until, lambda: batcher.stats().running_rows > 0, "the first batch to run"
            )
            os.kill(victim, signal.SIGKILL)
            outs = await asyncio.gather(*pending)
            for x, out in zip(xs, outs, strict=True):
                assert out["y"].tolist() == (x * 2).tolist()
            await asyncio.to_thread(wait_until, lambda: batcher.workers_alive == 2, "restart")
            stats = batcher.stats()
            assert (stats.completed, stats.failed) == (201, 0)
            assert stats.worker_restarts == 1
            assert not running(victim)

    asyncio.run(main())


def test_a_hung_batch_times_out_and_later_batches_are_served(cluster: Any) -> None:
    async def main() -> None:
        batcher = carpool.Batcher(
            pm.troublemaker,
            runner="ray",
            workers=1,
            batch_timeout_ms=1000,
            runner_options={"num_cpus": 0.5},
        )
        async with batcher:
            with pytest.raises(carpool.BatchTimeout, match="ran past batch_timeout_ms=1000"):
                await batcher.infer(row(pm.HANG))
            await asyncio.to_thread(wait_until, lambda: batcher.workers_alive == 1, "restart")
            assert await batcher.infer(row(3.0)) == pytest.approx(row(3.0) * 2)
            assert batcher.stats().timed_out_batches == 1

    asyncio.run(main())


def test_the_models_own_error_reaches_its_rows_only(cluster: Any) -> None:
    batcher = carpool.Batcher(
        pm.troublemaker, runner="ray", workers=1, max_batch_size=8, runner_options={"num_cpus": 0.5}
    )

    async def main() -> list[Any]:
        async with batcher:
            xs = [row(float(i)) for i in range(6)] + [row(float("nan"))]
            return list(
                await asyncio.gather(*(batcher.infer(x) for x in xs), return_exceptions=True)
            )

    outs = asyncio.run(main())
    assert [type(o).__name__ for o in outs] == ["ndarray"] * 6 + ["ValueError"]
    assert str(outs[-1]) == "NaN in the batch"


def test_a_model_no_actor_can_load_fails_the_start(cluster: Any) -> None:
    batcher = carpool.Batcher(
        pm.broken_factory, runner="ray", workers=2, runner_options={"num_cpus": 0.5}
    )
    with pytest.raises(carpool.WorkerStartError, match=r"weights file /nowhere/model\.bin"):
        run(batcher, [row(1.0)])


def test_actors_that_cannot_load_again_after_a_restart_fail_their_callers(
    cluster: Any, tmp_path: Path
) -> None:
    """Nothing waits forever: with no replica left that loads the model (and no batch
    timeout), a request gets WorkerStartError with the reason."""
    marker = tmp_path / "gone"

    async def main() -> None:
        spec = functools.partial(pm.loads_until, str(marker))
        batcher = carpool.Batcher(spec, runner="ray", workers=1, runner_options={"num_cpus": 0.5})
        async with batcher:
            victim = int((await batcher.infer(row(1.0)))["pid"])
            marker.touch()
            os.kill(victim, signal.SIGKILL)
            await asyncio.to_thread(wait_until, lambda: batcher.workers_alive == 0, "the loss")
            with pytest.raises(carpool.WorkerStartError, match="the model is gone"):
                await asyncio.wait_for(batcher.infer(row(2.0)), timeout=90)

    asyncio.run(main())


def test_an_unreachable_cluster_is_named_and_carpool_alone_never_imports_ray() -> None:
    script = textwrap.dedent(
        """
        import asyncio, sys
        import carpool
        assert "ray" not in sys.modules
        b = carpool.Batcher(abs, runner="ray", runner_options={"address": "127.0.0.1:9"})
        assert "ray" not in sys.modules
        try:
            asyncio.run(b.__aenter__())
        except carpool.WorkerStartError as exc:
            print(exc)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "cannot reach the Ray cluster at '127.0.0.1:9'" in done.stdout


@contextlib.contextmanager
def serving(cluster: Any, tmp_path: Path, *flags: str) -> Iterator[tuple[Any, str]]:
    """``carpool serve demo`` with 2 Ray actors on ``cluster``, ready: a Triton client for
    it and its URL (its log in ``tmp_path/serve.log``). Stopped with SIGTERM: exit 0."""
    import tritonclient.http as triton

    port = free_port()
    log = tmp_path / "serve.log"
    command = [*SERVE, "--port", str(port), "--runner", "ray",
               "--ray-address", cluster.address, "--workers", "2", *flags]  # fmt: skip
    with open(log, "wb") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    client = triton.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        wait_until(lambda: _ready(client, server), "carpool serve --runner ray", 120)
        yield client, f"http://127.0.0.1:{port}"
    finally:
        client.close()
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=60)
    assert code == 0, log.read_text()[-3000:]
    assert "SIGTERM received" not in log.read_text()  # Ray's handler, which at times aborts


def infers_as_the_demo(client: Any) -> bool:
    """Whether a batch of 5 rows sent to ``demo`` comes back as the demo computes it here."""
    import tritonclient.http as triton

    batch = np.random.default_rng(9).standard_normal((5, 256)).astype(np.float32)
    tensor = triton.InferInput("INPUT0", [5, 256], "FP32")
    tensor.set_data_from_numpy(batch, binary_data=True)
    got = client.infer("demo", [tensor]).as_numpy("OUTPUT0")
    return got is not None and got.tobytes() == load_target("demo").fn(batch).tobytes()


def workers(client: Any) -> Any:
    return client.get_inference_statistics("demo")["model_stats"][0]["workers"]


@pytest.mark.parametrize("frontends", ["1", "2"])
def test_carpool_serve_runs_its_model_in_ray_actors(
    cluster: Any, tmp_path: Path, frontends: str
) -> None:
    with serving(cluster, tmp_path, "--frontends", frontends) as (client, _):
        assert infers_as_the_demo(client)
        assert workers(client) == {
            "runner": "ray",
            "alive": 2,
            "restarts": 0,
            "retried_batches": 0,
            "timed_out_batches": 0,
        }


def readiness(http: httpx.Client) -> tuple[int, int]:
    """The statuses of /v2/health/ready and /v2/models/demo/ready."""
    server = http.get("/v2/health/ready")
    model = http.get("/v2/models/demo/ready")
    return server.status_code, model.status_code


def test_a_lost_node_makes_the_server_unready_until_its_actors_are_back(
    cluster: Any, tmp_path: Path
) -> None:
    """The actors live on a node of their own (resource ``lossy``), idle: losing the node
    turns readiness 503 with no batch to notice it; a new node offering ``lossy`` gets
    them restarted there, and readiness 200 again. The cluster is left as it was."""
    config = tmp_path / "carpool.toml"
    config.write_text("[models.demo]\nray = { num_cpus = 0.5, resources = { lossy = 1 } }\n")
    lossy = cluster.add_node(num_cpus=1, resources={"lossy": 2})
    cluster.wait_for_nodes()
    try:
        with (
            serving(cluster, tmp_path, "--config", str(config)) as (client, url),
            httpx.Client(base_url=url, timeout=10) as http,  # one for every poll below
        ):
            assert infers_as_the_demo(client)
            assert readiness(http) == (200, 200)
            cluster.remove_node(lossy)
            lossy = None
            wait_until(lambda: readiness(http) == (503, 503), "readiness 503, node lost", 30)
            assert workers(client)["alive"] == 0
            lossy = cluster.add_node(num_cpus=1, resources={"lossy": 2})
            wait_until(lambda: readiness(http) == (200, 200), "readiness 200, actors back", 60)
            assert infers_as_the_demo(client)
            # Readiness needs one actor back; the other may still be restarting: wait for
            # both (each restarted once), reading alive and restarts from one snapshot.
            wait_until(lambda: _alive_and_restarts(client) == (2, 2), "both actors back", 60)
            metrics = http.get("/metrics").text
            assert 'carpool_worker_restarts_total{model="demo"} 2.0' in metrics
        lines = (tmp_path / "serve.log").read_text().splitlines()
        for actor in ("demo#0", "demo#1"):  # each loss and return said once
            assert sum(f"model worker {actor} (Ray actor" in x and "died" in x for x in lines) == 1
            assert sum(f"model worker {actor} is back" in x for x in lines) == 1
    finally:
        if lossy is not None:
            cluster.remove_node(lossy)


def _alive_and_restarts(client: Any) -> tuple[int, int]:
    now = workers(client)
    return now["alive"], now["restarts"]


def test_carpool_serve_exits_2_naming_an_unreachable_ray_cluster(tmp_path: Path) -> None:
    port = free_port()
    done = subprocess.run(
        [*SERVE, "--port", str(port), "--runner", "ray", "--ray-address", "127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert "cannot reach the Ray cluster at '127.0.0.1:9'" in done.stderr


def _ready(client: Any, server: subprocess.Popen[bytes]) -> bool:
    assert server.poll() is None, "carpool serve exited before it was ready"
    try:
        return bool(client.is_server_ready())
    except Exception:  # not listening yet
        return False


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Ray Serve 2.60's own models use pydantic features pydantic 2 deprecates.
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.timeout(300)  # Serve's controller and replicas start slowly on a loaded box
def test_the_ray_serve_example_batches_inside_each_replica(cluster: Any) -> None:
    from ray import serve

    sys.path.insert(0, str(TESTS.parent))
    from examples.ray_serve import app as example

    # No HTTP proxy: the test calls through a handle, and a proxy actor that a loaded
    # machine starts slowly is killed by Serve's controller, failing serve.run.
    serve.start(proxy_location="Disabled")
    handle = serve.run(example.app, name="carpool-example", route_prefix=None)
    try:
        rows = [[float(i) / 10] * 16 for i in range(96)]
        # A loaded machine may hand a burst's requests over one by one, each alone in its
        # 5 ms window: bursts go on (at most 8) until a replica shows a shared model call.
        for _ in range(8):
            responses = [handle.remote(r) for r in rows]  # concurrent: they meet in batches
            for r, response in zip(rows, responses, strict=True):
                want = np.asarray(r, dtype=np.float32) @ example.WEIGHTS
                assert response.result(timeout_s=60) == pytest.approx(want.tolist(), rel=1e-6)
            seen = [handle.batching.remote().result(timeout_s=60) for _ in range(6)]
            assert max(s["requests"] for s in seen) > 0
            if any(s["batches"] < s["requests"] for s in seen):
                break  # requests shared model calls
        else:
            pytest.fail(f"8 bursts of 96 requests never shared a model call: {seen}")
    finally:
        serve.shutdown()


def test_step_wise_sequences_keep_their_state_on_their_actor(cluster: Any) -> None:
    from steps.models import Counter

    with carpool.StepBatcher(
        Counter, runner="ray", workers=2, max_sequences=2, runner_options={"num_cpus": 0.5}
    ) as batcher:
        streams = [batcher.stream(n) for n in (5, 3, 4, 1, 2)]
        assert [list(s) for s in streams] == [list(range(1, n + 1)) for n in (5, 3, 4, 1, 2)]
    stats = batcher.stats()
    assert (stats.completed, stats.failed, stats.outputs) == (5, 0, 15)
