"""Run a model in child processes: ``runner="process"``, one replica per child. This module
starts the children (through the :class:`~carpool.runners.supervisor.Supervisor`) and carries
a batch to one through shared-memory arenas that grow and shrink to fit; the replica core
(:mod:`carpool.runners.replicas`) does the rest. Faults and their outcomes:
docs/architecture.md."""

from __future__ import annotations

import atexit
import functools
import logging
import multiprocessing
import os
import pickle
import time
from collections.abc import Callable
from typing import Any

from carpool.errors import BatchTimeout
from carpool.ipc.transport import (
    SHRINK_AFTER_S,
    Arena,
    Channel,
    Layout,
    ShrinkPolicy,
    decode,
    dumps,
    extent,
    lay_out,
)
from carpool.runners.replica_process import replica_main
from carpool.runners.replicas import ReplicaSet, _ReplicaLost
from carpool.runners.supervisor import Child, ProcessSlot, Supervisor

__all__ = ["ProcessReplicas"]

log = logging.getLogger("carpool.workers")

# The parent has threads and, in the server, an event loop: fork would copy held locks.
_CONTEXT = multiprocessing.get_context("spawn")


class ProcessReplicas(ReplicaSet[ProcessSlot]):
    """``workers`` child processes running the model ``spec`` (see the module docstring).

    ``spec``: a picklable model function (module-level, pickled by reference), or a
    zero-argument factory returning the function or a :class:`carpool.Model`, e.g.
    ``functools.partial(carpool.loading.load_target, "demo")``. ``warmup``: a batch each
    child runs once before it counts as ready. ``restart_backoff``: the delay before the
    first restart of a dead child and its cap; it doubles per death without a finished
    batch in between. ``start_timeout_s``: a child not ready by then is killed. Values
    come checked from :func:`carpool.runners.make_replicas` (the Batcher checks them).
    ``shrink_after_s``: an arena whose large size no batch needed for that long shrinks
    back; ``clock`` is the monotonic clock it is measured on (tests pass their own).
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
        shrink_after_s: float = SHRINK_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(name=name, workers=workers, batch_timeout_ms=batch_timeout_ms, retry=retry)
        self.restart_backoff = restart_backoff
        self.start_timeout_s = start_timeout_s
        self.shrink_after_s = shrink_after_s
        self._clock = clock
        self._spec = _pickled_spec(spec)
        # Held while children may restart from it: what the spec refers to (a repository
        # version's snapshot of its files, say) lives as long as its holders.
        self._spec_source = spec
        self._warmup = None if warmup is None else pickle.dumps(warmup)
        self._sup: Supervisor | None = None
        # Run at exit if the owner never closed it, before multiprocessing's own exit hook
        # (registered when multiprocessing was imported, so run later) would terminate the
        # children without a word and leave their arenas to the resource tracker.
        self._at_exit = functools.partial(self.close, timeout=1.0)

    def start(self) -> ProcessReplicas:
        """Spawn the children and wait until each has loaded its model or failed. Raises
        :class:`WorkerStartError` (and leaves no process) when none could load."""
        after = self.shrink_after_s
        slots = self._launch(
            lambda name: ProcessSlot(
                name=name,
                inputs=Arena(shrink=ShrinkPolicy(after)),
                outputs=Arena(shrink=ShrinkPolicy(after)),
            )
        )
        sup = self._sup = Supervisor(
            self.roster, name=self.name, spawn=self._spawn, backoff=self.restart_backoff
        )
        atexit.register(self._at_exit)
        sup.start()
        roster = self.roster
        with roster.cond:
            roster.cond.wait_for(lambda: all(s.started for s in slots) or roster.closing)
            failed = None if roster.alive else next((s for s in slots if s.load_error), None)
        if failed is not None or roster.closing:
            reason = failed.load_error if failed is not None else roster.broken
            raise self._failed_to_start(failed.name if failed else self.name, str(reason))
        return self

    # ---- one call ----------------------------------------------------------------------

    def _prepare(self, batch: Any) -> Layout:
        return lay_out(batch)

    def _carry(self, slot: ProcessSlot, payload: Any) -> Any:
        """Send the batch to ``slot``'s child, wait for its answer, give the slot back. A
        child that did not answer (died, timed out, or the wait was interrupted) is
        killed. Each arena grows or shrinks (a new name the header carries) as it fits."""
        sup, child, laid = self._sup, slot.child, payload
        assert sup is not None  # started
        assert child is not None  # a taken slot has its process
        healthy = True
        now = self._clock()
        try:
            slot.inputs.fit(laid.nbytes, now)
            laid.write(slot.inputs.buf)
            run = dumps(("run", (slot.inputs.name, laid.tree), slot.outputs.name))
            healthy = False  # from here on, only an answer shows the replica is fine
            reply = self._exchange(slot, child, run, now)
            if reply is None:
                raise self._timed_out_on(slot, child)
            healthy = True  # it answered, whatever the answer
            if reply[0] == "ok":
                outputs = decode(reply[1][1], slot.outputs.buf, copy=True)
                slot.outputs.fit(extent(reply[1][1]), now)  # the next run names a smaller one
                return outputs
            error = pickle.loads(reply[1])
            error.add_note(f"raised in model worker {slot.name} (pid {child.pid}):\n{reply[2]}")
            raise error
        finally:
            with sup.cond:
                if not healthy:
                    child.kill("its caller stopped waiting for it")
                sup.give_back(slot, child, healthy=healthy)

    def _exchange(self, slot: ProcessSlot, child: Child, run: bytes, now: float) -> Any:
        """The child's ``ok`` or ``error`` reply (growing its output arena on request), or
        None when batch_timeout_ms passed first. Raises _ReplicaLost when its pipe breaks."""
        timeout = self.batch_timeout_ms
        deadline = None if timeout is None else time.monotonic() + timeout / 1000
        message = run
        while True:
            reply = self._talk(child, message, deadline)
            if reply is None or reply[0] != "grow":
                return reply
            slot.outputs.fit(reply[1], now)
            message = dumps(("out", slot.outputs.name))

    def _talk(self, child: Child, message: bytes, deadline: float | None) -> Any:
        """Send ``message`` and read the answer (None past ``deadline``); _ReplicaLost when the
        child's pipe breaks, with its exit code once the supervisor has reaped it."""
        conn = child.conn
        try:
            conn.send_bytes(message)
            if deadline is not None and not conn.poll(max(0.0, deadline - time.monotonic())):
                return None
            return conn.receive()
        except (EOFError, OSError):
            sup = self._sup
            assert sup is not None  # started
            with sup.cond:
                code = sup.await_exit(child)
            raise _ReplicaLost(code) from None

    def _timed_out_on(self, slot: ProcessSlot, child: Child) -> BatchTimeout:
        """Kill ``child``, whose batch ran past batch_timeout_ms; the error to raise."""
        timeout_ms = float(self.batch_timeout_ms or 0)
        with self.roster.cond:
            child.kill(f"its batch ran past batch_timeout_ms={timeout_ms:g}")
        log.error(
            "model worker %s (pid %d) ran past batch_timeout_ms=%g: killed, to be replaced",
            slot.name,
            child.pid,
            timeout_ms,
        )
        return self._ran_past(slot)

    def _spawn(self, slot: ProcessSlot) -> Child:
        """Start a child for ``slot`` (called on the supervisor thread only)."""
        conn, theirs = Channel.pair(_CONTEXT)
        title = f"carpool-worker {slot.name}"
        process = _CONTEXT.Process(
            target=replica_main,
            args=(theirs, self._spec, self._warmup, title, os.getpid()),
            name=title,
            daemon=True,  # a last resort at exit: close() (self._at_exit) stops it first
        )
        process.start()
        for end in theirs:
            end.close()
        assert process.pid is not None
        deadline = time.monotonic() + self.start_timeout_s
        return Child(process=process, conn=conn, pid=process.pid, start_deadline=deadline)

    def _stop(self, deadline: float) -> None:
        assert self._sup is not None  # started
        self._sup.stop(grace_s=max(deadline - time.monotonic(), 0.5))
        atexit.unregister(self._at_exit)


def _pickled_spec(spec: Any) -> bytes:
    if not callable(spec):
        raise TypeError(f"the model spec must be callable, got {type(spec).__name__}")
    try:
        return pickle.dumps(spec)
    except Exception as exc:
        raise TypeError(
            f"runner='process' needs a picklable model spec (a module-level function or "
            f"class, or functools.partial of one); {spec!r} is not: {exc}"
        ) from None
