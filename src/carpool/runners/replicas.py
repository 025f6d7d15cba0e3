"""The replica core: what every runner of replicas outside the batcher's threads shares. Process
and Ray runners differ only in how a replica starts and how a batch travels to it; slot
states, taking a free replica, retry-once, timeouts, close and statistics live here once, and
:func:`load_replica` on the replica's side. Never imports ``carpool.model``."""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, Self, TypeVar, runtime_checkable

from carpool.errors import BatchTimeout, WorkerDied, WorkerPoolClosed, WorkerStartError
from carpool.runners.threads import is_async_callable

__all__ = [
    "BUSY",
    "DOWN",
    "DYING",
    "IDLE",
    "STARTING",
    "STOPPED",
    "LoadedReplica",
    "ModelLike",
    "OnOwnLoop",
    "ReplicaSet",
    "ReplicaState",
    "ReplicaStats",
    "Roster",
    "Slot",
    "load_replica",
    "replica_fn",
]

log = logging.getLogger("carpool.workers")

# Slot states. STARTING: its replica loads the model; IDLE and BUSY: ready (BUSY: running a
# batch for a caller who holds the slot); DYING: its batch's caller gave up on the replica
# (killed it), not yet seen gone; DOWN: no live replica, the runner brings one back (a
# process spawned at its restart time, an actor Ray restarts); STOPPED: closed, or its
# replica could not load the model again.
STARTING, IDLE, BUSY, DYING, DOWN, STOPPED = (
    "starting",
    "idle",
    "busy",
    "dying",
    "down",
    "stopped",
)
_SHOWN = {DYING: "restarting", DOWN: "restarting"}  # how stats name the in-between states


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """One replica position: its replica's pid now (None while it restarts), its state
    (``starting``, ``idle``, ``busy``, ``restarting``, ``stopped``), how often it was
    restarted, and how its last replica ended (``"signal 9"``, ``"exit code 1"``, with
    ``", killed: ..."`` when carpool killed it; for a Ray actor, Ray's reason)."""

    name: str
    pid: int | None
    state: str
    restarts: int
    last_exit: str | None


@dataclass(frozen=True, slots=True)
class ReplicaStats:
    """A snapshot of a runner's replicas: ``alive`` ready now, ``restarts``, batches
    ``retried`` after their replica died, batches ``timed_out`` (batch_timeout_ms), and
    replicas that ``died`` unasked (killed, crashed, exited, lost with their node)."""

    name: str
    workers: int
    alive: int
    restarts: int
    retried: int
    timed_out: int
    died: int
    replicas: tuple[ReplicaState, ...]


@dataclass(eq=False, kw_only=True)
class Slot:
    """A replica position (``name#i``) and its history; a runner subclasses it with how it
    reaches its replica. Guarded by :attr:`Roster.cond`."""

    name: str
    state: str = STARTING
    pid: int | None = None  # the live replica's process
    restarts: int = 0
    last_exit: str | None = None
    load_error: str | None = None  # why its last replica failed to load; None once ready
    freed: int = 0  # when it last became idle: callers take the most recent (warm caches)
    taken: int = 0  # batches handed to it

    def take(self) -> None:
        """Hand it to a caller for one batch."""
        self.state = BUSY
        self.taken += 1

    def snapshot(self) -> ReplicaState:
        shown = _SHOWN.get(self.state, self.state)
        return ReplicaState(self.name, self.pid, shown, self.restarts, self.last_exit)


S = TypeVar("S", bound=Slot)


class Roster(Generic[S]):
    """A runner's slots and the state its callers and its watcher (a supervisor thread, a
    health watch) share; every field is guarded by ``cond``, which all of them wait on."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.slots: list[S] = []
        self.closing = False  # no new batches: closed, or the runner's watcher failed
        self.broken: str | None = None  # why the watcher failed
        self.retried = 0
        self.timed_out = 0
        self.died = 0  # replicas that ended without being asked to
        self._freed = itertools.count(1)

    @property
    def alive(self) -> int:
        return sum(s.state in (IDLE, BUSY) for s in self.slots)

    def take_idle(self) -> S | None:
        """The most recently freed idle slot, taken, or None."""
        slot = None
        for candidate in self.slots:
            if candidate.state == IDLE and (slot is None or candidate.freed > slot.freed):
                slot = candidate
        if slot is not None:
            slot.take()
        return slot

    def ready(self, slot: S) -> None:
        """``slot``'s replica loaded its model: idle, and the next to be taken."""
        slot.state = IDLE
        slot.load_error = None
        slot.freed = next(self._freed)
        self.cond.notify_all()

    def give_back(self, slot: S, *, healthy: bool) -> None:
        """A taken slot comes back: idle when its replica finished the batch, DYING when
        the caller killed it or saw it die (unless its runner moved it on meanwhile)."""
        if slot.state == BUSY:
            if healthy:
                self.ready(slot)
            else:
                slot.state = DYING
        self.cond.notify_all()  # callers and close() wait for a slot to come back

    def load_failure(self) -> S | None:
        """A slot whose replica failed to load, when every slot's last replica did."""
        if self.slots and all(s.load_error is not None for s in self.slots):
            return self.slots[0]
        return None


class _ReplicaLost(Exception):
    """Raised by a runner's :meth:`ReplicaSet._carry` when the replica died running the
    batch: ``exitcode`` (negative: its signal) and, when no exit code says it, ``cause``.
    Private to the runners: :meth:`ReplicaSet.call` retries the batch or raises
    :class:`WorkerDied`, so callers never meet it."""

    def __init__(self, exitcode: int, cause: str | None = None) -> None:
        super().__init__(exitcode, cause)
        self.exitcode = exitcode
        self.cause = cause


class ReplicaSet(Generic[S]):
    """``workers`` replicas of one model that a batcher's threads call into (the
    :class:`carpool.runners.Replicas` protocol). A runner subclasses it with how its
    replicas start (:meth:`start`, :meth:`_stop`) and how a batch travels (:meth:`_carry`,
    :meth:`_prepare`); taking a replica, retrying, closing and counting happen here."""

    def __init__(
        self, *, name: str, workers: int, batch_timeout_ms: float | None, retry: bool
    ) -> None:
        self.name = name
        self.workers = workers
        self.batch_timeout_ms = batch_timeout_ms
        self.retry = retry
        self.roster: Roster[S] = Roster()
        self._started = False
        self._closed = False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} workers={self.workers} alive={self.alive}>"

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> Self:
        """Launch the replicas and wait until each has loaded its model or failed; raise
        :class:`WorkerStartError` (and leave no replica) when none could."""
        raise NotImplementedError

    @property
    def alive(self) -> int:
        """How many replicas are ready now (idle or running a batch)."""
        with self.roster.cond:
            return self._alive()

    def stats(self) -> ReplicaStats:
        """A consistent snapshot of the counters and of every replica position."""
        roster = self.roster
        with roster.cond:
            return ReplicaStats(
                name=self.name,
                workers=self.workers,
                alive=self._alive(),
                restarts=sum(s.restarts for s in roster.slots),
                retried=roster.retried,
                timed_out=roster.timed_out,
                died=roster.died,
                replicas=tuple(s.snapshot() for s in roster.slots),
            )

    def call(self, batch: Any, *, retry: bool | None = None) -> Any:
        """Run ``batch`` on a free replica and return its outputs. Raises what the model
        raised, or :class:`WorkerDied` (its replica died, and again on the retry),
        :class:`BatchTimeout`, :class:`WorkerStartError` (no replica can load the model),
        :class:`WorkerPoolClosed`. ``retry`` overrides :attr:`retry` for this batch (a
        batcher bisecting a batch that killed its replica need not run each half twice)."""
        if not self._started:
            raise WorkerPoolClosed(self.name, "is not started")
        payload = self._prepare(batch)
        retry = self.retry if retry is None else retry
        retried = False
        while True:
            slot = self._acquire()
            try:
                return self._carry(slot, payload)
            except _ReplicaLost as lost:
                if self.roster.closing:
                    raise WorkerPoolClosed(self.name, "was closed while the batch ran") from None
                if retried or not retry:
                    raise WorkerDied(
                        worker=slot.name, exitcode=lost.exitcode, retried=retried, cause=lost.cause
                    ) from None
                retried = True
                with self.roster.cond:
                    self.roster.retried += 1
                log.warning("retrying the batch that model worker %s died on", slot.name)

    def close(self, timeout: float = 10.0) -> None:
        """Take no new batches, let running ones finish (up to ``timeout`` seconds), then
        stop the replicas: none remains. Idempotent."""
        deadline = time.monotonic() + timeout
        roster = self.roster
        with roster.cond:
            if not self._started or self._closed:
                return
            self._closed = True
            roster.closing = True
            roster.cond.notify_all()
            roster.cond.wait_for(lambda: all(s.state != BUSY for s in roster.slots), timeout)
        self._stop(deadline)

    # ---- for the runners ---------------------------------------------------------------

    def _launch(self, make: Callable[[str], S]) -> list[S]:
        """The slots, one per replica, made by ``make(name)``; once only."""
        if self._started:
            raise RuntimeError(f"the replicas of {self.name!r} were already started")
        self._started = True
        slots = [make(f"{self.name}#{i}") for i in range(self.workers)]
        self.roster.slots = slots
        return slots

    def _failed_to_start(self, worker: str, reason: str) -> WorkerStartError:
        """Close what started, and the error to raise from :meth:`start`."""
        self.close()
        return WorkerStartError(worker=worker, reason=reason)

    def _acquire(self) -> S:
        """A free slot, taken, waiting for one no longer than batch_timeout_ms."""
        roster = self.roster
        limit = self.batch_timeout_ms
        deadline = None if limit is None else time.monotonic() + limit / 1000
        with roster.cond:
            while True:
                if roster.closing:
                    reason = "is closed" if roster.broken is None else f"failed ({roster.broken})"
                    raise WorkerPoolClosed(self.name, reason)
                slot = roster.take_idle()
                if slot is not None:
                    return slot
                failed = roster.load_failure()
                if failed is not None:
                    raise WorkerStartError(worker=failed.name, reason=str(failed.load_error))
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    roster.timed_out += 1
                    raise BatchTimeout(
                        timeout_ms=float(limit or 0), worker=self.name, stage="waiting"
                    )
                roster.cond.wait(remaining)

    def _ran_past(self, slot: S) -> BatchTimeout:
        """Count a batch that ran past batch_timeout_ms on ``slot``; the error to raise."""
        with self.roster.cond:
            self.roster.timed_out += 1
        return BatchTimeout(timeout_ms=float(self.batch_timeout_ms or 0), worker=slot.name)

    def _alive(self) -> int:
        """Replicas ready now; hold ``roster.cond``."""
        return self.roster.alive

    def _prepare(self, batch: Any) -> Any:
        """What :meth:`_carry` sends, computed once per call, before any replica is taken."""
        return batch

    def _carry(self, slot: S, payload: Any) -> Any:
        """Run the batch on ``slot``'s replica and give the slot back; raise the model's
        error, :class:`BatchTimeout` (see :meth:`_ran_past`), or :class:`_ReplicaLost`."""
        raise NotImplementedError

    def _stop(self, deadline: float) -> None:
        """Stop every replica, killing what is left at ``deadline`` (``time.monotonic``)."""
        raise NotImplementedError


# ---- the replica's side ------------------------------------------------------------------


@runtime_checkable
class ModelLike(Protocol):
    """A :class:`carpool.Model`, as a factory may return one: not callable itself, its
    batch function is ``fn``. Recognised by shape, so that this core never imports the
    module that builds batchers."""

    fn: Callable[[Any], Any]

    def batched_fn(self) -> Callable[[Any], Any]: ...


@dataclass(frozen=True, slots=True)
class LoadedReplica:
    """What a replica loaded: its batch function, or why it has none (``failure``: the
    error in one line, ``trace``: its traceback)."""

    fn: Callable[[Any], Any] | None
    failure: str | None = None
    trace: str | None = None


def load_replica(
    spec: Any, warmup: Any, *, decode: Callable[[Any], Any] | None = None
) -> LoadedReplica:
    """Turn ``spec`` into the batch function (:func:`replica_fn`) and run ``warmup`` (a
    stacked batch, or None) through it once. Any failure, of ``decode`` (applied first to
    both, e.g. ``pickle.loads``) too, is captured with its reason, never raised: a child
    process reports it and exits, a Ray actor answers it to every ping."""
    try:
        if decode is not None:
            spec = decode(spec)
            warmup = None if warmup is None else decode(warmup)
        fn = replica_fn(spec)
        if warmup is not None:
            fn(warmup)
    except BaseException as exc:  # any load failure is the replica's answer, not a crash
        reason = "".join(traceback.format_exception_only(exc)).strip()
        return LoadedReplica(None, reason, traceback.format_exc())
    return LoadedReplica(fn)


def replica_fn(spec: Any) -> Callable[[Any], Any]:
    """The batch function a replica spec stands for. A callable that takes no arguments (a
    class whose arguments all have defaults, ``functools.partial(load_target, "demo")``)
    is a factory: it is called once and gives the function or a :class:`carpool.Model`,
    whose ``fn`` is used. Any other callable (``predict(batch)``, a model object) is the
    function. An ``async def`` function is run to completion on an event loop of this
    process. Raises TypeError when the spec gives no callable."""
    obj = spec() if _is_factory(spec) else spec
    if not callable(obj) and isinstance(obj, ModelLike):
        obj = obj.fn
    if not callable(obj):
        raise TypeError(f"the model spec gave {type(obj).__name__}, not a callable")
    if is_async_callable(obj):
        return OnOwnLoop(obj)
    fn: Callable[[Any], Any] = obj
    return fn


class OnOwnLoop:
    """An ``async def`` model, run batch by batch on an event loop of this process."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn
        self.loop = asyncio.new_event_loop()

    def __call__(self, batch: Any) -> Any:
        return self.loop.run_until_complete(self.fn(batch))

    def close(self) -> None:
        self.loop.close()


def _is_factory(spec: Any) -> bool:
    try:
        inspect.signature(spec).bind()
    except TypeError:  # needs an argument (the batch), or not a callable
        return False
    except ValueError:  # no signature (some builtins): a batch function
        return False
    return True
