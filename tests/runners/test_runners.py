"""carpool.runners, and a Batcher whose model runs in process workers (``runner="process"``):
the choice and its checks, results equal to threads', and each fault's one outcome."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import carpool
import process_models as pm
from carpool.loading import load_target
from carpool.runners import RUNNERS
from conftest import replica_children, wait_until


def children() -> set[int]:
    """PIDs of this process's live model replicas."""
    return replica_children(os.getpid())


def row(first: float, n: int = 3) -> np.ndarray[Any, Any]:
    value = np.arange(n, dtype=np.float64) + 1
    value[0] = first
    return value


# ---- the choice ------------------------------------------------------------------------


def test_runners_are_thread_and_process() -> None:
    assert RUNNERS == ("thread", "process", "ray")
    assert carpool.Batcher(pm.double, runner="process", batch_timeout_ms=100.0).runner == "process"
    assert carpool.Batcher(pm.double).runner == "thread"


def test_an_unknown_runner_names_the_choices() -> None:
    with pytest.raises(
        carpool.ConfigError, match="runner must be one of thread, process, ray; got 'gpu'"
    ):
        carpool.Batcher(pm.double, runner="gpu")


def test_a_batch_timeout_needs_process_workers() -> None:
    with pytest.raises(carpool.ConfigError, match="batch_timeout_ms needs runner='process'"):
        carpool.Batcher(pm.double, batch_timeout_ms=100)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"batch_timeout_ms": 0}, ValueError, "batch_timeout_ms must be finite and > 0, got 0"),
        ({"batch_timeout_ms": "1s"}, TypeError, "batch_timeout_ms must be a number"),
        ({"retry": 1}, TypeError, "retry must be a bool, got int"),
        ({"workers": 0}, ValueError, "workers must be >= 1, got 0"),
    ],
)
def test_process_options_are_checked_at_construction(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        carpool.Batcher(pm.double, runner="process", **options)


def test_a_thread_batcher_counts_its_workers_alive() -> None:
    with carpool.Batcher(pm.double, workers=3) as batcher:
        assert batcher.workers_alive == 3
        stats = batcher.stats()
    assert (stats.workers_alive, stats.worker_restarts, stats.retried_batches) == (3, 0, 0)
    assert stats.timed_out_batches == 0


def test_constructing_a_process_batcher_starts_no_process() -> None:
    before = children()
    batcher = carpool.Batcher(pm.double, runner="process", workers=2)
    assert children() == before
    assert batcher.workers_alive == 0
    batcher.close()  # never started: nothing to stop


def test_importing_the_runners_runs_nothing() -> None:
    # No exit hook, thread or signal handler at import: a runner registers what it owns
    # when it starts. The modules they build on are imported first, for their own hooks.
    script = textwrap.dedent(
        """
        import atexit, signal, threading
        import carpool, carpool.engine.executor, carpool.ipc.transport
        before = (atexit._ncallbacks(), threading.active_count(), signal.getsignal(signal.SIGTERM))
        import carpool.runners.processes, carpool.runners.ray_actors
        after = (atexit._ncallbacks(), threading.active_count(), signal.getsignal(signal.SIGTERM))
        assert after == before, (before, after)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


# ---- results ---------------------------------------------------------------------------


@pytest.mark.slow
def test_process_results_equal_thread_results_bit_for_bit() -> None:
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(256).astype(np.float32) for _ in range(40)]

    async def serve(batcher: carpool.Batcher) -> list[Any]:
        async with batcher:
            return list(await asyncio.gather(*(batcher.infer(x) for x in xs)))

    demo = load_target("demo").fn  # the demo MLP, as `carpool serve demo` runs it
    threads = asyncio.run(serve(carpool.Batcher(demo, max_batch_size=8)))
    spec = functools.partial(load_target, "demo")  # a factory giving a carpool.Model
    processes = asyncio.run(
        serve(carpool.Batcher(spec, runner="process", workers=2, max_batch_size=8))
    )
    for got, want in zip(processes, threads, strict=True):
        assert (got.dtype, got.shape) == (want.dtype, want.shape)
        assert got.tobytes() == want.tobytes()


@pytest.mark.slow
def test_a_blocking_process_batcher_serves_threads_and_stops_its_processes() -> None:
    with carpool.Batcher(pm.pid_and_double, runner="process", workers=2, warmup=row(1)) as b:
        assert b.workers_alive == 2
        workers = children()
        assert len(workers) == 2
        futures = [b.submit(row(float(i))) for i in range(1, 33)]
        out = [f.result(timeout=30) for f in futures]
    assert [float(o["y"][0]) for o in out] == [2.0 * i for i in range(1, 33)]
    assert {int(o["pid"]) for o in out} <= workers
    assert not children() & workers


# ---- faults ----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_row_that_kills_its_worker_fails_alone_and_the_worker_comes_back() -> None:
    async def main() -> None:
        batcher = carpool.Batcher(pm.troublemaker, runner="process", workers=2, max_batch_size=8)
        async with batcher:
            xs = [row(float(i)) for i in range(16)]
            xs[5] = row(pm.POISON)
            out = await asyncio.gather(*(batcher.infer(x) for x in xs), return_exceptions=True)
            died = [i for i, o in enumerate(out) if isinstance(o, BaseException)]
            assert died == [5]
            error = out[5]
            assert isinstance(error, carpool.WorkerDied)
            assert error.exitcode == 1
            assert "died (exit code 1) while running the batch" in str(error)
            assert not getattr(error, "__notes__", [])  # the model did not raise it
            for i, o in enumerate(out):
                if i != 5:
                    assert isinstance(o, np.ndarray)
                    assert o.tolist() == (xs[i] * 2).tolist()
            await asyncio.to_thread(wait_until, lambda: batcher.workers_alive == 2, "restarts")
            stats = batcher.stats()
            assert stats.failed == 1
            assert stats.completed == 15
            assert stats.worker_restarts >= 2  # the whole batch and its retry at least
            assert stats.retried_batches >= 1
            assert await batcher.infer(row(4.0)) == pytest.approx(row(4.0) * 2)

    asyncio.run(main())


@pytest.mark.slow
def test_without_retry_a_killed_workers_batch_fails_at_once() -> None:
    async def main() -> None:
        batcher = carpool.Batcher(
            pm.troublemaker, runner="process", workers=2, retry=False, isolate_errors=False
        )
        async with batcher:
            with pytest.raises(carpool.WorkerDied, match=r"died \(exit code 1\)"):
                await batcher.infer(row(pm.POISON))
            assert batcher.stats().retried_batches == 0

    asyncio.run(main())


@pytest.mark.slow
def test_a_worker_killed_mid_batch_costs_a_retry_not_a_request() -> None:
    async def main() -> None:
        batcher = carpool.Batcher(pm.pid_and_double, runner="process", workers=1)
        async with batcher:
            (victim,) = children()
            slow = asyncio.ensure_future(batcher.infer(row(pm.SLOW)))
            # Inside its model call: the worker sleeps SLOW_S there, not on its pipe.
            await asyncio.to_thread(wait_until, lambda: _in_sleep(victim), "the slow batch")
            os.kill(victim, signal.SIGKILL)
            out = await slow  # run again on the restarted worker
            assert out["y"].tolist() == (row(pm.SLOW) * 2).tolist()
            assert int(out["pid"]) != victim
            stats = batcher.stats()
            assert (stats.retried_batches, stats.completed, stats.failed) == (1, 1, 0)
            assert (stats.worker_restarts, stats.workers_alive) == (1, 1)

    asyncio.run(main())


def _in_sleep(pid: int) -> bool:
    """Whether ``pid`` sleeps in ``time.sleep`` (a model call) rather than on its pipe."""
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone, or reaped as we read
        return False
    return "hrtimer" in wchan or "nanosleep" in wchan


@pytest.mark.slow
def test_a_hung_batch_times_out_and_its_worker_is_replaced() -> None:
    async def main() -> None:
        batcher = carpool.Batcher(
            pm.troublemaker, runner="process", workers=1, batch_timeout_ms=300
        )
        async with batcher:
            (first,) = children()
            with pytest.raises(carpool.BatchTimeout, match="ran past batch_timeout_ms=300"):
                await batcher.infer(row(pm.HANG))
            await asyncio.to_thread(wait_until, lambda: first not in children(), "the kill")
            await asyncio.to_thread(wait_until, lambda: batcher.workers_alive == 1, "restart")
            assert await batcher.infer(row(3.0)) == pytest.approx(row(3.0) * 2)
            stats = batcher.stats()
            assert (stats.timed_out_batches, stats.failed, stats.completed) == (1, 1, 1)

    asyncio.run(main())


@pytest.mark.slow
def test_a_model_no_worker_can_load_fails_the_start_with_its_reason() -> None:
    async def main() -> None:
        batcher = carpool.Batcher(pm.broken_factory, runner="process", workers=2)
        with pytest.raises(carpool.WorkerStartError, match=r"weights file /nowhere/model\.bin"):
            async with batcher:
                raise AssertionError("started")
        with pytest.raises(carpool.BatcherClosed):
            await batcher.infer(row(1.0))

    before = children()
    asyncio.run(main())
    assert children() == before


@pytest.mark.slow
def test_a_sigterm_to_the_process_group_leaves_the_workers_to_their_batcher() -> None:
    async def main() -> None:
        async with carpool.Batcher(pm.double, runner="process", workers=1) as batcher:
            (worker,) = children()
            os.kill(worker, signal.SIGTERM)  # as `kill -- -PGID` would send it
            os.kill(worker, signal.SIGINT)  # as Ctrl-C in a terminal would
            assert await batcher.infer(row(2.0)) == pytest.approx(row(2.0) * 2)
            assert children() == {worker}
        assert worker not in children()  # stopped by the batcher's close

    asyncio.run(main())
