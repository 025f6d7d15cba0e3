"""Where replicas live (threads, child processes, Ray actors): runner names, make_replicas."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from carpool.errors import ConfigError

if TYPE_CHECKING:
    from carpool.runners.replicas import ReplicaStats

__all__ = [
    "RUNNERS",
    "RUNNER_OPTIONS",
    "Replicas",
    "make_replicas",
]

RUNNERS = ("thread", "process", "ray")


class Replicas(Protocol):
    """Model replicas the batcher's threads call into, ``workers`` of them.

    ``start()`` blocks until every replica has loaded (and warmed up) its model, raising
    :class:`~carpool.errors.WorkerStartError` when none could. ``call(batch)`` is
    thread-safe and blocking: it runs one stacked batch on a free replica and returns its
    outputs; a replica lost mid-batch costs one retry on another (unless ``retry=False``),
    then :class:`~carpool.errors.WorkerDied`; a batch past its time limit raises
    :class:`~carpool.errors.BatchTimeout`; once closed, calls raise
    :class:`~carpool.errors.WorkerPoolClosed`. ``alive`` counts the replicas ready now.
    :class:`carpool.runners.replicas.ReplicaSet` implements all of it but the launch.
    """

    workers: int

    def start(self) -> object: ...

    def call(self, batch: Any, *, retry: bool | None = None) -> Any: ...

    def close(self, timeout: float = 10.0) -> None: ...

    @property
    def alive(self) -> int: ...

    def stats(self) -> ReplicaStats: ...


# What runner_options each runner takes.
RUNNER_OPTIONS = {
    "thread": frozenset(),
    "process": frozenset(),
    "ray": frozenset({"address", "num_cpus", "num_gpus", "resources", "max_restarts"}),
}


def make_replicas(
    runner: str,
    spec: Any,
    *,
    workers: int,
    name: str,
    batch_timeout_ms: float | None,
    retry: bool,
    warmup: Any,
    options: Mapping[str, Any] | None = None,
) -> Replicas:
    """The replicas of ``runner`` (not ``"thread"``) for the model ``spec``, not started.

    ``spec`` is what each replica loads once: a picklable batch function, or a
    zero-argument factory returning one (or a :class:`carpool.Model`); see
    :func:`carpool.runners.replicas.replica_fn`. ``warmup`` is a stacked batch each replica
    runs before it counts as ready. The values come checked by the Batcher.
    """
    if runner == "process":
        from carpool.runners.processes import ProcessReplicas

        return ProcessReplicas(
            spec,
            workers,
            name=name,
            batch_timeout_ms=batch_timeout_ms,
            retry=retry,
            warmup=warmup,
        )
    if runner == "ray":
        from carpool.runners.ray_actors import RayReplicas

        given = dict(options or {})
        return RayReplicas(
            spec,
            workers,
            name=name,
            batch_timeout_ms=batch_timeout_ms,
            retry=retry,
            warmup=warmup,
            address=given.pop("address", None),
            actor_options=given,
        )
    raise ConfigError(f"runner {runner!r} has no replicas of its own")
