"""Run a model in Ray actors anywhere in a cluster: ``runner="ray"`` (see :mod:`carpool.runners`).

``RayWorkers.call(batch)`` is a thread-safe, blocking stand-in for the model function, like
:class:`carpool.process_pool.ProcessPool`'s: it takes a free actor (one batch per actor at a
time, so the batcher still forms a batch only when some actor is free), sends the stacked
batch through Ray's object store (numpy arrays travel out of band, never row by row) and
returns the outputs. Each actor loads the model spec once (the same specs as process
workers: :func:`carpool.process_worker.load_model`) and runs the warm-up batch before it
counts as ready. Faults, each with one outcome:

- an actor dies mid-batch (its process killed, its node lost): Ray restarts it
  (``max_restarts``); the batch runs once more on another actor (``retry=True``), then
  :class:`WorkerDied`;
- a batch runs past ``batch_timeout_ms``: :class:`BatchTimeout`, and the actor is killed
  and restarted by Ray;
- no actor can load the model, or Ray cannot be reached: :class:`WorkerStartError` with
  the reason (and the address);
- the model raises: its own exception, unwrapped from Ray's.

Ray is imported when these workers start, so ``import carpool`` never imports it.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import traceback
from collections.abc import Mapping
from typing import Any

from carpool.errors import BatchTimeout, WorkerDied, WorkerPoolClosed, WorkerStartError
from carpool.process_pool import PoolStats, WorkerState
from carpool.process_worker import load_model

__all__ = ["RayWorkers"]

log = logging.getLogger("carpool.workers")

STARTING, IDLE, BUSY, RESTARTING, STOPPED = "starting", "idle", "busy", "restarting", "stopped"
_PING_S = 0.5  # how often a restarting actor is asked whether it is back
_CONNECT_S = 5.0  # how long a Ray address may take to accept a connection


class _Replica:
    """The actor: one model replica. Its class is wrapped by ``ray.remote`` at start."""

    def __init__(self, spec: Any, warmup: Any) -> None:
        # A load failure is reported by ready(), with the reason as a process worker gives
        # it, rather than by the creation task (Ray would restart the actor to fail again).
        self.failure: str | None = None
        try:
            self.fn = load_model(spec)
            if warmup is not None:
                self.fn(warmup)
        except Exception as exc:
            self.failure = "".join(traceback.format_exception_only(exc)).strip()

    def ready(self) -> tuple[int, str | None]:
        """This process's pid, and why the model did not load (None: it did)."""
        return os.getpid(), self.failure

    def pid(self) -> int:
        return os.getpid()

    def run(self, batch: Any) -> Any:
        return self.fn(batch)


class _Actor:
    """One worker position: its Ray handle and what carpool knows of it."""

    def __init__(self, name: str, handle: Any) -> None:
        self.name = name
        self.handle = handle
        self.state = STARTING
        self.pid: int | None = None
        self.restarts = 0
        self.last_exit: str | None = None


class RayWorkers:
    """``workers`` Ray actors running the model ``spec`` (see the module docstring).

    ``address``: the Ray cluster (``ray://``, ``host:port``); ``None`` uses this process's
    connection if it called ``ray.init()``, else the running cluster ``ray.init("auto")``
    finds. ``actor_options``: per-actor resources and restarts, e.g. ``{"num_cpus": 1,
    "num_gpus": 1, "resources": {"node_a": 1}, "max_restarts": -1}``.
    """

    def __init__(
        self,
        spec: Any,
        workers: int = 1,
        *,
        name: str = "model",
        batch_timeout_ms: float | None = None,
        retry: bool = True,
        warmup: Any = None,
        address: str | None = None,
        actor_options: Mapping[str, Any] | None = None,
        start_timeout_s: float = 600.0,
    ) -> None:
        self.name = name
        self.workers = workers
        self.batch_timeout_ms = batch_timeout_ms
        self.retry = retry
        self.address = address
        self.actor_options = {"num_cpus": 1, "max_restarts": -1, **(actor_options or {})}
        self.start_timeout_s = start_timeout_s
        self._spec = spec
        self._warmup = warmup
        self._actors: list[_Actor] = []
        self._cond = threading.Condition()
        self._closed = False
        self._retried = 0
        self._timed_out = 0
        self._died = 0
        self._ray: Any = None

    def __repr__(self) -> str:
        return f"<RayWorkers {self.name!r} workers={self.workers} alive={self.alive}>"

    # ------------------------------------------------------------- lifecycle

    def start(self) -> RayWorkers:
        """Connect to Ray, create the actors and wait until each has loaded its model.
        Raises :class:`WorkerStartError` (and leaves no actor) when Ray cannot be reached
        or no actor could load the model."""
        ray = self._ray = _connect(self.address, self.name)
        remote = ray.remote(_Replica).options(**self.actor_options)
        self._actors = [
            _Actor(f"{self.name}#{i}", remote.remote(self._spec, self._warmup))
            for i in range(self.workers)
        ]
        failures = []
        for actor in self._actors:
            try:
                pid, failure = ray.get(actor.handle.ready.remote(), timeout=self.start_timeout_s)
            except Exception as exc:  # the actor could not be placed, or died starting
                failures.append((actor, _reason(exc)))
                continue
            if failure is not None:
                failures.append((actor, failure))
            else:
                actor.pid, actor.state = pid, IDLE
        for actor, reason in failures:
            log.error("model worker %s could not load its model: %s", actor.name, reason)
            actor.state = STOPPED
            ray.kill(actor.handle, no_restart=True)
        if len(failures) == len(self._actors):
            self.close()
            actor, reason = failures[0]
            raise WorkerStartError(worker=actor.name, reason=reason)
        for actor in self._actors:
            if actor.state == IDLE:
                log.info("model worker %s (Ray actor, pid %s) is ready", actor.name, actor.pid)
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Take no new batches, let running ones finish (up to ``timeout`` seconds), then
        kill the actors. Idempotent; the Ray connection stays as it was."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
            self._cond.wait_for(lambda: all(a.state != BUSY for a in self._actors), timeout)
            actors, self._actors = self._actors, []
        for actor in actors:
            actor.state = STOPPED
            if self._ray is not None:
                self._ray.kill(actor.handle, no_restart=True)

    @property
    def alive(self) -> int:
        """Actors ready now (idle or running a batch); 0 while Ray is unreachable."""
        ray = self._ray
        if ray is None or not ray.is_initialized():
            return 0
        with self._cond:
            return sum(a.state in (IDLE, BUSY) for a in self._actors)

    def stats(self) -> PoolStats:
        with self._cond:
            states = tuple(
                WorkerState(a.name, a.pid, a.state, a.restarts, a.last_exit) for a in self._actors
            )
            return PoolStats(
                name=self.name,
                workers=self.workers,
                alive=sum(a.state in (IDLE, BUSY) for a in self._actors),
                restarts=sum(a.restarts for a in self._actors),
                retried=self._retried,
                timed_out=self._timed_out,
                died=self._died,
                processes=states,
            )

    # ------------------------------------------------------------- batches

    def call(self, batch: Any, *, retry: bool | None = None) -> Any:
        """Run ``batch`` on a free actor and return its outputs. Raises what the model
        raised, or :class:`WorkerDied`, :class:`BatchTimeout`, :class:`WorkerPoolClosed`."""
        retry = self.retry if retry is None else retry
        retried = False
        while True:
            actor = self._acquire()
            try:
                return self._run(actor, batch)
            except _ActorLost as lost:
                if retried or not retry:
                    raise WorkerDied(
                        worker=actor.name, exitcode=-9, retried=retried, cause=lost.reason
                    ) from None
                retried = True
                with self._cond:
                    self._retried += 1
                log.warning("retrying the batch that model worker %s died on", actor.name)

    def _acquire(self) -> _Actor:
        deadline = None
        if self.batch_timeout_ms is not None:
            deadline = time.monotonic() + self.batch_timeout_ms / 1000
        with self._cond:
            while True:
                if self._closed:
                    raise WorkerPoolClosed(self.name)
                actor = next((a for a in self._actors if a.state == IDLE), None)
                if actor is not None:
                    actor.state = BUSY
                    return actor
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    self._timed_out += 1
                    raise BatchTimeout(
                        timeout_ms=float(self.batch_timeout_ms or 0),
                        worker=self.name,
                        stage="waiting",
                    )
                self._cond.wait(remaining)

    def _run(self, actor: _Actor, batch: Any) -> Any:
        ray = self._ray
        exceptions = ray.exceptions
        timeout = None if self.batch_timeout_ms is None else self.batch_timeout_ms / 1000
        ref = actor.handle.run.remote(batch)
        try:
            result = ray.get(ref, timeout=timeout)
        except exceptions.GetTimeoutError:
            self._lost(actor, "killed: its batch ran past batch_timeout_ms", kill=True)
            with self._cond:
                self._timed_out += 1
            raise BatchTimeout(
                timeout_ms=float(self.batch_timeout_ms or 0), worker=actor.name
            ) from None
        except exceptions.RayTaskError as exc:  # the model raised: give back its own error
            self._free(actor)
            cause = exc.cause if isinstance(exc.cause, Exception) else exc
            raise cause from None
        except (exceptions.RayActorError, exceptions.ObjectLostError) as exc:
            reason = _reason(exc)
            self._lost(actor, reason)
            raise _ActorLost(reason) from None
        self._free(actor)
        return result

    def _free(self, actor: _Actor) -> None:
        with self._cond:
            if actor.state == BUSY:
                actor.state = IDLE
            self._cond.notify_all()

    def _lost(self, actor: _Actor, reason: str, *, kill: bool = False) -> None:
        """``actor`` died (or is killed now): Ray restarts it; a thread watches for it."""
        log.error("model worker %s (Ray actor, pid %s) died: %s", actor.name, actor.pid, reason)
        with self._cond:
            actor.state = RESTARTING
            actor.last_exit = reason
            self._died += not kill
        if kill:
            self._ray.kill(actor.handle, no_restart=False)
        threading.Thread(
            target=self._await_restart, args=(actor,), name=f"carpool-ray-{actor.name}", daemon=True
        ).start()

    def _await_restart(self, actor: _Actor) -> None:
        while not self._closed:
            try:
                pid = self._ray.get(actor.handle.pid.remote(), timeout=self.start_timeout_s)
            except Exception:  # still restarting (or gone for good: Ray says so in the log)
                time.sleep(_PING_S)
                continue
            with self._cond:
                if actor.state == RESTARTING:
                    actor.state, actor.pid = IDLE, pid
                    actor.restarts += 1
                    self._cond.notify_all()
            log.info("model worker %s is back (Ray actor, pid %s)", actor.name, pid)
            return


class _ActorLost(Exception):
    def __init__(self, reason: str) -> None:
        self.reason = reason


def _connect(address: str | None, name: str) -> Any:
    """The ``ray`` module, connected: to ``address``, to this process's connection, or to
    the running cluster ``ray.init("auto")`` finds. :class:`WorkerStartError` if none."""
    try:
        import ray
    except ImportError as exc:
        raise WorkerStartError(
            worker=name, reason=f"runner 'ray' needs Ray: pip install 'carpool[ray]' ({exc})"
        ) from None
    if ray.is_initialized() and address is None:
        return ray
    where = address or "auto"
    try:
        _check_reachable(where)
        ray.init(address=where, logging_level=logging.WARNING, log_to_driver=False)
    except Exception as exc:  # ConnectionError, or anything Ray raises for a bad address
        raise WorkerStartError(
            worker=name,
            reason=f"cannot reach the Ray cluster at {where!r}: {_reason(exc)}; start one "
            "(`ray start --head`) or give its address (--ray-address, CARPOOL_RAY_ADDRESS)",
        ) from None
    return ray


def _check_reachable(address: str) -> None:
    """Fail in seconds, not after Ray's minute of retries, when nothing listens at a
    ``host:port`` address (``auto`` and ``ray://`` addresses are left to Ray)."""
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return
    with socket.create_connection((host, int(port)), timeout=_CONNECT_S):
        pass


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
