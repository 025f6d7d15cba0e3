"""carpool.runners.processes with real processes and real signals: results equal in-process ones
bit for bit, GIL-bound batches run in parallel, and each fault has its one outcome (retry,
WorkerDied, BatchTimeout, WorkerStartError, WorkerPoolClosed) with no process left behind,
even when the parent itself is SIGKILLed.

Nothing here asserts on wall-clock durations: tests wait (bounded) for states, and compare
timestamps the workers report to order events.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import pickle
import re
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import process_models as pm
from carpool.backends.demo import DemoMLP
from carpool.errors import (
    BatcherClosed,
    BatchTimeout,
    CarpoolError,
    WorkerDied,
    WorkerPoolClosed,
    WorkerStartError,
)
from carpool.ipc.transport import MIN_ARENA
from carpool.loading import load_target
from carpool.runners.processes import ProcessReplicas
from carpool.runners.replicas import OnOwnLoop, replica_fn
from conftest import running, wait_until

TESTS = Path(__file__).resolve().parent.parent
SRC = TESTS.parent / "src"

MakePool = Callable[..., ProcessReplicas]


def pids(pool: ProcessReplicas) -> list[int]:
    return [w.pid for w in pool.stats().replicas if w.pid is not None]


def busy_pid(pool: ProcessReplicas) -> int | None:
    return next((w.pid for w in pool.stats().replicas if w.state == "busy"), None)


@pytest.fixture
def pools() -> Iterator[MakePool]:
    """Start pools; close them after the test and check no process of theirs is left."""
    made: list[ProcessReplicas] = []

    def make(spec: Any, workers: int = 2, **options: Any) -> ProcessReplicas:
        pool = ProcessReplicas(spec, workers, name=options.pop("name", "demo"), **options)
        made.append(pool)
        return pool.start()

    yield make
    for pool in made:
        seen = pids(pool)
        pool.close()
        assert not [pid for pid in seen if running(pid)]
        assert pool.alive == 0


def rows(n: int = 4, first: float = 1.0) -> np.ndarray[Any, Any]:
    batch = np.arange(n * 3, dtype=np.float64).reshape(n, 3) + 1
    batch[0, 0] = first
    return batch


# ---- results --------------------------------------------------------------------------


@pytest.mark.slow
def test_results_equal_the_in_process_model_bit_for_bit(pools: MakePool) -> None:
    # A factory returning a carpool.Model (the built-in demo): the worker runs its fn.
    spec = functools.partial(load_target, "demo")
    pool = pools(spec, warmup=np.zeros((1, 256), np.float32))
    mlp = DemoMLP()
    rng = np.random.default_rng(1)
    for n in (1, 7, 32, 300):
        batch = rng.standard_normal((n, 256)).astype(np.float32)
        with threadpool_limits(1, user_api="blas"):  # as demo_model() runs it in any process
            want = mlp(batch)
        got = pool.call(batch)
        assert (got.dtype, got.shape) == (want.dtype, want.shape)
        assert got.tobytes() == want.tobytes()


@pytest.mark.slow
def test_every_structure_crosses_and_outputs_are_private_copies(pools: MakePool) -> None:
    pool = pools(pm.echo, 1)
    ids = np.arange(12, dtype=np.int64).reshape(2, 6)
    batch = {
        "ids": ids,
        "mask": ids % 2 == 0,
        "half": np.ones((2, 3), np.float16),
        "strided": np.arange(40, dtype=np.float32).reshape(4, 10)[::2, ::3],
        "pair": (ids, ids[:, :2]),
        "text": np.array([b"a", b"bc"], dtype=object),
        "scale": 0.5,
    }
    got = pool.call(batch)
    assert list(got) == list(batch)
    for key in ("ids", "mask", "half", "strided", "text"):
        assert got[key].dtype == batch[key].dtype
        assert np.array_equal(got[key], batch[key])
    assert [a.tolist() for a in got["pair"]] == [a.tolist() for a in batch["pair"]]
    assert got["scale"] == 0.5

    big = np.random.default_rng(0).standard_normal((800, 1000))  # 6.4 MB: both arenas grow
    first = pool.call(big)
    second = pool.call(big[:10] * 3)
    assert np.array_equal(first, big)  # not overwritten by the next batch
    assert np.array_equal(second, big[:10] * 3)
    assert pool.stats().restarts == 0


def segments() -> dict[str, int]:
    """The shared-memory segments this process made, in /dev/shm, and their sizes."""
    prefix = f"carpool_{os.getpid()}_"
    shm = Path("/dev/shm")
    return {p.name: p.stat().st_size for p in shm.iterdir() if p.name.startswith(prefix)}


@pytest.mark.slow
def test_arenas_grown_by_one_large_batch_shrink_back_once_it_goes_unneeded(
    pools: MakePool,
) -> None:
    now = [0.0]  # the pool's clock, moved by hand
    before = segments()
    pool = pools(pm.echo, 1, shrink_after_s=30.0, clock=lambda: now[0])
    (child,) = pids(pool)

    def arenas() -> dict[str, int]:
        return {name: size for name, size in segments().items() if name not in before}

    def maps() -> str:  # where an unlinked segment still holds its pages
        return Path(f"/proc/{child}/maps").read_text() + Path("/proc/self/maps").read_text()

    assert sorted(arenas().values()) == [MIN_ARENA, MIN_ARENA]
    big = np.random.default_rng(0).standard_normal((1024, 1024))  # 8 MiB: both arenas grow
    assert np.array_equal(pool.call(big), big)
    grown = arenas()
    assert sorted(grown.values()) == [big.nbytes, big.nbytes]
    for t in (1.0, 29.9):  # small batches, but the large size was needed under 30 s ago
        now[0] = t
        assert np.array_equal(pool.call(rows(first=t)), rows(first=t))
        assert arenas() == grown
    large_outputs = pool.roster.slots[0].outputs.name
    now[0] = 30.0
    assert np.array_equal(pool.call(rows(first=30.0)), rows(first=30.0))
    shrunk = arenas()  # the inputs shrank before the batch, the outputs after it
    assert sorted(shrunk.values()) == [MIN_ARENA, MIN_ARENA]
    assert not set(shrunk) & set(grown)
    # Unlinked, but the replica still maps the outputs it wrote until a header names others.
    assert [name for name in grown if name in maps()] == [large_outputs]
    now[0] = 31.0
    assert np.array_equal(pool.call(rows(first=31.0)), rows(first=31.0))
    assert arenas() == shrunk
    assert [name for name in grown if name in maps()] == []  # the replica let go of them too
    assert np.array_equal(pool.call(big * 2), big * 2)  # and they grow again as before
    assert sorted(arenas().values()) == [big.nbytes, big.nbytes]
    assert pool.stats().restarts == 0


@pytest.mark.slow
def test_model_errors_reach_the_caller_and_the_worker_stays(pools: MakePool) -> None:
    pool = pools(pm.echo, 1)
    pid = pids(pool)
    with pytest.raises(ValueError, match="bad batch") as info:
        pool.call("raise-value")
    assert any("raised in model worker demo#0" in note for note in info.value.__notes__)
    # An exception that cannot be rebuilt arrives as a RuntimeError naming its type.
    with pytest.raises(RuntimeError, match=r"^Unpicklable: unpicklable 1 2\n"):
        pool.call("raise-unpicklable")
    # A batch that cannot be pickled fails before it is sent; the worker is not touched.
    with pytest.raises((AttributeError, pickle.PicklingError), match="local object"):
        pool.call({"x": np.ones(2), "fn": lambda: None})
    assert pool.call(7) == 7
    assert pids(pool) == pid
    stats = pool.stats()
    assert (stats.died, stats.retried, stats.restarts) == (0, 0, 0)


@pytest.mark.slow
def test_two_workers_run_gil_bound_batches_in_parallel(pools: MakePool) -> None:
    pool = pools(pm.gil_spin, 2)
    spin = np.full((4, 1), 0.3)  # seconds of pure Python per batch
    with ThreadPoolExecutor(4) as threads:
        a, b, c, d = threads.map(pool.call, [spin] * 4)
    # The first two overlapped in time, in two different processes.
    assert a["pid"][0] != b["pid"][0]
    assert a["start"][0] < b["end"][0]
    assert b["start"][0] < a["end"][0]
    # Four calls on two workers: each process ran its batches one after another.
    by_pid: dict[int, list[tuple[float, float]]] = {}
    for out in (a, b, c, d):
        by_pid.setdefault(int(out["pid"][0]), []).append((out["start"][0], out["end"][0]))
    assert len(by_pid) == 2
    for spans in by_pid.values():
        spans.sort()
        assert all(e1 <= s2 for (_, e1), (s2, _) in itertools.pairwise(spans))


# ---- faults ---------------------------------------------------------------------------


@pytest.mark.slow
def test_a_worker_killed_mid_batch_is_retried_and_restarted(
    pools: MakePool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="carpool.workers")
    pool = pools(pm.pid_and_double, 2)
    batch = np.full((3, 2), pm.SLOW)
    with ThreadPoolExecutor(1) as thread:
        future = thread.submit(pool.call, batch)
        wait_until(lambda: busy_pid(pool) is not None, "a busy worker")
        victim = busy_pid(pool)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        out = future.result(timeout=60)
    assert np.array_equal(out["y"], batch * 2)
    assert int(out["pid"][0]) != victim
    assert (pool.stats().retried, pool.stats().died) == (1, 1)
    wait_until(lambda: pool.alive == 2, "the killed worker to come back")
    stats = pool.stats()
    assert stats.restarts == 1
    assert victim not in pids(pool)
    assert not running(victim)
    assert sorted(w.last_exit or "" for w in stats.replicas) == ["", "signal 9"]
    assert re.search(rf"\(pid {victim}\) died \(signal 9\) while running a batch", caplog.text)
    assert np.array_equal(pool.call(np.ones((2, 2)))["y"], np.full((2, 2), 2.0))


@pytest.mark.slow
def test_a_poisoned_row_that_kills_its_worker_fails_after_one_retry(pools: MakePool) -> None:
    pool = pools(pm.troublemaker, 2)
    poisoned = rows()
    poisoned[2, 0] = pm.POISON
    with pytest.raises(WorkerDied) as info:
        pool.call(poisoned)
    error = info.value
    assert isinstance(error, RuntimeError)
    assert isinstance(error, CarpoolError)
    assert (error.exitcode, error.retried) == (1, True)
    assert re.match(
        r"model worker died \(exit code 1\) while running the batch after one retry on "
        r"another worker \(worker demo#[01]\)",
        str(error),
    )
    assert (pool.stats().retried, pool.stats().died) == (1, 2)

    wait_until(lambda: pool.alive == 2, "both workers to come back")
    assert np.array_equal(pool.call(rows()), rows() * 2)

    # Without retry (for this call, or for the pool), one death fails the call.
    with pytest.raises(WorkerDied, match=r"died \(exit code 1\)") as info:
        pool.call(poisoned, retry=False)
    assert info.value.retried is False
    assert (pool.stats().retried, pool.stats().died) == (1, 3)
    pool.retry = False

    segfault = rows(first=pm.SEGFAULT)  # a crash in native code reads as its signal
    with pytest.raises(WorkerDied, match=r"died \(signal 11\)") as info:
        pool.call(segfault)
    assert info.value.exitcode == -signal.SIGSEGV


@pytest.mark.slow
def test_a_hanging_batch_times_out_and_its_worker_is_replaced(pools: MakePool) -> None:
    pool = pools(pm.troublemaker, 2, batch_timeout_ms=1000)
    before = pids(pool)
    hang = rows(first=pm.HANG)
    with pytest.raises(BatchTimeout) as info:
        pool.call(hang)
    error = info.value
    assert isinstance(error, TimeoutError)
    assert re.match(
        r"model batch ran past batch_timeout_ms=1000 on worker demo#[01]; "
        r"the worker was killed and replaced",
        str(error),
    )
    assert np.array_equal(pool.call(rows()), rows() * 2)  # the other worker serves
    wait_until(lambda: pool.alive == 2, "the replacement worker")
    stats = pool.stats()
    assert (stats.timed_out, stats.retried, stats.died, stats.restarts) == (1, 0, 0, 1)
    assert len(set(before) - set(pids(pool))) == 1
    assert any("killed: its batch ran past" in (w.last_exit or "") for w in stats.replicas)


@pytest.mark.slow
def test_a_call_waits_for_a_worker_no_longer_than_batch_timeout(pools: MakePool) -> None:
    pool = pools(pm.double, 1, batch_timeout_ms=300, restart_backoff=(60.0, 60.0))
    (pid,) = pids(pool)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: pool.stats().replicas[0].state == "restarting", "the worker's death")
    with pytest.raises(BatchTimeout, match="no model worker of demo was alive") as info:
        pool.call(np.ones(2))
    assert info.value.stage == "waiting"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("spec", "warmup", "reason"),
    [
        (pm.broken_factory, None, "RuntimeError: weights file /nowhere/model.bin is missing"),
        (pm.troublemaker, np.ones(3), "IndexError: too many indices"),
    ],
    ids=["factory-raises", "warmup-raises"],
)
def test_a_model_that_cannot_load_fails_start_with_its_reason(
    spec: Any, warmup: Any, reason: str
) -> None:
    pool = ProcessReplicas(spec, 2, name="demo", warmup=warmup)
    with pytest.raises(WorkerStartError) as info:
        pool.start()
    assert info.value.worker in ("demo#0", "demo#1")
    assert str(info.value).startswith(
        f"model worker {info.value.worker} could not load its model: "
    )
    assert reason in str(info.value)
    assert pool.alive == 0
    assert [w.state for w in pool.stats().replicas] == ["stopped", "stopped"]
    with pytest.raises(WorkerPoolClosed):
        pool.call(np.ones(2))


def test_a_spec_that_cannot_be_pickled_is_refused_at_once() -> None:
    # workers and batch_timeout_ms are checked once, by the Batcher (tests/runners/test_runners.py)
    with pytest.raises(TypeError, match="picklable model spec"):
        ProcessReplicas(lambda batch: batch)
    with pytest.raises(WorkerPoolClosed, match="is not started"):
        ProcessReplicas(pm.double).call(np.ones(1))


# ---- closing --------------------------------------------------------------------------


@pytest.mark.slow
def test_close_lets_a_running_batch_finish_then_leaves_no_process() -> None:
    pool = ProcessReplicas(pm.pid_and_double, 1, name="demo").start()
    (pid,) = pids(pool)
    batch = np.full((2, 2), pm.SLOW)
    with ThreadPoolExecutor(1) as thread:
        future = thread.submit(pool.call, batch)
        wait_until(lambda: busy_pid(pool) is not None, "the batch to start")
        pool.close()
        assert np.array_equal(future.result(timeout=60)["y"], batch * 2)
    assert not running(pid)
    with pytest.raises(BatcherClosed, match="model worker pool 'demo' is closed"):
        pool.call(batch)
    pool.close()  # idempotent


@pytest.mark.slow
def test_close_kills_a_hung_batch_after_its_timeout() -> None:
    pool = ProcessReplicas(pm.troublemaker, 1, name="demo").start()
    (pid,) = pids(pool)
    with ThreadPoolExecutor(1) as thread:
        future = thread.submit(pool.call, rows(first=pm.HANG))
        wait_until(lambda: busy_pid(pool) is not None, "the batch to start")
        pool.close(timeout=0.2)
        with pytest.raises(WorkerPoolClosed, match="was closed while the batch ran"):
            future.result(timeout=60)
    assert not running(pid)


PARENT = """
import os, signal, threading, time
import numpy as np
import process_models as pm
from carpool.runners.processes import ProcessReplicas

if __name__ == "__main__":
    pool = ProcessReplicas(pm.troublemaker, 2, name="orphan").start()
    hang = np.ones((1, 2))
    hang[0, 0] = pm.HANG
    threading.Thread(target=pool.call, args=(hang,), daemon=True).start()
    while not any(w.state == "busy" for w in pool.stats().replicas):
        time.sleep(0.01)
    print(*[w.pid for w in pool.stats().replicas], flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
def test_workers_exit_when_their_parent_is_killed(tmp_path: Path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(PARENT))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(TESTS)])}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    children = [int(pid) for pid in done.stdout.split()]
    assert len(children) == 2
    wait_until(lambda: not any(running(pid) for pid in children), "orphaned workers to exit", 15)


UNCLOSED = """
import numpy as np
import process_models as pm
from carpool.runners.processes import ProcessReplicas

if __name__ == "__main__":
    pool = ProcessReplicas(pm.double, 2, name="unclosed").start()
    assert pool.call(np.ones(3)).tolist() == [2.0, 2.0, 2.0]
    print(*[w.pid for w in pool.stats().replicas], flush=True)
    print(*[a.name for s in pool.roster.slots for a in (s.inputs, s.outputs)], flush=True)
"""


@pytest.mark.slow
def test_a_script_that_never_closes_its_replicas_leaves_nothing_behind(tmp_path: Path) -> None:
    # The runner's own exit hook (registered by start(), not at import) closes it.
    script = tmp_path / "unclosed.py"
    script.write_text(textwrap.dedent(UNCLOSED))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(TESTS)])}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "leaked" not in done.stderr  # multiprocessing's resource tracker found nothing
    pid_line, names_line = done.stdout.splitlines()
    children = [int(pid) for pid in pid_line.split()]
    assert len(children) == 2
    assert not any(running(pid) for pid in children)
    segments = names_line.split()
    assert len(segments) == 4
    assert not [name for name in segments if Path("/dev/shm", name.lstrip("/")).exists()]


def test_specs_name_the_model_or_a_factory_of_it() -> None:
    # Resolved in the replica by replica_fn; checked here in-process, no process needed.
    mlp = replica_fn(pm.mlp)  # a zero-argument factory
    assert isinstance(mlp, DemoMLP)
    assert replica_fn(pm.double) is pm.double  # takes the batch: the model itself
    assert isinstance(replica_fn(functools.partial(load_target, "demo")), DemoMLP)  # a Model
    run = replica_fn(pm.async_double)  # async: run to completion on the worker's loop
    assert isinstance(run, OnOwnLoop)
    assert run(np.ones(2)).tolist() == [2.0, 2.0]
    run.close()
    with pytest.raises(TypeError, match="the model spec gave int, not a callable"):
        replica_fn(pm.not_a_model)


@pytest.mark.slow
def test_every_call_gets_one_answer_while_workers_are_killed(pools: MakePool) -> None:
    pool = pools(pm.pid_and_double, 2)
    killed: list[int] = []
    done = threading.Event()

    def killer() -> None:
        try:
            for _ in range(3):
                wait_until(lambda: pool.alive == 2 and busy_pid(pool) is not None, "a busy one")
                victim = busy_pid(pool)
                assert victim is not None
                os.kill(victim, signal.SIGKILL)
                killed.append(victim)
                wait_until(lambda v=victim: v not in pids(pool), "the victim to be reaped")
        finally:
            done.set()

    def client(seed: int) -> list[str]:
        outcomes = []
        i = 0
        while not done.is_set() or i < 20:  # keep the workers busy until the kills are over
            batch = np.full((3, 2), float(seed * 1000 + i))
            i += 1
            try:
                out = pool.call(batch)
            except WorkerDied:
                outcomes.append("died")
            else:
                assert np.array_equal(out["y"], batch * 2)
                outcomes.append("ok")
        return outcomes

    with ThreadPoolExecutor(9) as threads:
        murder = threads.submit(killer)
        clients = [threads.submit(client, seed) for seed in range(8)]
        answers = [future.result(timeout=120) for future in clients]
        murder.result(timeout=120)
    assert all(len(outcomes) >= 20 for outcomes in answers)  # every call answered once
    outcomes = [o for per_client in answers for o in per_client]
    stats = pool.stats()
    assert stats.died == len(set(killed)) == 3
    assert outcomes.count("died") <= stats.died  # a call fails only if its retry died too
    assert stats.retried >= 1
    wait_until(lambda: pool.alive == 2, "both workers back")
    assert not any(running(pid) for pid in killed)
