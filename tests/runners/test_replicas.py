"""carpool.runners.replicas, the core both replica runners share, driven by a fake runner in
this process: taking a free replica, the wait bounded by batch_timeout_ms, retry-once, close
(also while a batch runs), the statistics, and loading a spec on the replica's side.

No process and no clock assertions: the fake's replicas are slots whose batches wait on
events the test sets.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

import carpool
import process_models as pm
from carpool.errors import BatchTimeout, WorkerDied, WorkerPoolClosed, WorkerStartError
from carpool.runners.replicas import (
    BUSY,
    DOWN,
    DYING,
    IDLE,
    STARTING,
    STOPPED,
    OnOwnLoop,
    ReplicaSet,
    Slot,
    _ReplicaLost,
    load_replica,
    replica_fn,
)
from conftest import wait_until


@dataclass(eq=False, kw_only=True)
class FakeSlot(Slot):
    """A replica that runs ``fate`` on each batch: its next outcomes, popped in order."""

    fate: list[Any] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)


class FakeReplicas(ReplicaSet[FakeSlot]):
    """Replicas whose batch is a function of the slot: ``"lost"`` dies, ``"hold"`` waits
    for the slot's ``release`` (then dies if the runner stopped), anything else answers
    ``(slot name, batch)``."""

    def __init__(self, workers: int = 2, **options: Any) -> None:
        options = {"batch_timeout_ms": None, "retry": True, **options}
        super().__init__(name="fake", workers=workers, **options)
        self.stopped = False

    def start(self) -> FakeReplicas:
        for slot in self._launch(lambda name: FakeSlot(name=name)):
            with self.roster.cond:
                self.roster.ready(slot)
        return self

    def _carry(self, slot: FakeSlot, payload: Any) -> Any:
        fate = slot.fate.pop(0) if slot.fate else None
        if fate == "hold":
            slot.release.wait(30)
            fate = "lost" if self.stopped else None
        if fate == "lost":
            with self.roster.cond:
                slot.state = DOWN
            raise _ReplicaLost(-9, "gone")
        with self.roster.cond:
            self.roster.give_back(slot, healthy=True)
        return slot.name, payload

    def _stop(self, deadline: float) -> None:
        self.stopped = True
        for slot in self.roster.slots:
            slot.release.set()
            slot.state = STOPPED


def test_a_call_takes_the_most_recently_freed_replica() -> None:
    replicas = FakeReplicas(3).start()
    assert replicas.call(1) == ("fake#2", 1)  # the last one readied
    assert replicas.call(2) == ("fake#2", 2)  # warm: the same one again
    stats = replicas.stats()
    assert (stats.alive, stats.retried, stats.timed_out, stats.died) == (3, 0, 0, 0)
    assert [r.state for r in stats.replicas] == ["idle"] * 3
    assert [r.name for r in stats.replicas] == ["fake#0", "fake#1", "fake#2"]


def test_a_replica_lost_mid_batch_costs_one_retry_then_worker_died() -> None:
    replicas = FakeReplicas(2).start()
    first, second = replicas.roster.slots
    second.fate = ["lost"]
    assert replicas.call("x") == ("fake#0", "x")  # retried on the other replica
    assert replicas.stats().retried == 1

    with replicas.roster.cond:
        replicas.roster.ready(second)
    first.fate, second.fate = ["lost"], ["lost"]
    with pytest.raises(WorkerDied, match=r"died \(gone\) .* after one retry") as info:
        replicas.call("y")
    assert (info.value.retried, info.value.exitcode, info.value.cause) == (True, -9, "gone")
    assert replicas.stats().retried == 2

    with replicas.roster.cond:
        replicas.roster.ready(first)
    first.fate = ["lost"]
    with pytest.raises(WorkerDied) as info:
        replicas.call("z", retry=False)
    assert info.value.retried is False
    assert replicas.stats().retried == 2


def test_waiting_for_a_replica_is_bounded_by_batch_timeout() -> None:
    replicas = FakeReplicas(1, batch_timeout_ms=50.0).start()
    (slot,) = replicas.roster.slots
    with replicas.roster.cond:
        slot.state = DOWN
    with pytest.raises(BatchTimeout, match="no model worker of fake was alive") as info:
        replicas.call(1)
    assert info.value.stage == "waiting"
    stats = replicas.stats()
    assert (stats.alive, stats.timed_out) == (0, 1)
    assert stats.replicas[0].state == "restarting"


def test_a_waiting_call_gets_the_replica_that_comes_back() -> None:
    replicas = FakeReplicas(1).start()
    (slot,) = replicas.roster.slots
    with replicas.roster.cond:
        slot.state = DYING
    with ThreadPoolExecutor(1) as thread:
        waiting = thread.submit(replicas.call, 7)
        with replicas.roster.cond:
            replicas.roster.ready(slot)
        assert waiting.result(timeout=30) == ("fake#0", 7)


def test_when_every_replica_failed_to_load_a_call_says_why() -> None:
    replicas = FakeReplicas(2).start()
    with replicas.roster.cond:
        for slot in replicas.roster.slots:
            slot.state, slot.load_error = DOWN, "ImportError: no weights"
    with pytest.raises(WorkerStartError, match="fake#0 could not load its model: ImportError"):
        replicas.call(1)


def test_close_lets_idle_replicas_go_and_refuses_later_calls() -> None:
    with pytest.raises(WorkerPoolClosed, match="is not started"):
        FakeReplicas().call(1)
    replicas = FakeReplicas().start()
    with pytest.raises(RuntimeError, match="already started"):
        replicas.start()
    replicas.close()
    assert replicas.stopped
    assert replicas.alive == 0
    with pytest.raises(WorkerPoolClosed, match="model worker pool 'fake' is closed"):
        replicas.call(1)
    replicas.close()  # idempotent


def test_a_batch_cut_short_by_close_is_worker_pool_closed_not_retried() -> None:
    replicas = FakeReplicas(2).start()
    for slot in replicas.roster.slots:
        slot.fate = ["hold"]
    with ThreadPoolExecutor(1) as thread:
        running = thread.submit(replicas.call, 1)
        wait_until(lambda: replicas.stats().replicas[-1].state == BUSY, "the batch to run")
        replicas.close(timeout=0.05)  # gives up waiting; stopping the replica ends the batch
        with pytest.raises(WorkerPoolClosed, match="was closed while the batch ran"):
            running.result(timeout=30)
    assert replicas.stats().retried == 0


def test_slot_states_as_stats_show_them() -> None:
    shown = {}
    for state in (STARTING, IDLE, BUSY, DYING, DOWN, STOPPED):
        shown[state] = FakeSlot(name="x", state=state).snapshot().state
    assert shown == {
        STARTING: "starting",
        IDLE: "idle",
        BUSY: "busy",
        DYING: "restarting",
        DOWN: "restarting",
        STOPPED: "stopped",
    }


# ---- the replica's side ----------------------------------------------------------------


def test_a_spec_is_the_function_or_a_factory_of_it_or_of_a_model() -> None:
    assert replica_fn(pm.double) is pm.double
    assert replica_fn(lambda: pm.double) is pm.double
    model = carpool.Model(pm.double, name="double")
    assert replica_fn(lambda: model) is pm.double  # a Model, known by its shape
    run = replica_fn(pm.async_double)
    assert isinstance(run, OnOwnLoop)
    run.close()
    with pytest.raises(TypeError, match="the model spec gave int, not a callable"):
        replica_fn(lambda: 3)


def test_loading_a_replica_captures_the_failure_with_its_reason() -> None:
    loaded = load_replica(pm.double, np.ones(2))
    assert loaded.fn is pm.double
    assert loaded.failure is None
    failed = load_replica(pm.broken_factory, None)
    assert failed.fn is None
    assert failed.failure == "RuntimeError: weights file /nowhere/model.bin is missing"
    assert failed.trace is not None
    assert "broken_factory" in failed.trace
    warmup_fails = load_replica(pm.troublemaker, np.ones(3))
    assert warmup_fails.failure is not None
    assert warmup_fails.failure.startswith("IndexError: too many indices")
    undecodable = load_replica(b"not a pickle", None, decode=_decode)
    assert undecodable.failure == "ValueError: cannot decode b'not a pickle'"


def _decode(data: bytes) -> Any:
    raise ValueError(f"cannot decode {data!r}")
