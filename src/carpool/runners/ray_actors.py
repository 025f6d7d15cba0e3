"""Run a model in Ray actors anywhere in a cluster: ``runner="ray"``, one replica per actor. This
module creates the actors and carries stacked batches through Ray's object store; the replica
core does the rest, and a health watch (:class:`_Watch`) keeps readiness true to the cluster
while no batch runs. Ray is imported only when the replicas start. Faults and their outcomes:
docs/architecture.md."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from carpool.errors import WorkerStartError, call_model
from carpool.runners.replicas import (
    DOWN,
    IDLE,
    STOPPED,
    ReplicaSet,
    Slot,
    _ReplicaLost,
    load_replica,
)

__all__ = ["RayReplicas"]

log = logging.getLogger("carpool.workers")

_WATCH_S = 0.5  # how often the watch pings: readiness lags what Ray knows by at most this
# An idle actor answers a ping in about a millisecond; five seconds unanswered is a lost
# process or node (or a driver too starved to serve anyway), not a slow answer.
_PING_TIMEOUT_S = 5.0
_CONNECT_S = 5.0  # how long a Ray address may take to accept a connection


class _Replica:
    """The actor: one model replica. Its class is wrapped by ``ray.remote`` at start."""

    def __init__(self, spec: Any, warmup: Any) -> None:
        # A load failure is reported by ping(), with the reason as a child process gives
        # it, rather than by the creation task (Ray would restart the actor to fail again).
        loaded = load_replica(spec, warmup)
        self.fn: Callable[[Any], Any] | None = loaded.fn
        self.failure = loaded.failure
        self.incarnation = os.urandom(8).hex()  # new with each restart Ray makes

    def ping(self) -> tuple[int, str, str | None]:
        """This process's pid, this incarnation's token, and why the model did not load
        (None: it did)."""
        return os.getpid(), self.incarnation, self.failure

    def run(self, batch: Any) -> Any:
        if self.fn is None:  # never sent: an actor that failed to load is stopped
            raise RuntimeError(f"the model did not load: {self.failure}")
        return call_model(self.fn, batch)  # a SystemExit would end the actor


class _Ping:
    """A ping in flight: its object ref, when it was sent, and ``Slot.taken`` then."""

    __slots__ = ("ref", "sent", "taken")

    def __init__(self, ref: Any, sent: float, taken: int) -> None:
        self.ref, self.sent, self.taken = ref, sent, taken


@dataclass(eq=False, kw_only=True)
class _ActorSlot(Slot):
    """A replica position of the Ray runner: its actor's handle, and the token of the
    actor process that last answered (``taken``: a ping sent before the latest batch is
    stale). DOWN: lost, Ray restarts it; the watch's ping says when it is back."""

    handle: Any = None
    incarnation: str | None = None
    ping: _Ping | None = None  # the watch's ping in flight (the watch's alone)


class RayReplicas(ReplicaSet[_ActorSlot]):
    """``workers`` Ray actors running the model ``spec`` (see the module docstring).

    ``address``: the Ray cluster (``ray://``, ``host:port``); ``None`` uses this process's
    connection if it called ``ray.init()``, else the running cluster ``ray.init("auto")``
    finds. ``actor_options``: per-actor resources and restarts, e.g. ``{"num_cpus": 1,
    "num_gpus": 1, "resources": {"node_a": 1}, "max_restarts": -1}``. Values come checked
    from :func:`carpool.runners.make_replicas` (the Batcher checks them).
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
        super().__init__(name=name, workers=workers, batch_timeout_ms=batch_timeout_ms, retry=retry)
        self.address = address
        self.actor_options = {"num_cpus": 1, "max_restarts": -1, **(actor_options or {})}
        self.start_timeout_s = start_timeout_s
        self._spec = spec
        self._warmup = warmup
        self._ray: Any = None
        self._watch: _Watch | None = None

    def start(self) -> RayReplicas:
        """Connect to Ray, create the actors and wait until each has loaded its model.
        Raises :class:`WorkerStartError` (and leaves no actor) when Ray cannot be reached
        or no actor could load the model."""
        ray = self._ray = _connect(self.address, self.name)
        remote = ray.remote(_Replica).options(**self.actor_options)
        slots = self._launch(
            lambda name: _ActorSlot(name=name, handle=remote.remote(self._spec, self._warmup))
        )
        failures = []
        for slot in slots:
            try:
                answer = ray.get(slot.handle.ping.remote(), timeout=self.start_timeout_s)
            except Exception as exc:  # the actor could not be placed, or died starting
                failures.append((slot, _reason(exc)))
                continue
            slot.pid, slot.incarnation, failure = answer
            if failure is not None:
                failures.append((slot, failure))
            else:
                with self.roster.cond:
                    self.roster.ready(slot)
                log.info("model worker %s (Ray actor, pid %s) is ready", slot.name, slot.pid)
        for slot, reason in failures:
            log.error("model worker %s could not load its model: %s", slot.name, reason)
            with self.roster.cond:
                slot.state = STOPPED
            ray.kill(slot.handle, no_restart=True)
        if len(failures) == len(slots):
            slot, reason = failures[0]
            raise self._failed_to_start(slot.name, reason)
        self._watch = _Watch(self)
        return self

    def _alive(self) -> int:
        """Actors ready now (idle or running a batch); 0 while Ray is unreachable."""
        ray, watch = self._ray, self._watch
        if ray is None or (watch is not None and watch.lost is not None):
            return 0
        return self.roster.alive if ray.is_initialized() else 0

    def _carry(self, slot: _ActorSlot, payload: Any) -> Any:
        ray = self._ray
        exceptions = ray.exceptions
        timeout = None if self.batch_timeout_ms is None else self.batch_timeout_ms / 1000
        ref = slot.handle.run.remote(payload)
        try:
            result = ray.get(ref, timeout=timeout)
        except exceptions.GetTimeoutError:
            self._lost(slot, "killed: its batch ran past batch_timeout_ms", kill=True)
            raise self._ran_past(slot) from None
        except exceptions.RayTaskError as exc:  # the model raised: give back its own error
            with self.roster.cond:
                self.roster.give_back(slot, healthy=True)
            cause = exc.cause if isinstance(exc.cause, Exception) else exc
            raise cause from None
        except (exceptions.RayActorError, exceptions.ObjectLostError) as exc:
            reason = _reason(exc)
            self._lost(slot, reason)
            raise _ReplicaLost(-signal.SIGKILL, reason) from None
        with self.roster.cond:
            self.roster.give_back(slot, healthy=True)
        return result

    def _lost(
        self, slot: _ActorSlot, reason: str, *, kill: bool = False, idle_since: int | None = None
    ) -> None:
        """``slot``'s actor died (or is killed now): not ready until it answers the watch's
        ping again (Ray restarts it). With ``idle_since`` (the slot's ``taken`` when the
        watch sent the ping that failed), only if no batch has taken it since: that batch
        tells."""
        with self.roster.cond:
            if idle_since is not None and (slot.state != IDLE or slot.taken != idle_since):
                return
            slot.state = DOWN
            slot.last_exit = reason
            self.roster.died += not kill
        log.error("model worker %s (Ray actor, pid %s) died: %s", slot.name, slot.pid, reason)
        if kill:
            self._ray.kill(slot.handle, no_restart=False)

    def _stop(self, deadline: float) -> None:
        """Stop the watch, then kill the actors; the Ray connection stays as it was."""
        if self._watch is not None:  # its Ray calls never block: it ends within a round
            self._watch.stop(max(deadline - time.monotonic(), 1.0))
        with self.roster.cond:
            slots = list(self.roster.slots)
            for slot in slots:
                slot.state = STOPPED
        for slot in slots:
            self._ray.kill(slot.handle, no_restart=True)


class _Watch:
    """The health watch of a :class:`RayReplicas`: one thread, until :meth:`stop`; each
    round collects the answers to the pings in flight, then pings every idle or restarting
    actor that has none.

    Only idle actors are pinged, never busy ones: an actor runs one method at a time, so
    a ping to a busy actor would wait behind its batch, and a long batch would look like
    a death. (A concurrency group for the ping would answer beside the batch, but makes
    every actor threaded, running the model off its main thread, and a model holding the
    GIL would starve the ping just the same.) A running batch is its own health check
    (``RayActorError``, ``batch_timeout_ms``), and a ping overtaken by a batch (``taken``
    moved on) is judged by nobody. Every Ray call here returns at once (``ray.wait``
    with ``timeout=0``, ``ray.get`` of ready refs, sending a ping), so a call pays no
    round trip for the watch, and close() never waits for it more than a round."""

    def __init__(self, replicas: RayReplicas) -> None:
        self.replicas = replicas
        self.lost: str | None = None  # why the watch gets no answers (None: it does)
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"carpool-ray-watch {replicas.name}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float) -> None:
        self._stopping.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stopping.wait(_WATCH_S):
            try:
                self._once()
            except Exception as exc:  # not an actor's answer: the connection itself
                self._connection(_reason(exc))
            else:
                self._connection(None)

    def _once(self) -> None:
        replicas = self.replicas
        ray, roster = replicas._ray, replicas.roster
        if not ray.is_initialized():
            raise ConnectionError("ray.shutdown() was called in this process")
        pinged = [(a, p) for a in roster.slots if (p := a.ping) is not None]
        refs = [ping.ref for _, ping in pinged]
        ready = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0]) if refs else set()
        now = time.monotonic()
        for slot, ping in pinged:
            with roster.cond:
                overtaken = slot.taken != ping.taken
            if overtaken:  # it waits behind a batch, which tells whether the actor lives
                slot.ping = None
            elif ping.ref in ready:
                slot.ping = None
                self._answered(slot, ping)
            elif now - ping.sent > _PING_TIMEOUT_S:  # lost if idle; if restarting, keep waiting
                silent = f"no answer to a ping for {_PING_TIMEOUT_S:g} s (its node lost?)"
                replicas._lost(slot, silent, idle_since=ping.taken)
        with roster.cond:
            due = [(a, a.taken) for a in roster.slots if a.ping is None and a.state in (IDLE, DOWN)]
        for slot, taken in due:
            slot.ping = _Ping(slot.handle.ping.remote(), time.monotonic(), taken)

    def _answered(self, slot: _ActorSlot, ping: _Ping) -> None:
        """Act on the answer to ``ping``: an error marks an idle actor lost; a pid and
        token make a restarting one ready (a restart if the token is new)."""
        replicas = self.replicas
        ray, roster = replicas._ray, replicas.roster
        try:
            # Ready, so at once; a zero timeout could read as this actor's death.
            pid, incarnation, failure = ray.get(ping.ref, timeout=_PING_TIMEOUT_S)
        except ray.exceptions.RayError as exc:  # dead, or still restarting: ask again
            replicas._lost(slot, _reason(exc), idle_since=ping.taken)
            return
        with roster.cond:
            if slot.taken != ping.taken or slot.state not in (IDLE, DOWN):
                return  # a batch took it since, or it was stopped
            restarted = incarnation != slot.incarnation
            if not restarted and slot.state == IDLE:
                return  # the usual answer
            if restarted and slot.state == IDLE:  # it died and came back between two pings
                roster.died += 1
                slot.last_exit = "restarted by Ray between two pings"
            slot.pid, slot.incarnation = pid, incarnation
            slot.restarts += restarted
            if failure is None:
                roster.ready(slot)
            else:  # callers get WorkerStartError once no replica is left to load it
                slot.state = STOPPED
                slot.last_exit = slot.load_error = failure
                roster.cond.notify_all()
        if failure is not None:
            log.error("model worker %s could not load its model again: %s", slot.name, failure)
            ray.kill(slot.handle, no_restart=True)
        elif restarted:
            log.info("model worker %s is back (Ray actor, pid %s)", slot.name, pid)
        else:
            log.info("model worker %s answers again (Ray actor, pid %s)", slot.name, pid)

    def _connection(self, lost: str | None) -> None:
        """Record whether the watch reaches Ray (``lost``: why not), logging changes."""
        was, self.lost = self.lost, lost
        name = self.replicas.name
        if lost is not None and was is None:
            log.error("model %s lost its Ray connection, not ready: %s", name, lost)
        elif lost is None and was is not None:
            log.info("model %s reaches Ray again", name)


def _connect(address: str | None, name: str) -> Any:
    """The ``ray`` module, connected: to ``address``, to this process's connection, or to
    the running cluster ``ray.init("auto")`` finds. :class:`WorkerStartError` if none."""
    # Ray's C++ failure handler takes SIGTERM before Python's (the drain's) and at times
    # aborts the process (-6) instead of handing it on: the driver leaves signals to us.
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
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
