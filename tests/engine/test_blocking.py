"""The thread bridge: a batcher on a private loop in a thread (``with Batcher(...)``, built on
:class:`~carpool.engine.blocking.LoopThread`), ``submit()`` from many threads through the inbox,
``stats()`` from others, cancel, close.

Threads are lined up with ``threading.Barrier`` and held with ``threading.Event``; no
assertion depends on how long anything takes. Ordering facts the tests lean on: ``submit``
hands its request to the loop through ``call_soon_threadsafe`` before it returns, and
``stats()`` from another thread runs on the loop the same way, so a ``stats()`` made once
every submitting thread has returned from ``submit()`` sees those requests admitted.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import random
import sys
import threading
from collections import Counter
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

import numpy as np
import pytest

from carpool import Batcher, BatcherClosed
from carpool.engine.blocking import Inbox, LoopThread, Portal

# ----------------------------------------------------------------------- LoopThread alone


class Recorder:
    def __init__(self, fail_on_enter: bool = False) -> None:
        self.events: list[str] = []
        self.thread: int | None = None
        self.fail_on_enter = fail_on_enter

    async def __aenter__(self) -> Recorder:
        self.thread = threading.get_ident()
        asyncio.get_running_loop()
        if self.fail_on_enter:
            raise OSError("cannot start")
        self.events.append("enter")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.events.append("exit")


def test_enters_on_its_own_thread_and_exits_on_stop() -> None:
    target = Recorder()
    bridge = LoopThread(target, name="test-bridge")
    bridge.start()
    assert target.events == ["enter"]
    assert target.thread not in (None, threading.get_ident())
    bridge.stop()
    assert target.events == ["enter", "exit"]
    bridge.stop()  # idempotent


def test_an_error_while_entering_is_raised_in_the_caller(exit_handlers: list[Any]) -> None:
    bridge = LoopThread(Recorder(fail_on_enter=True), name="test-bridge")
    with pytest.raises(OSError, match="cannot start"):
        bridge.start()
    assert exit_handlers == []  # nothing runs, nothing to stop at exit


@pytest.fixture
def exit_handlers(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The exit handlers registered meanwhile and not unregistered, in order."""
    handlers: list[Any] = []
    monkeypatch.setattr(atexit, "register", handlers.append)

    def unregister(fn: Any) -> None:  # like atexit's: every registration of fn goes, if any
        handlers[:] = [h for h in handlers if h != fn]

    monkeypatch.setattr(atexit, "unregister", unregister)
    return handlers


def test_the_exit_handler_exists_only_while_the_thread_runs(exit_handlers: list[Any]) -> None:
    bridge = LoopThread(Recorder(), name="test-bridge")
    bridge.start()
    assert exit_handlers == [bridge.stop]  # drains the target if nobody stops it
    bridge.stop()
    assert exit_handlers == []
    bridge.stop()
    assert exit_handlers == []


def test_the_portal_stops_only_a_thread_of_its_own() -> None:
    target = Recorder()
    portal = Portal(target, name="test-portal", admit=lambda *a: None, cancel=lambda r: None)
    assert portal.stop() is False  # not started here: the engine runs on somebody's loop
    portal.start()
    assert target.events == ["enter"]
    assert portal.stop() is True
    assert portal.stop() is True  # idempotent
    assert target.events == ["enter", "exit"]


# ----------------------------------------------------------------------- submit() from threads

THREADS = 100


def row(i: int) -> np.ndarray:
    return np.full(4, i, np.int64)


def expected(i: int) -> list[int]:
    return [2 * i + 1] * 4


class Model:
    """A sync model (run in the batcher's worker threads) recording which rows it computed;
    with ``hold=True`` it blocks every batch until :meth:`open` is called."""

    def __init__(self, *, hold: bool = False) -> None:
        self.batches: list[list[int]] = []
        self.entered = threading.Event()
        self.gate = threading.Event()
        if not hold:
            self.gate.set()

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        self.batches.append([int(r[0]) for r in batch])
        self.entered.set()
        self.gate.wait()
        return batch * 2 + 1

    def open(self) -> None:
        self.gate.set()

    def seen(self) -> Counter[int]:
        return Counter(i for batch in self.batches for i in batch)


class AsyncModel(Model):
    async def __call__(self, batch: np.ndarray) -> np.ndarray:  # type: ignore[override]
        self.batches.append([int(r[0]) for r in batch])
        return batch * 2 + 1


def run_threads(count: int, target: Callable[[int], Any]) -> list[Any]:
    """Start ``count`` threads that pass a barrier together, call ``target(i)``, and return
    what each returned (or raised)."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count

    def main(i: int) -> None:
        barrier.wait()
        try:
            results[i] = target(i)
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=main, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def own_row(batcher: Batcher) -> Callable[[int], list[int]]:
    def call(i: int) -> list[int]:
        out: list[int] = batcher.submit(row(i)).result().tolist()
        return out

    return call


def test_a_hundred_threads_each_get_their_own_row_from_a_with_batcher() -> None:
    model = Model()
    with Batcher(model, max_batch_size=8, workers=2) as batcher:
        results = run_threads(THREADS, own_row(batcher))
        stats = batcher.stats()
    assert results == [expected(i) for i in range(THREADS)]
    assert model.seen() == Counter(range(THREADS))  # each row computed exactly once
    assert all(1 <= len(b) <= 8 for b in model.batches)
    assert (stats.submitted, stats.completed, stats.pending, stats.rejected) == (100, 100, 0, 0)
    assert stats.batches == len(model.batches)
    assert sum(n * size for size, n in stats.batch_sizes.items()) == THREADS


@pytest.mark.parametrize("model_kind", [Model, AsyncModel])
async def test_a_hundred_threads_submit_to_a_batcher_on_the_callers_loop(
    model_kind: type[Model],
) -> None:
    model = model_kind()
    async with Batcher(model, max_batch_size=8, workers=2) as batcher:
        results = await asyncio.to_thread(run_threads, THREADS, own_row(batcher))
        stats = await asyncio.to_thread(batcher.stats)  # from another thread, loop running
    assert results == [expected(i) for i in range(THREADS)]
    assert model.seen() == Counter(range(THREADS))
    assert all(1 <= len(b) <= 8 for b in model.batches)
    assert (stats.submitted, stats.completed, stats.pending) == (100, 100, 0)


def test_threads_submit_while_others_read_stats() -> None:
    model = Model()
    with Batcher(model, max_batch_size=4, workers=3) as batcher:

        def call(i: int) -> Any:
            if i % 4 == 0:
                return [batcher.stats() for _ in range(20)]
            return own_row(batcher)(i)

        results = run_threads(THREADS, call)
    for i, result in enumerate(results):
        if i % 4 == 0:
            for snap in result:
                done = snap.completed + snap.failed + snap.expired + snap.cancelled
                assert snap.submitted == done + snap.pending
                assert 0 <= snap.completed <= 75
        else:
            assert result == expected(i)
    stats = batcher.stats()
    assert (stats.submitted, stats.completed, stats.pending) == (75, 75, 0)


def test_cancelling_a_queued_future_withdraws_it_and_it_is_never_computed() -> None:
    model = Model(hold=True)
    with Batcher(model, max_batch_size=4) as batcher:
        try:
            first = batcher.submit(row(0))
            assert model.entered.wait(timeout=30)  # the only worker is busy with row 0
            second = batcher.submit(row(1))
            third = batcher.submit(row(2))
            stats = batcher.stats()  # runs on the loop after both were admitted
            assert (stats.submitted, stats.queued_rows, stats.batches) == (3, 2, 1)

            assert second.cancel()
            stats = batcher.stats()  # the withdrawal reached the loop before this did
            assert (stats.cancelled, stats.queued_rows, stats.pending) == (1, 1, 2)
        finally:
            model.open()
        assert first.result().tolist() == expected(0)
        assert third.result().tolist() == expected(2)
    assert second.cancelled()
    assert model.batches == [[0], [2]]
    stats = batcher.stats()
    assert (stats.submitted, stats.completed, stats.cancelled, stats.pending) == (3, 2, 1, 0)


def test_cancelling_right_after_submit_never_computes_the_row() -> None:
    model = Model(hold=True)
    with Batcher(model, max_batch_size=32) as batcher:  # no full batch to stage while held
        try:
            first = batcher.submit(row(0))
            assert model.entered.wait(timeout=30)
            futures = [batcher.submit(row(i)) for i in range(1, 21)]
            withdrawn = [f for f in futures[::2] if f.cancel()]  # admitted yet or not
            assert len(withdrawn) == 10
            stats = batcher.stats()
            # a future cancelled before the loop took it is never submitted at all
            assert stats.submitted - stats.cancelled == 11
            assert (stats.queued_rows, stats.pending) == (10, 11)
        finally:
            model.open()
    assert first.result().tolist() == expected(0)
    assert [f.result().tolist() for f in futures[1::2]] == [expected(i) for i in range(2, 21, 2)]
    assert model.seen() == Counter([0, *range(2, 21, 2)])
    stats = batcher.stats()
    assert (stats.completed, stats.pending, stats.queued_rows) == (11, 0, 0)
    assert stats.submitted == stats.completed + stats.cancelled


def test_a_thread_cancelling_its_future_gets_no_row_and_others_are_unaffected() -> None:
    model = Model()
    with Batcher(model, max_batch_size=8, workers=2) as batcher:

        def call(i: int) -> Any:
            rng = random.Random(i)
            outcomes = []
            for n in range(10):
                k = i * 10 + n
                future = batcher.submit(row(k))
                if rng.random() < 0.3 and future.cancel():
                    outcomes.append((k, None))
                else:
                    outcomes.append((k, future.result().tolist()))
            return outcomes

        results = run_threads(32, call)
    got = [pair for outcomes in results for pair in outcomes]
    assert len(got) == 320
    for k, out in got:
        assert out is None or out == expected(k)
    computed = model.seen()
    assert all(n == 1 for n in computed.values())  # no row computed twice
    assert {k for k, out in got if out is not None} <= computed.keys()
    stats = batcher.stats()
    answered = sum(out is not None for _, out in got)
    assert (stats.pending, stats.queued_rows, stats.failed, stats.expired) == (0, 0, 0, 0)
    assert stats.submitted == stats.completed + stats.cancelled
    # a cancel can lose the race to a finished batch: counted completed, the caller cancelled
    assert answered <= stats.completed <= len(computed)


def test_leaving_the_with_block_drains_every_accepted_request() -> None:
    model = Model()
    # fixed with an hour's wait: a partial batch leaves only when the batcher drains
    batcher = Batcher(model, max_batch_size=32, policy="fixed", max_wait_ms=3_600_000)
    with batcher:
        futures = run_threads(THREADS, lambda i: batcher.submit(row(i)))
        stats = batcher.stats()
        assert stats.submitted == 100
        # stats() admits what submit() handed over, possibly before the scheduler has run:
        # nothing dispatched yet (100), or 1-3 full batches gone to the worker or staged
        assert stats.queued_rows in (4, 36, 68, 100)
        assert set(stats.dispatch_reasons) <= {"full"}
        assert sum(not f.done() for f in futures) >= 4  # the partial batch waits for an hour
    assert all(f.done() for f in futures)
    assert [f.result().tolist() for f in futures] == [expected(i) for i in range(THREADS)]
    stats = batcher.stats()
    assert dict(stats.dispatch_reasons) == {"full": 3, "drain": 1}
    assert (stats.completed, stats.pending, stats.queued_rows) == (100, 0, 0)


def test_submit_after_close_raises_batcher_closed() -> None:
    batcher = Batcher(Model())
    with pytest.raises(BatcherClosed, match="not started"):
        batcher.submit(row(0))
    with batcher:
        assert batcher.submit(row(1)).result().tolist() == expected(1)
    with pytest.raises(BatcherClosed):
        batcher.submit(row(2))
    results = run_threads(8, lambda i: batcher.submit(row(i)))
    assert all(isinstance(r, BatcherClosed) for r in results)
    stats = batcher.stats()  # callable after close, from any thread
    assert (stats.submitted, stats.completed, stats.pending) == (1, 1, 0)


async def test_submit_after_aclose_raises_batcher_closed() -> None:
    model = Model()
    async with Batcher(model) as batcher:
        future = await asyncio.to_thread(batcher.submit, row(3))
        assert (await asyncio.wrap_future(future)).tolist() == expected(3)
    with pytest.raises(BatcherClosed):
        await asyncio.to_thread(batcher.submit, row(4))
    with pytest.raises(BatcherClosed):
        await batcher.infer(row(5))
    assert model.seen() == Counter([3])


def test_stats_from_another_thread_sees_the_queue_while_the_model_is_held() -> None:
    model = Model(hold=True)
    with Batcher(model, max_batch_size=8) as batcher:  # no full batch to stage while held
        try:
            futures = [batcher.submit(row(0))]
            assert model.entered.wait(timeout=30)
            futures += [batcher.submit(row(i)) for i in range(1, 6)]
            batcher.stats()  # every submit above has reached the loop
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                snaps = list(pool.map(lambda _: batcher.stats(), range(8)))
            assert {(s.submitted, s.queued_rows, s.batches, s.pending) for s in snaps} == {
                (6, 5, 1, 6)
            }
        finally:
            model.open()
        assert [f.result().tolist() for f in futures] == [expected(i) for i in range(6)]
    assert model.batches == [[0], [1, 2, 3, 4, 5]]


def test_submits_racing_close_are_all_answered() -> None:
    model = Model()
    batcher = Batcher(model, max_batch_size=8, workers=2)
    threads = 8
    ready = threading.Barrier(threads + 1)  # every thread has one request in before close
    futures: list[list[tuple[int, concurrent.futures.Future[Any]]]] = [[] for _ in range(threads)]

    def keep_submitting(t: int) -> None:
        for n in range(500):
            k = t * 500 + n
            try:
                futures[t].append((k, batcher.submit(row(k))))
            except BatcherClosed:
                return
            if n == 0:
                ready.wait()

    with batcher:
        workers = [threading.Thread(target=keep_submitting, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        ready.wait()
    for w in workers:
        w.join()

    answered = closed = 0
    for k, future in (pair for mine in futures for pair in mine):
        assert future.done()  # accepted or refused, nobody is left waiting
        error = future.exception()
        if error is None:
            assert future.result().tolist() == expected(k)
            answered += 1
        else:
            assert isinstance(error, BatcherClosed)
            closed += 1
    assert answered >= threads
    assert model.seen() == Counter(k for mine in futures for k, f in mine if f.exception() is None)
    stats = batcher.stats()
    assert (stats.submitted, stats.completed, stats.pending) == (answered, answered, 0)


def test_a_future_submit_returned_before_close_is_answered_though_another_submit_stalls() -> None:
    """A submit() that returned before close() was called was accepted: close must finish it.

    Here a second thread is frozen inside its own submit() just after claiming the inbox
    hand-off (``Inbox._armed``, in ``Inbox.put``) and before scheduling it on the loop, as a
    preempted thread can be. White-box: it pins the current hand-off, and releases the frozen
    thread after a while if close() cannot finish without it, so a changed hand-off fails
    rather than hangs.
    """
    model = Model()
    batcher = Batcher(model)
    frozen, thaw = threading.Event(), threading.Event()

    def freeze_after_arming(frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code is not Inbox.put.__code__:
            return None

        def line(frame: FrameType, event: str, arg: Any) -> Any:
            armed = getattr(frame.f_locals.get("self"), "_armed", False)
            if event == "line" and armed and not frozen.is_set():
                froze.append(True)
                frozen.set()
                thaw.wait()
            return line

        return line

    slow_result: list[Any] = []
    froze: list[bool] = []

    def slow_submitter() -> None:
        sys.settrace(freeze_after_arming)
        try:
            slow_result.append(batcher.submit(row(0)))
        finally:
            sys.settrace(None)
            frozen.set()  # a hand-off without the flag: nothing froze, go on

    accepted: list[concurrent.futures.Future[Any]] = []

    def submit_then_close() -> None:
        accepted.append(batcher.submit(row(1)))  # returns: the request is accepted
        batcher.close()

    batcher.__enter__()
    slow = threading.Thread(target=slow_submitter)
    closer = threading.Thread(target=submit_then_close)
    slow.start()
    try:
        frozen.wait()
        closer.start()
        closer.join(timeout=30)  # not an assertion: only the way out if close() needs `slow`
    finally:
        thaw.set()
        slow.join()
        closer.join()
        batcher.close()
    assert froze, "the submit was never frozen after arming: the hand-off changed"
    assert all(f.done() for f in slow_result)  # concurrent with close: answered either way
    [future] = accepted
    assert future.done()
    assert future.exception() is None, future.exception()
    assert future.result().tolist() == expected(1)
