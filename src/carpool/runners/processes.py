"""Run a model in child processes: ``ProcessReplicas.call(batch)`` is a thread-safe, blocking
stand-in for the model function, so a batcher's worker threads can use it unchanged.

Each child loads the model once (see :mod:`carpool.runners.replica_process`); a call takes a free
child, writes the batch into that child's shared-memory arena, sends a small header,
waits (the GIL released) and copies the outputs back. At most ``workers`` calls run at
once; more wait for a free child. Faults have one outcome each:

- a child dies mid-batch: the batch is retried once on another child (``retry=True``),
  then :class:`WorkerDied`; the child is restarted with backoff either way;
- a batch runs past ``batch_timeout_ms``: :class:`BatchTimeout`, its child is killed and
  replaced, the batch is not retried;
- no child can load the model: :class:`WorkerStartError` with the reason it gave;
- the pool is closed: :class:`WorkerPoolClosed`.

Imports the transport, the worker errors, the supervisor and the worker main; nothing of
the batcher.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import pickle
import time
import weakref
from dataclasses import dataclass
from typing import Any

from carpool.errors import BatchTimeout, WorkerDied, WorkerPoolClosed, WorkerStartError
from carpool.runners.replica_process import run_worker
from carpool.runners.supervisor import BUSY, IDLE, STARTING, STOPPED, Child, Slot, Supervisor
from carpool.transport import Channel, Plan, decode, dumps, plan

__all__ = ["PoolStats", "ProcessReplicas", "WorkerState"]

log = logging.getLogger("carpool.workers")

# The parent has threads and, in the server, an event loop: fork would copy held locks.
_CONTEXT = multiprocessing.get_context("spawn")


@dataclass(frozen=True, slots=True)
class WorkerState:
    """One worker position: its process now (``pid`` None while it restarts), its state
    (``starting``, ``idle``, ``busy``, ``restarting``, ``stopped``), how often it was
    restarted, and how its last process ended (``"signal 9"``, ``"exit code 1"``, with
    ``", killed: ..."`` when carpool killed it)."""

    name: str
    pid: int | None
    state: str
    restarts: int
    last_exit: str | None


@dataclass(frozen=True, slots=True)
class PoolStats:
    """A snapshot of a pool: ``alive`` workers ready now, worker ``restarts``, batches
    ``retried`` after their worker died, batches ``timed_out`` (batch_timeout_ms), and
    worker processes that ``died`` unasked (killed, crashed, exited)."""

    name: str
    workers: int
    alive: int
    restarts: int
    retried: int
    timed_out: int
    died: int
    processes: tuple[WorkerState, ...]


class _Died(Exception):
    def __init__(self, exitcode: int) -> None:
        self.exitcode = exitcode


class ProcessReplicas:
    """``workers`` child processes running the model ``spec`` (see the module docstring).

    ``spec``: a picklable model function (module-level, pickled by reference), or a
    zero-argument factory returning the function or a :class:`carpool.Model`, e.g.
    ``functools.partial(carpool.loading.load_target, "demo")``. ``warmup``: a batch each
    child runs once before it counts as ready. ``restart_backoff``: the delay before the
    first restart of a dead child and its cap; it doubles per death without a finished
    batch in between. ``start_timeout_s``: a child not ready by then is killed.
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
        restart_backoff: tuple[float, float] = (0.1, 5.0),  # seconds: a crash loop idles
        start_timeout_s: float = 600.0,  # a large model from a slow disk loads in minutes
    ) -> None:
        _check(workers, batch_timeout_ms, restart_backoff, start_timeout_s)
        self.name = name
        self.workers = workers
        self.batch_timeout_ms = batch_timeout_ms
        self.retry = retry
        self.restart_backoff = restart_backoff
        self.start_timeout_s = start_timeout_s
        self._spec = _pickled_spec(spec)
        self._warmup = None if warmup is None else pickle.dumps(warmup)
        self._sup: Supervisor | None = None
        self._retried = 0
        self._timed_out = 0
        self._closed = False

    def __repr__(self) -> str:
        return f"<ProcessReplicas {self.name!r} workers={self.workers} alive={self.alive}>"

    def __enter__(self) -> ProcessReplicas:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> ProcessReplicas:
        """Spawn the children and wait until each has loaded its model or failed. Raises
        :class:`WorkerStartError` (and leaves no process) when none could load."""
        if self._sup is not None:
            raise RuntimeError(f"process pool {self.name!r} was already started")
        sup = self._sup = Supervisor(
            name=self.name, workers=self.workers, spawn=self._spawn, backoff=self.restart_backoff
        )
        _live.add(self)
        sup.start()
        with sup.cond:
            sup.cond.wait_for(lambda: all(s.started for s in sup.slots) or sup.closing)
            failed = None if sup.alive else next((s for s in sup.slots if s.load_error), None)
        if failed is not None or sup.closing:
            reason = failed.load_error if failed is not None else sup.broken
            self.close()
            raise WorkerStartError(worker=failed.name if failed else self.name, reason=str(reason))
        return self

    @property
    def alive(self) -> int:
        """How many children are ready now (idle or running a batch)."""
        sup = self._sup
        if sup is None:
            return 0
        with sup.cond:
            return sup.alive

    def call(self, batch: Any, *, retry: bool | None = None) -> Any:
        """Run ``batch`` in a free child and return its outputs (private copies). Raises
        what the model raised, or :class:`WorkerDied`, :class:`BatchTimeout`,
        :class:`WorkerStartError`, :class:`WorkerPoolClosed` (see the module docstring).
        ``retry`` overrides the pool's setting for this batch (a batcher bisecting a batch
        that killed its worker need not run each half twice)."""
        sup = self._sup
        if sup is None:
            raise WorkerPoolClosed(self.name, "is not started")
        laid = plan(batch)
        retry = self.retry if retry is None else retry
        retried = False
        while True:
            slot, child = self._acquire(sup)
            try:
                return self._run(sup, slot, child, laid)
            except _Died as died:
                if sup.closing:
                    raise WorkerPoolClosed(self.name, "was closed while the batch ran") from None
                if retried or not retry:
                    raise WorkerDied(
                        worker=slot.name, exitcode=died.exitcode, retried=retried
                    ) from None
                retried = True
                with sup.cond:
                    self._retried += 1
                log.warning("retrying the batch that model worker %s died on", slot.name)

    def close(self, timeout: float = 10.0) -> None:
        """Take no new batches, let running ones finish (up to ``timeout`` seconds), ask the
        children to exit, and kill what is left: no process remains. Idempotent."""
        sup = self._sup
        if sup is None or self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + timeout
        with sup.cond:
            sup.closing = True
            sup.cond.notify_all()
            sup.cond.wait_for(lambda: all(s.state != BUSY for s in sup.slots), timeout)
        sup.stop(grace_s=max(deadline - time.monotonic(), 0.5))
        _live.discard(self)

    def stats(self) -> PoolStats:
        """A consistent snapshot of the counters and of every worker position."""
        sup = self._sup
        if sup is None:
            return PoolStats(self.name, self.workers, 0, 0, 0, 0, 0, ())
        with sup.cond:
            return PoolStats(
                name=self.name,
                workers=self.workers,
                alive=sup.alive,
                restarts=sum(s.restarts for s in sup.slots),
                retried=self._retried,
                timed_out=self._timed_out,
                died=sup.died,
                processes=tuple(_state(s) for s in sup.slots),
            )

    # ---- one call ----------------------------------------------------------------------

    def _acquire(self, sup: Supervisor) -> tuple[Slot, Child]:
        """A free child, waiting for one (bounded by batch_timeout_ms when set)."""
        timeout = None if self.batch_timeout_ms is None else self.batch_timeout_ms / 1000
        deadline = None if timeout is None else time.monotonic() + timeout
        with sup.cond:
            while True:
                if sup.closing:
                    reason = "is closed" if sup.broken is None else f"failed ({sup.broken})"
                    raise WorkerPoolClosed(self.name, reason)
                slot = sup.take_idle()
                if slot is not None:
                    assert slot.child is not None
                    return slot, slot.child
                failed = sup.load_failure()
                if failed is not None:
                    raise WorkerStartError(worker=failed.name, reason=str(failed.load_error))
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    self._timed_out += 1
                    raise BatchTimeout(
                        timeout_ms=float(self.batch_timeout_ms or 0),
                        worker=self.name,
                        stage="waiting",
                    )
                sup.cond.wait(remaining)

    def _run(self, sup: Supervisor, slot: Slot, child: Child, laid: Plan) -> Any:
        """Send the batch to ``child``, wait for its answer, give the slot back. A child
        that did not answer (died, timed out, or the wait was interrupted) is killed."""
        healthy = True
        try:
            slot.inputs.fit(laid.nbytes)
            laid.write(slot.inputs.buf)
            run = dumps(("run", (slot.inputs.name, laid.tree), slot.outputs.name))
            healthy = False  # from here on, only an answer shows the worker is fine
            reply = self._exchange(slot, child, run)
            if reply is None:
                raise self._timed_out_on(sup, child, slot.name)
            healthy = True  # it answered, whatever the answer
            if reply[0] == "ok":
                return decode(reply[1][1], slot.outputs.buf, copy=True)
            error = pickle.loads(reply[1])
            error.add_note(f"raised in model worker {slot.name} (pid {child.pid}):\n{reply[2]}")
            raise error
        finally:
            with sup.cond:
                if not healthy:
                    child.kill("its caller stopped waiting for it")
                sup.give_back(slot, child, healthy=healthy)

    def _exchange(self, slot: Slot, child: Child, run: bytes) -> Any:
        """The child's ``ok`` or ``error`` reply (growing its output arena on request), or
        None when batch_timeout_ms passed first. Raises _Died when its pipe breaks."""
        timeout = self.batch_timeout_ms
        deadline = None if timeout is None else time.monotonic() + timeout / 1000
        message = run
        while True:
            reply = self._talk(child, message, deadline)
            if reply is None or reply[0] != "grow":
                return reply
            slot.outputs.fit(reply[1])
            message = dumps(("out", slot.outputs.name))

    def _talk(self, child: Child, message: bytes, deadline: float | None) -> Any:
        """Send ``message`` and read the answer (None past ``deadline``); _Died when the
        child's pipe breaks, with its exit code once the supervisor has reaped it."""
        conn = child.conn
        try:
            conn.send_bytes(message)
            if deadline is not None and not conn.poll(max(0.0, deadline - time.monotonic())):
                return None
            return conn.receive()
        except (EOFError, OSError):
            sup = self._sup
            assert sup is not None
            with sup.cond:
                code = sup.await_exit(child)
            raise _Died(code) from None

    def _timed_out_on(self, sup: Supervisor, child: Child, worker: str) -> BatchTimeout:
        timeout_ms = float(self.batch_timeout_ms or 0)
        with sup.cond:
            self._timed_out += 1
            child.kill(f"its batch ran past batch_timeout_ms={timeout_ms:g}")
        log.error(
            "model worker %s (pid %d) ran past batch_timeout_ms=%g: killed, to be replaced",
            worker,
            child.pid,
            timeout_ms,
        )
        return BatchTimeout(timeout_ms=timeout_ms, worker=worker)

    def _spawn(self, slot: Slot) -> Child:
        """Start a child for ``slot`` (called on the supervisor thread only)."""
        conn, theirs = Channel.pair(_CONTEXT)
        title = f"carpool-worker {slot.name}"
        process = _CONTEXT.Process(
            target=run_worker,
            args=(theirs, self._spec, self._warmup, title, os.getpid()),
            name=title,
            daemon=True,  # multiprocessing terminates it at exit if close() was never called
        )
        process.start()
        for end in theirs:
            end.close()
        assert process.pid is not None
        deadline = time.monotonic() + self.start_timeout_s
        return Child(process=process, conn=conn, pid=process.pid, start_deadline=deadline)


def _state(slot: Slot) -> WorkerState:
    child = slot.child
    alive = child is not None and child.exitcode is None
    state = slot.state if slot.state in (STARTING, IDLE, BUSY, STOPPED) else "restarting"
    return WorkerState(
        name=slot.name,
        pid=child.pid if alive and child is not None else None,
        state=state,
        restarts=slot.restarts,
        last_exit=slot.last_exit,
    )


def _check(
    workers: int,
    batch_timeout_ms: float | None,
    backoff: tuple[float, float],
    start_timeout_s: float,
) -> None:
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    if batch_timeout_ms is not None and (
        isinstance(batch_timeout_ms, bool)
        or not isinstance(batch_timeout_ms, int | float)
        or not batch_timeout_ms > 0
    ):
        raise ValueError(f"batch_timeout_ms must be a number > 0 or None, got {batch_timeout_ms!r}")
    first, cap = backoff
    if not 0 < first <= cap:
        raise ValueError(
            f"restart_backoff must be (first, cap) with 0 < first <= cap, got {backoff!r}"
        )
    if not start_timeout_s > 0:
        raise ValueError(f"start_timeout_s must be > 0, got {start_timeout_s!r}")


def _pickled_spec(spec: Any) -> bytes:
    if not callable(spec):
        raise TypeError(f"the model spec must be callable, got {type(spec).__name__}")
    try:
        return pickle.dumps(spec)
    except Exception as exc:
        raise TypeError(
            f"process workers need a picklable model spec (a module-level function or "
            f"class, or functools.partial of one); {spec!r} is not: {exc}"
        ) from None


# Pools not closed by their owner are closed at exit, before multiprocessing's own exit
# hook (registered earlier, so run later) would terminate their children without a word.
_live: weakref.WeakSet[ProcessReplicas] = weakref.WeakSet()


@atexit.register
def _close_live_pools() -> None:
    for pool in list(_live):
        pool.close(timeout=1.0)
