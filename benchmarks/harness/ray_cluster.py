"""benchmarks.workers.ray_scale's Ray side: a loopback cluster (started, shut down to its last
process) and its CPU seconds; the Serve application it compares carpool with, bound to
loopback, called through a handle that counts batches; a filter that keeps Serve's router
quiet. It measures nothing itself. Ray is imported where it is used (it is optional).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import processes as _process

# Set before Ray is first imported (it is imported in functions below), and inherited by
# every node and worker: each node binds and advertises 127.0.0.1, and nothing reports
# usage statistics anywhere.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

SLOTS = {"carpool_slot": 1, "serve_slot": 1}  # per node: one carpool actor, one Serve replica


# ------------------------------------------------------------------------------ cluster


def descendants() -> set[int]:
    """Live processes under this one (Ray's nodes, their agents and workers)."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(proc.name))
    found, todo = set(), [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def cluster_cpu_seconds() -> float:
    """CPU seconds used so far by this process and every process under it: the client,
    carpool, Serve's router, and the whole cluster (nodes, agents, actors, replicas)."""
    return _process.total_cpu_seconds(descendants())


def start_cluster(nodes: int) -> Any:
    """``nodes`` Ray nodes on loopback, this process connected as the driver. Each node
    offers ``carpool_slot`` and ``serve_slot``: at 4 replicas, one of each per node."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "resources": SLOTS, "include_dashboard": False},
    )
    for _ in range(nodes - 1):
        cluster.add_node(num_cpus=1, resources=SLOTS)
    ray.init(address=cluster.address, log_to_driver=False, logging_level=logging.WARNING)
    alive = alive_nodes()
    where = {n["NodeManagerAddress"] for n in alive}
    if len(alive) != nodes or where != {"127.0.0.1"}:
        raise RuntimeError(f"expected {nodes} nodes on 127.0.0.1, got {len(alive)} on {where}")
    return cluster


def alive_nodes() -> list[dict[str, Any]]:
    """The connected cluster's live nodes, as ``ray.nodes()`` describes them."""
    import ray

    return [n for n in ray.nodes() if n["Alive"]]


def stop_cluster(cluster: Any) -> int:
    """Serve, the driver's connection and every node down; the processes left after 60 s."""
    import ray
    from ray import serve

    if ray.is_initialized():
        try:
            serve.shutdown()
        except Exception as exc:  # Serve never started, or already gone
            print(f"  (serve.shutdown: {type(exc).__name__}: {exc})")
        ray.shutdown()
    cluster.shutdown()
    deadline = time.monotonic() + 60
    while descendants() and time.monotonic() < deadline:
        time.sleep(0.5)
    return len(descendants())


# ------------------------------------------------------------------------------ Serve

APP = "ray_scale"  # the Serve application's name


def loopback_grpc() -> None:
    """Rebind a Serve replica's inter-deployment gRPC server to 127.0.0.1 (Ray 2.60 binds
    it to ``[::]:0``, every interface). Runs in the replica's constructor, which Serve calls
    before it starts that server."""
    import importlib

    replica: Any = importlib.import_module("ray.serve._private.replica")
    bind = replica.add_port_to_grpc_server

    def on_loopback(server: Any, address: str) -> Any:
        return bind(server, address.replace("[::]", "127.0.0.1"))

    replica.add_port_to_grpc_server = on_loopback


def deploy_serve(
    model: Callable[[np.ndarray[Any, Any]], np.ndarray[Any, Any]],
    replicas: int,
    *,
    max_batch: int,
    wait_s: float,
    max_ongoing: int,
    num_cpus: float,
) -> Any:
    """``model`` as a Serve application of ``replicas`` replicas, each on a ``serve_slot``;
    its handle. Each answer is (the model's row, size of the batch it ran in), so the client
    can count batches."""
    from ray import serve

    @serve.deployment(
        max_ongoing_requests=max_ongoing,
        ray_actor_options={"num_cpus": num_cpus, "resources": {"serve_slot": 1}},
        logging_config={"enable_access_log": False},  # a log line per request costs Serve
    )
    class Batched:
        def __init__(self) -> None:
            loopback_grpc()

        @serve.batch(max_batch_size=max_batch, batch_wait_timeout_s=wait_s)
        async def __call__(self, rows: list[Any]) -> list[tuple[Any, int]]:
            out = await asyncio.to_thread(model, np.stack(rows))  # off the replica's loop
            return [(o, len(rows)) for o in out]

    app = Batched.options(num_replicas=replicas).bind()  # type: ignore[attr-defined]
    return serve.run(app, name=APP, route_prefix=None)


class QuietServe(logging.Filter):
    """On Serve's driver-side logger: counts its router's queue-length probes that timed out
    and keeps everything below ERROR off the report."""

    def __init__(self) -> None:
        super().__init__()
        self.late_probes = 0

    def filter(self, record: logging.LogRecord) -> bool:
        self.late_probes += record.getMessage().startswith("Failed to get queue length")
        return record.levelno >= logging.ERROR


class ServeClient:
    """Calls the deployment; counts answered rows and batches (sum of 1 / batch size)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.rows = 0
        self.batches = 0.0

    async def __call__(self, row: np.ndarray[Any, Any]) -> Any:
        out, size = await self.handle.remote(row)
        self.rows += 1
        self.batches += 1 / size
        return out

    def counts(self) -> tuple[float, float]:
        return self.rows, self.batches
