"""A replica's ticks: who starts, who steps, who leaves, what the token budget buys, and a
failing sequence failing alone."""

from __future__ import annotations

import pytest

from carpool.steps.replica import StepReplica, Tick, allot
from steps.models import Counter, Faulty, Fused, Prompted


def test_allot_gives_oldest_first_and_splits_the_last() -> None:
    assert allot([5, 5, 5], 12) == [5, 5, 2]
    assert allot([5, 5], 3) == [3, 0]
    assert allot([5, 5], 0) == [0, 0]
    assert allot([5, 5], None) == [5, 5]


def test_allot_in_chunks_gives_one_part_a_step_however_busy() -> None:
    assert allot([10, 10], 12, chunk=4) == [4, 4]
    assert allot([10, 10], 5, chunk=4) == [4, 0]
    assert allot([25], None, chunk=4) == [4]  # the same parts with no budget at all
    assert allot([2, 10], 12, chunk=4) == [2, 4]  # a last part: what is left
    assert allot([25], 2, chunk=4) == [4]  # under a part of budget: the oldest gets one
    assert allot([3], 2, chunk=4) == [3]


def test_joiners_step_in_the_tick_they_join_and_leave_when_finished() -> None:
    model = Counter()
    replica = StepReplica(model)
    first = replica(Tick(joins=[(1, 2), (2, 1)]))
    assert first.outputs == [(1, 1), (2, 1)]
    assert first.ended == [2]
    assert model.freed == [1]  # state [1, 1] of input 1 -> freed once it finished
    second = replica(Tick(joins=[(3, 3)]))
    assert second.outputs == [(1, 2), (3, 1)]
    assert second.ended == [1]
    assert model.steps == [[2, 1], [2, 3]]
    assert len(replica) == 1


def test_leaves_are_freed_before_the_step() -> None:
    model = Counter()
    replica = StepReplica(model)
    replica(Tick(joins=[(1, 9), (2, 9)]))
    report = replica(Tick(leaves=[1]))
    assert report.outputs == [(2, 2)]
    assert model.freed == [9]
    replica.close()
    assert model.freed == [9, 9]


def test_a_step_that_raises_fails_the_bad_sequence_alone() -> None:
    model = Faulty(bad=7, at=2)
    replica = StepReplica(model)
    replica(Tick(joins=[(1, 3), (2, 7), (3, 3)]))
    report = replica(Tick())
    assert report.outputs == [(1, 2), (3, 2)]
    assert [(sid, str(error)) for sid, error in report.failed] == [(2, "input 7 fails at step 2")]
    assert len(replica) == 2


def test_a_step_giving_too_few_outputs_fails_its_sequences() -> None:
    class Short(Counter):
        def step(self, states):  # type: ignore[no-untyped-def]
            return super().step(states)[:-1]

    report = StepReplica(Short())(Tick(joins=[(1, 3), (2, 3)]))
    assert report.outputs == []
    assert [str(e) for _, e in report.failed] == ["2 sequences in, 1 results out"] * 2


def test_a_start_that_fails_for_one_input_fails_it_alone() -> None:
    class Picky(Counter):
        def start(self, inputs):  # type: ignore[no-untyped-def]
            if 0 in inputs:
                raise ValueError("0 is no length")
            return super().start(inputs)

    report = StepReplica(Picky())(Tick(joins=[(1, 2), (2, 0), (3, 1)]))
    assert report.outputs == [(1, 1), (3, 1)]
    assert [(sid, str(e)) for sid, e in report.failed] == [(2, "0 is no length")]


def test_the_budget_splits_a_long_start_over_steps_while_others_step() -> None:
    model = Prompted()
    replica = StepReplica(model)
    replica(Tick(joins=[(1, (0, 100))], budget=8))  # a sequence already stepping
    report = replica(Tick(joins=[(2, (20, 1))], budget=8))
    assert report.outputs == [(1, 2)]  # 2 is still starting
    assert report.prefilled == 7  # 8 tokens, one spent on sequence 1's step
    replica(Tick(budget=8))
    report = replica(Tick(budget=8))  # 7 + 7 + 6: its start is paid, it steps
    assert model.prefills == [[7], [7], [6]]
    assert report.outputs == [(1, 4), (2, 1)]
    assert report.ended == [2]


@pytest.mark.parametrize("budget", [None, 1000])
def test_without_a_tight_budget_a_start_is_paid_at_once(budget: int | None) -> None:
    model = Prompted()
    report = StepReplica(model)(Tick(joins=[(1, (30, 1)), (2, (5, 1))], budget=budget))
    assert model.prefills == [[30, 5]]
    assert report.outputs == [(1, 1), (2, 1)]


def test_a_model_that_fuses_prefills_and_steps_in_one_call_per_tick() -> None:
    """Its step covers the sequences ready before the tick, then the starts it finished; a
    tick with nobody ready (or no start) makes the plain calls."""
    model = Fused()
    replica = StepReplica(model)
    first = replica(Tick(joins=[(1, (4, 3))]))  # nobody ready: prefill, then step
    assert (model.fused, model.prefills, first.outputs) == ([], [[4]], [(1, 1)])
    report = replica(Tick(joins=[(2, (20, 2)), (3, (3, 1))], budget=8))
    assert model.fused == [([7], 1)]  # one call: 7 tokens of 2's start, 1's step
    assert report.outputs == [(1, 2)]
    report = replica(Tick())
    assert model.fused[-1] == ([13, 3], 1)  # both starts paid: they step in the call too
    assert report.outputs == [(1, 3), (2, 1), (3, 1)]
    assert report.ended == [1, 3]
    assert report.prefilled == 16
    report = replica(Tick())  # nobody starting: the plain step
    assert (len(model.fused), report.outputs, report.ended) == (2, [(2, 2)], [2])


def test_a_fused_call_that_raises_is_made_apart_and_the_ready_step_on() -> None:
    """Apart, the prefill raises again: its starts fail, as with a plain model."""
    model = Fused(bad=5)
    replica = StepReplica(model)
    replica(Tick(joins=[(1, (0, 3))]))
    report = replica(Tick(joins=[(2, (5, 1)), (3, (2, 1))]))
    assert model.fused == []
    assert [(sid, str(e)) for sid, e in report.failed] == [
        (2, "a 5-token prompt fails"),
        (3, "a 5-token prompt fails"),
    ]
    assert report.outputs == [(1, 2)]
    report = replica(Tick(joins=[(4, (2, 1))]))
    assert model.fused == [([2], 1)]
    assert report.outputs == [(1, 3), (4, 1)]
