"""The life of a process runner's replicas: spawn, hear them load, reap, restart with backoff,
stop. One thread owns every replica process, so ``PR_SET_PDEATHSIG`` ties each to a thread
that lives as long as the runner; callers take an idle :class:`ProcessSlot`, use it and give
it back (or kill its process on a timeout). Shared state is guarded by ``Roster.cond``."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from typing import Any

from carpool.errors import describe_exit
from carpool.ipc.transport import Arena, Channel
from carpool.runners.replicas import BUSY, DOWN, DYING, IDLE, STARTING, STOPPED, Roster, Slot

__all__ = ["Child", "ProcessSlot", "Supervisor"]

log = logging.getLogger("carpool.workers")


@dataclass(eq=False)
class Child:
    """One replica process: a slot's current generation."""

    process: BaseProcess
    conn: Channel
    pid: int
    start_deadline: float | None
    busy: bool = False  # a caller is talking to it; that caller closes conn once it is reaped
    eof: bool = False  # its pipe is closed: stop listening while it starts
    exitcode: int | None = None  # set once reaped
    why: str | None = None  # why carpool killed it, if it did
    failure: str | None = None  # the load error it reported

    def kill(self, why: str) -> None:
        """SIGKILL it unless it is already reaped; hold ``Roster.cond``."""
        if self.exitcode is None:
            self.why = self.why or why
            with contextlib.suppress(OSError, ValueError):
                self.process.kill()


@dataclass(eq=False, kw_only=True)
class ProcessSlot(Slot):
    """A replica position of a process runner: the process in it now, its two
    shared-memory arenas (inputs, written by the parent; outputs, written by the replica),
    and its restart schedule. DOWN: no process, one is spawned at ``restart_at``; DYING:
    its batch's caller gave up on the process (killed it), not reaped yet."""

    state: str = DOWN
    inputs: Arena = field(default_factory=Arena)
    outputs: Arena = field(default_factory=Arena)
    child: Child | None = None
    restart_at: float = 0.0
    failures: int = 0  # deaths since its last finished batch: the backoff exponent
    spawned: int = 0
    started: bool = False  # its first process loaded or failed (start() waits for this)

    def take(self) -> None:
        super().take()
        assert self.child is not None  # an idle slot has its process
        self.child.busy = True


class Supervisor:
    """The thread that owns a process runner's replicas (see the module docstring)."""

    def __init__(
        self,
        roster: Roster[ProcessSlot],
        *,
        name: str,
        spawn: Callable[[ProcessSlot], Child],
        backoff: tuple[float, float],
    ) -> None:
        self.name = name
        self.roster = roster
        self.cond = roster.cond
        self._spawn = spawn
        self._backoff = backoff
        self._stop_at: float | None = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._thread = threading.Thread(
            target=self._main, name=f"carpool-supervisor {name}", daemon=True
        )

    # ---- what callers use (under self.cond unless noted) -------------------------------

    def start(self) -> None:
        """Start the thread; it spawns every replica at once. Not under ``cond``."""
        self._thread.start()

    def give_back(self, slot: ProcessSlot, child: Child, *, healthy: bool) -> None:
        """Return a slot taken from the roster: idle again when its process finished the
        batch, DYING when the caller killed it or saw it die."""
        child.busy = False
        if child.exitcode is not None:
            child.conn.close()
        if slot.child is not child:  # reaped and replaced meanwhile: not this caller's now
            self.cond.notify_all()
            return
        if healthy and slot.state == BUSY:
            slot.failures = 0
        self.roster.give_back(slot, healthy=healthy)  # wakes callers, close(), await_exit()

    def await_exit(self, child: Child) -> int:
        """The exit code of a process whose pipe broke, once reaped (killing it if it
        lingers). Blocks; hold ``cond``."""
        roster = self.roster
        for _ in range(2):
            if self.cond.wait_for(lambda: child.exitcode is not None or bool(roster.broken), 5.0):
                break
            child.kill("its pipe closed but it kept running")
        return child.exitcode if child.exitcode is not None else -signal.SIGKILL

    def stop(self, grace_s: float) -> None:
        """Ask idle replicas to exit, kill the rest after ``grace_s``, wait until none is
        left, then free the arenas. Not under ``cond``."""
        with self.cond:
            self.roster.closing = True
            self._stop_at = time.monotonic() + grace_s
            self.cond.notify_all()
        self._wake()
        if self._thread.is_alive():
            self._thread.join(grace_s + 10.0)
        if self._thread.is_alive():  # never expected: the thread is stuck
            log.error("the supervisor of %s did not stop; killing its replicas", self.name)
            self._kill_all("the supervisor did not stop")
        slots = self.roster.slots
        with self.cond:  # callers of killed replicas give their slots back at once
            self.cond.wait_for(lambda: not any(s.child and s.child.busy for s in slots), 5.0)
        for slot in slots:
            slot.inputs.close()
            slot.outputs.close()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    # ---- the supervisor thread ---------------------------------------------------------

    def _main(self) -> None:
        try:
            while self._step():
                pass
        except BaseException as exc:  # the runner must learn it cannot go on
            log.exception("the supervisor of model workers %s failed", self.name)
            with self.cond:
                self.roster.broken = f"{type(exc).__name__}: {exc}"
                self.roster.closing = True
                self.cond.notify_all()
            self._kill_all("the supervisor failed")

    def _step(self) -> bool:
        """Spawn what is due, then wait for one event and handle it; False when stopped."""
        self._spawn_due()
        with self.cond:
            if self._stop_at is not None and self._stopping():
                return False
            waits, timeout = self._watch_list()
        for ready in wait(list(waits), timeout):
            slot, child = waits[ready]
            if slot is None:
                with contextlib.suppress(OSError):
                    os.read(self._wake_r, 4096)
            elif child is not None and ready is child.conn.reader:
                self._hear(slot, child)
            elif child is not None:
                self._reap(slot, child)
        self._expire_starts()
        return True

    def _watch_list(
        self,
    ) -> tuple[dict[Any, tuple[ProcessSlot | None, Child | None]], float | None]:
        waits: dict[Any, tuple[ProcessSlot | None, Child | None]] = {self._wake_r: (None, None)}
        times = [] if self._stop_at is None else [self._stop_at]
        for slot in self.roster.slots:
            child = slot.child
            if slot.state == DOWN:
                times.append(slot.restart_at)
            if child is None or child.exitcode is not None:
                continue
            waits[child.process.sentinel] = (slot, child)
            if slot.state == STARTING and not child.eof:
                waits[child.conn.reader] = (slot, child)
                if child.start_deadline is not None:
                    times.append(child.start_deadline)
        timeout = None if not times else max(0.0, min(times) - time.monotonic())
        return waits, timeout

    def _spawn_due(self) -> None:
        now = time.monotonic()
        with self.cond:
            if self._stop_at is not None:
                return
            due = [s for s in self.roster.slots if s.state == DOWN and s.restart_at <= now]
            for slot in due:
                slot.state = STARTING
        for slot in due:
            try:
                child = self._spawn(slot)
            except Exception as exc:  # e.g. out of file descriptors: retry
                log.exception("could not start model worker %s", slot.name)
                with self.cond:
                    slot.load_error = f"{type(exc).__name__}: {exc}"
                    slot.started = True
                    self._schedule(slot)
                continue
            with self.cond:
                slot.child = child
                slot.pid = child.pid
                slot.restarts += slot.spawned > 0
                slot.spawned += 1

    def _hear(self, slot: ProcessSlot, child: Child) -> None:
        """A starting replica's message: ready, or the reason it failed to load."""
        try:
            message = child.conn.receive()
        except (EOFError, OSError):
            child.eof = True  # it exited: its sentinel says how
            return
        with self.cond:
            ready = message[0] == "ready" and child.why is None  # not killed meanwhile
            if ready and slot.child is child and slot.state == STARTING:
                slot.started = True
                self.roster.ready(slot)
            elif message[0] == "failed":
                child.failure = message[1]
        if message[0] == "ready":
            log.info("model worker %s (pid %d) is ready", slot.name, child.pid)
        else:
            log.error(
                "model worker %s (pid %d) could not load its model: %s\n%s",
                slot.name,
                child.pid,
                message[1],
                message[2],
            )

    def _reap(self, slot: ProcessSlot, child: Child) -> None:
        """A replica exited: record how, then restart it after its backoff (or not, when
        stopping)."""
        delay: float | None = None
        with self.cond:
            code = child.process.exitcode  # waitpid(WNOHANG)
        if code is None:  # another thread's waitpid won the race: it sets returncode soon
            time.sleep(0.01)
            return
        with self.cond:
            child.exitcode = code
            slot.pid = None
            how = describe_exit(code)
            was, planned = slot.state, child.why
            slot.last_exit = how if planned is None else f"{how}, killed: {planned}"
            if was == STARTING:
                slot.started = True
                slot.load_error = child.failure or f"it exited ({how}) before it was ready"
            if not child.busy:
                child.conn.close()
            if self._stop_at is not None:
                slot.state = STOPPED
            else:
                self.roster.died += planned is None
                delay = self._schedule(slot)
            self.cond.notify_all()
        child.process.close()
        if delay is not None:
            _log_exit(slot, child, how, was, delay)

    def _schedule(self, slot: ProcessSlot) -> float:
        first, cap = self._backoff
        delay = min(first * 2.0**slot.failures, cap)
        slot.failures += 1
        slot.restart_at = time.monotonic() + delay
        slot.state = DOWN
        return delay

    def _expire_starts(self) -> None:
        now = time.monotonic()
        with self.cond:
            for slot in self.roster.slots:
                child = slot.child
                deadline = None if child is None else child.start_deadline
                if slot.state == STARTING and deadline is not None and now >= deadline:
                    assert child is not None
                    child.failure = (
                        child.failure or "it did not become ready within start_timeout_s"
                    )
                    child.kill("start timeout")

    def _stopping(self) -> bool:
        """Stop every replica: ``stop`` to idle ones, SIGKILL to the rest (and to all once
        the grace period is over). True when none is left."""
        assert self._stop_at is not None
        late = time.monotonic() >= self._stop_at
        for slot in self.roster.slots:
            child = slot.child
            if child is None or child.exitcode is not None:
                slot.state = STOPPED
            elif slot.state == IDLE:
                slot.state = DYING
                try:
                    child.conn.send(("stop",))
                except OSError:
                    child.kill("pool closed")
            elif slot.state != DYING or late:
                child.kill("pool closed")
        return all(s.state == STOPPED for s in self.roster.slots)

    def _kill_all(self, why: str) -> None:
        with self.cond:
            for slot in self.roster.slots:
                if slot.child is not None:
                    slot.child.kill(why)


def _log_exit(slot: ProcessSlot, child: Child, how: str, was: str, delay: float) -> None:
    again = f"; restarting it in {delay:.2g} s"
    if child.why is not None:
        log.warning(
            "model worker %s (pid %d) exited (%s): killed, %s%s",
            slot.name,
            child.pid,
            how,
            child.why,
            again,
        )
    elif was == STARTING:
        log.error(
            "model worker %s (pid %d) failed to start (%s)%s", slot.name, child.pid, how, again
        )
    else:
        doing = "running a batch" if was in (BUSY, DYING) else "idle"
        log.error(
            "model worker %s (pid %d) died (%s) while %s%s", slot.name, child.pid, how, doing, again
        )
