"""The step-wise batcher end to end, in process: sequences join and leave at every step, a
cancelled or expired sequence frees its slot at the next step, priorities take free slots
first, one failing sequence fails alone, the queue refuses when full, and close drains."""

from __future__ import annotations

import asyncio
import functools
import threading

import pytest

from carpool.errors import (
    BatcherClosed,
    ConfigError,
    DeadlineExceeded,
    Overloaded,
    QueueFull,
)
from carpool.steps.batcher import StepBatcher
from steps.models import Counter, Faulty, Gated, Prompted


def test_outputs_stream_in_order_sync_and_async() -> None:
    with StepBatcher(Counter, max_sequences=4, workers=2) as batcher:
        streams = [batcher.stream(n) for n in (3, 1, 5)]
        assert [list(s) for s in streams] == [[1, 2, 3], [1], [1, 2, 3, 4, 5]]

        async def main() -> list[list[int]]:
            return list(await asyncio.gather(*(batcher.generate(n) for n in (2, 4))))

        assert asyncio.run(main()) == [[1, 2], [1, 2, 3, 4]]
    stats = batcher.stats()  # closed: every lane has finished its last step
    assert (stats.submitted, stats.completed, stats.outputs) == (5, 5, 15)
    assert batcher.active == 0


def test_sequences_join_and_leave_at_every_step() -> None:
    model = Gated()
    with StepBatcher(model, max_sequences=3) as batcher:
        a = batcher.stream(2)
        model.wait_entered()  # step 1 holds a alone
        b, c = batcher.stream(3), batcher.stream(1)
        model.release()  # step 1 ends: a got 1
        model.wait_entered()  # step 2: b and c joined
        d = batcher.stream(2)  # no slot: waits for the one c frees
        model.release()  # step 2 ends: a and c finish
        model.wait_entered()  # step 3: d joined
        model.release(10)
        assert [list(s) for s in (a, b, c, d)] == [[1, 2], [1, 2, 3], [1], [1, 2]]
    assert model.steps == [[2], [2, 3, 1], [3, 2], [3, 2]]


def test_a_cancelled_stream_frees_its_slot_at_the_next_step() -> None:
    model = Gated()
    with StepBatcher(model, max_sequences=1) as batcher:
        long = batcher.stream(100)
        model.wait_entered()
        waiting = batcher.stream(1)
        assert batcher.waiting == 1
        long.cancel()
        model.release()  # the step already running completes; then long leaves
        model.wait_entered()
        model.release()
        assert list(waiting) == [1]
        assert next(long, "ended") == 1  # its output of the step it was in, then the end
        assert next(long, "ended") == "ended"
    assert model.steps == [[100], [1]]
    assert model.freed == [100, 1]
    assert batcher.stats().cancelled == 1


def test_dropping_a_stream_cancels_its_sequence() -> None:
    model = Gated()
    with StepBatcher(model, max_sequences=1) as batcher:
        batcher.stream(100)  # dropped at once: it never steps
        kept = batcher.stream(1)
        model.wait_entered()
        model.release()
        assert list(kept) == [1]
    assert model.steps == [[1]]
    assert batcher.stats().cancelled == 1


def test_a_waiting_stream_cancelled_never_starts() -> None:
    model = Gated()
    with StepBatcher(model, max_sequences=1) as batcher:
        first = batcher.stream(2)
        model.wait_entered()
        skipped = batcher.stream(5)
        skipped.cancel()
        assert batcher.waiting == 0
        assert list(skipped) == []
        model.release(5)
        assert list(first) == [1, 2]
    assert [5] not in model.steps


def test_higher_priority_takes_the_next_free_slot() -> None:
    model = Gated()
    with StepBatcher(model, max_sequences=1) as batcher:
        first = batcher.stream(1)
        model.wait_entered()
        low = batcher.stream(1, priority=5)
        high = batcher.stream(2, priority=1)
        model.release(10)
        assert [list(s) for s in (first, low, high)] == [[1], [1], [1, 2]]
    assert model.steps == [[1], [2], [2], [1]]


def test_deadlines_end_waiting_and_running_sequences() -> None:
    model = Gated()
    with StepBatcher(model, max_sequences=1) as batcher:
        running = batcher.stream(1000, timeout_ms=50)
        model.wait_entered()
        waiting = batcher.stream(3, timeout_ms=50)
        threading.Event().wait(0.1)
        model.release()  # after this step both deadlines have passed
        with pytest.raises(DeadlineExceeded) as queued:
            list(waiting)
        assert queued.value.stage == "queued"
        with pytest.raises(DeadlineExceeded) as running_error:
            list(running)
        assert running_error.value.stage == "running"
    assert batcher.active == 0
    assert batcher.stats().expired == 2
    assert model.freed == [1000]


def test_a_failing_sequence_ends_alone() -> None:
    with StepBatcher(functools.partial(Faulty, bad=3, at=2), max_sequences=4) as batcher:
        good, bad = batcher.stream(4), batcher.stream(3)
        with pytest.raises(ValueError, match="input 3 fails at step 2") as failed:
            list(bad)
        assert list(good) == [1, 2, 3, 4]
    assert "the others went on" in failed.value.__notes__[0]
    assert batcher.stats().failed == 1


def test_the_queue_refuses_at_once_when_full() -> None:
    model = Gated()
    with StepBatcher(model, max_sequences=1, max_queue_size=2) as batcher:
        first = batcher.stream(1)
        model.wait_entered()
        queued = [batcher.stream(1), batcher.stream(1)]
        with pytest.raises(QueueFull, match="Exceeds maximum queue size"):
            batcher.stream(1)
        model.release(3)
        assert [list(s) for s in [first, *queued]] == [[1], [1], [1]]


def test_long_starts_are_paid_over_steps_within_the_budget() -> None:
    model = Prompted()
    with StepBatcher(model, max_sequences=2, step_tokens=10) as batcher:
        assert list(batcher.stream((25, 2))) == [1, 2]
    assert model.prefills == [[10], [10], [5]]


def test_close_lets_sequences_aboard_finish_and_fails_the_waiting() -> None:
    model = Gated()
    batcher = StepBatcher(model, max_sequences=1).start()
    aboard = batcher.stream(2)
    model.wait_entered()
    waiting = batcher.stream(2)
    closer = threading.Thread(target=batcher.close, kwargs={"timeout": 5})
    closer.start()
    with pytest.raises(BatcherClosed):
        list(waiting)
    model.release(2)
    closer.join()
    assert list(aboard) == [1, 2]
    with pytest.raises(BatcherClosed):
        batcher.stream(1)


def test_close_ends_sequences_still_aboard_at_its_timeout() -> None:
    model = Gated()
    batcher = StepBatcher(model, max_sequences=1).start()
    endless = batcher.stream(10**6)
    model.wait_entered()
    closer = threading.Thread(target=batcher.close, kwargs={"timeout": 0.05})
    closer.start()
    threading.Event().wait(0.1)
    model.release()
    closer.join()
    with pytest.raises(BatcherClosed, match="stopped before it ended"):
        list(endless)
    assert model.freed == [10**6]


def test_adaptive_refuses_what_it_predicts_late() -> None:
    class Slow(Counter):
        def step(self, states):  # type: ignore[no-untyped-def]
            threading.Event().wait(0.01)
            return super().step(states)

    with StepBatcher(Slow, max_sequences=1, policy="adaptive") as batcher:
        busy = batcher.stream(30)
        while batcher.stats().steps < 10:
            threading.Event().wait(0.01)
        with pytest.raises(Overloaded, match="latency objective"):
            batcher.stream(1, timeout_ms=5)
        assert list(batcher.stream(1, timeout_ms=60_000)) == [1]
        busy.cancel()
    assert batcher.stats().refused == 1


def test_process_replicas_keep_their_states() -> None:
    with StepBatcher(Counter, max_sequences=2, workers=2, runner="process") as batcher:
        streams = [batcher.stream(n) for n in (3, 2, 4, 1)]
        assert [list(s) for s in streams] == [[1, 2, 3], [1, 2], [1, 2, 3, 4], [1]]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_sequences": 0}, "max_sequences must be >= 1"),
        ({"step_tokens": 2, "max_sequences": 4}, "step_tokens must be >= max_sequences"),
        ({"runner": "fork"}, "runner must be one of"),
        ({"policy": "fixed"}, "policy must be 'eager' or 'adaptive'"),
        ({"workers": 2}, "pass a zero-argument factory"),
    ],
)
def test_options_are_checked(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        StepBatcher(Counter(), **kwargs)  # type: ignore[arg-type]


def test_a_model_that_is_not_step_wise_is_refused() -> None:
    with pytest.raises(ConfigError, match="must be a StepModel"):
        StepBatcher(lambda batch: batch)  # type: ignore[arg-type]
