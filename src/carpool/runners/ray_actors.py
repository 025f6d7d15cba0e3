"""Run a model in Ray actors anywhere in a cluster: ``runner="ray"`` (see :mod:`carpool.runners`).

``RayReplicas.call(batch)`` is a thread-safe, blocking stand-in for the model function, like
:class:`carpool.runners.processes.ProcessReplicas`'s: it takes a free actor (one batch per
actor at a time, so the batcher still forms a batch only when some actor is free), sends the stacked
batch through Ray's object store (numpy arrays travel out of band, never row by row) and
returns the outputs. Each actor loads the model spec once (the same specs as process
workers: :func:`carpool.runners.replica_process.load_model`) and runs the warm-up batch before it
counts as ready. A health watch (one thread, see :meth:`RayReplicas._watch`) pings idle and
restarting actors twice a second, so ``alive`` (the server's readiness) follows the cluster
even while no batch runs. Faults, each with one outcome:

- an actor dies mid-batch (its process killed, its node lost): Ray restarts it
  (``max_restarts``); the batch runs once more on another actor (``retry=True``), then
  :class:`WorkerDied`;
- an idle actor dies, or answers no ping for ``_PING_TIMEOUT_S`` (its node lost): it is
  not ready until it answers again (with no actor ready, the server's readiness is 503),
  and counts as restarted if Ray started it anew (on a replacement node, say);
- the Ray connection fails (``ray.shutdown()``, a lost Ray Client session): ``alive`` is 0
  until the watch reaches Ray again;
- a batch runs past ``batch_timeout_ms``: :class:`BatchTimeout`, and the actor is killed
  and restarted by Ray;
- no actor can load the model, or Ray cannot be reached: :class:`WorkerStartError` with
  the reason (and the address); an actor whose model does not load after a restart is
  stopped, its reason logged;
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
from carpool.runners.processes import PoolStats, WorkerState
from carpool.runners.replica_process import load_model

__all__ = ["RayReplicas"]

log = logging.getLogger("carpool.workers")

STARTING, IDLE, BUSY, RESTARTING, STOPPED = "starting", "idle", "busy", "restarting", "stopped"
_WATCH_S = 0.5  # how often the watch pings: readiness lags what Ray knows by at most this
# An idle actor answers a ping in about a millisecond; five seconds unanswered is a lost
# process or node (or a driver too starved to serve anyway), not a slow answer.
_PING_TIMEOUT_S = 5.0
_CONNECT_S = 5.0  # how long a Ray address may take to accept a connection


class _Replica:
    """The actor: one model replica. Its class is wrapped by ``ray.remote`` at start."""

    def __init__(self, spec: Any, warmup: Any) -> None:
        # A load failure is reported by ping(), with the reason as a process worker gives
        # it, rather than by the creation task (Ray would restart the actor to fail again).
        self.failure: str | None = None
        self.incarnation = os.urandom(8).hex()  # new with each restart Ray makes
        try:
            self.fn = load_model(spec)
            if warmup is not None:
                self.fn(warmup)
        except Exception as exc:
            self.failure = "".join(traceback.format_exception_only(exc)).strip()

    def ping(self) -> tuple[int, str, str | None]:
        """This process's pid, this incarnation's token, and why the model did not load
        (None: it did)."""
        return os.getpid(), self.incarnation, self.failure

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
        self.incarnation: str | None = None  # the token of the process that last answered
        self.taken = 0  # batches handed to it: a ping sent before the latest one is stale
        self.ping: _Ping | None = None  # the watch's ping in flight (the watch's alone)


class _Ping:
    """A ping in flight: its object ref, when it was sent, and ``_Actor.taken`` then."""

    __slots__ = ("ref", "sent", "taken")

    def __init__(self, ref: Any, sent: float, taken: int) -> None:
        self.ref, self.sent, self.taken = ref, sent, taken


class RayReplicas:
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
        self._lost_connection: str | None = None  # why the watch gets no answers (None: it does)
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"<RayReplicas {self.name!r} workers={self.workers} alive={self.alive}>"

    # ------------------------------------------------------------- lifecycle

    def start(self) -> RayReplicas:
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
                answer = ray.get(actor.handle.ping.remote(), timeout=self.start_timeout_s)
            except Exception as exc:  # the actor could not be placed, or died starting
                failures.append((actor, _reason(exc)))
                continue
            actor.pid, actor.incarnation, failure = answer
            if failure is not None:
                failures.append((actor, failure))
            else:
                actor.state = IDLE
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
        self._watcher = threading.Thread(
            target=self._watch, name=f"carpool-ray-watch {self.name}", daemon=True
        )
        self._watcher.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Take no new batches, let running ones finish (up to ``timeout`` seconds), then
        kill the actors. Idempotent; the Ray connection stays as it was."""
        deadline = time.monotonic() + timeout
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._stopping.set()
            self._cond.notify_all()
            self._cond.wait_for(lambda: all(a.state != BUSY for a in self._actors), timeout)
            actors, self._actors = self._actors, []
        if self._watcher is not None:  # its Ray calls never block: it ends within a round
            self._watcher.join(max(deadline - time.monotonic(), 1.0))
        for actor in actors:
            actor.state = STOPPED
            if self._ray is not None:
                self._ray.kill(actor.handle, no_restart=True)

    @property
    def alive(self) -> int:
        """Actors ready now (idle or running a batch); 0 while Ray is unreachable."""
        with self._cond:
            return self._alive()

    def _alive(self) -> int:
        ray = self._ray
        if ray is None or self._lost_connection is not None or not ray.is_initialized():
            return 0
        return sum(a.state in (IDLE, BUSY) for a in self._actors)

    def stats(self) -> PoolStats:
        with self._cond:
            states = tuple(
                WorkerState(a.name, a.pid, a.state, a.restarts, a.last_exit) for a in self._actors
            )
            return PoolStats(
                name=self.name,
                workers=self.workers,
                alive=self._alive(),
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
                    actor.taken += 1  # a ping already sent to it waits behind this batch
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

    def _lost(
        self, actor: _Actor, reason: str, *, kill: bool = False, idle_since: int | None = None
    ) -> None:
        """``actor`` died (or is killed now): not ready until it answers the watch's ping
        again (Ray restarts it). With ``idle_since`` (the watch's ``taken`` when it sent the
        ping that failed), only if no batch has taken the actor since: that batch tells."""
        with self._cond:
            if idle_since is not None and (actor.state != IDLE or actor.taken != idle_since):
                return
            actor.state = RESTARTING
            actor.last_exit = reason
            self._died += not kill
        log.error("model worker %s (Ray actor, pid %s) died: %s", actor.name, actor.pid, reason)
        if kill:
            self._ray.kill(actor.handle, no_restart=False)

    # ------------------------------------------------------------- the health watch

    def _watch(self) -> None:
        """The watch's thread, until :meth:`close`: each round collects the answers to the
        pings in flight, then pings every idle or restarting actor that has none.

        Only idle actors are pinged, never busy ones: an actor runs one method at a time, so
        a ping to a busy actor would wait behind its batch, and a long batch would look like
        a death. (A concurrency group for the ping would answer beside the batch, but makes
        every actor threaded, running the model off its main thread, and a model holding the
        GIL would starve the ping just the same.) A running batch is its own health check
        (``RayActorError``, ``batch_timeout_ms``), and a ping overtaken by a batch (``taken``
        moved on) is judged by nobody. Every Ray call here returns at once (``ray.wait``
        with ``timeout=0``, ``ray.get`` of ready refs, sending a ping), so :meth:`call` pays no
        round trip for the watch, and close() never waits for it more than a round."""
        while not self._stopping.wait(_WATCH_S):
            try:
                self._watch_once()
            except Exception as exc:  # not an actor's answer: the connection itself
                self._connection(_reason(exc))
            else:
                self._connection(None)

    def _watch_once(self) -> None:
        ray = self._ray
        if not ray.is_initialized():
            raise ConnectionError("ray.shutdown() was called in this process")
        pinged = [(a, p) for a in self._actors if (p := a.ping) is not None]
        refs = [ping.ref for _, ping in pinged]
        ready = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0]) if refs else set()
        now = time.monotonic()
        for actor, ping in pinged:
            with self._cond:
                overtaken = actor.taken != ping.taken
            if overtaken:  # it waits behind a batch, which tells whether the actor lives
                actor.ping = None
            elif ping.ref in ready:
                actor.ping = None
                self._answered(actor, ping)
            elif now - ping.sent > _PING_TIMEOUT_S:  # lost if idle; if restarting, keep waiting
                silent = f"no answer to a ping for {_PING_TIMEOUT_S:g} s (its node lost?)"
                self._lost(actor, silent, idle_since=ping.taken)
        with self._cond:
            due = [
                (a, a.taken)
                for a in self._actors
                if a.ping is None and a.state in (IDLE, RESTARTING)
            ]
        for actor, taken in due:
            actor.ping = _Ping(actor.handle.ping.remote(), time.monotonic(), taken)

    def _answered(self, actor: _Actor, ping: _Ping) -> None:
        """Act on the answer to ``ping``: an error marks an idle actor lost; a pid and
        token make a restarting one ready (a restart if the token is new)."""
        ray = self._ray
        try:
            # Ready, so at once; a zero timeout could read as this actor's death.
            pid, incarnation, failure = ray.get(ping.ref, timeout=_PING_TIMEOUT_S)
        except ray.exceptions.RayError as exc:  # dead, or still restarting: ask again
            self._lost(actor, _reason(exc), idle_since=ping.taken)
            return
        with self._cond:
            if actor.taken != ping.taken or actor.state not in (IDLE, RESTARTING):
                return  # a batch took it since, or it was stopped
            restarted = incarnation != actor.incarnation
            if not restarted and actor.state == IDLE:
                return  # the usual answer
            if restarted and actor.state == IDLE:  # it died and came back between two pings
                self._died += 1
                actor.last_exit = "restarted by Ray between two pings"
            actor.pid, actor.incarnation = pid, incarnation
            actor.restarts += restarted
            actor.state = IDLE if failure is None else STOPPED
            if failure is not None:
                actor.last_exit = failure
            self._cond.notify_all()
        if failure is not None:
            log.error("model worker %s could not load its model again: %s", actor.name, failure)
            ray.kill(actor.handle, no_restart=True)
        elif restarted:
            log.info("model worker %s is back (Ray actor, pid %s)", actor.name, pid)
        else:
            log.info("model worker %s answers again (Ray actor, pid %s)", actor.name, pid)

    def _connection(self, lost: str | None) -> None:
        """Record whether the watch reaches Ray (``lost``: why not), logging changes."""
        was, self._lost_connection = self._lost_connection, lost
        if lost is not None and was is None:
            log.error("model %s lost its Ray connection, not ready: %s", self.name, lost)
        elif lost is None and was is not None:
            log.info("model %s reaches Ray again", self.name)


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
