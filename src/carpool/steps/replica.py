"""One replica's sequences, where its model lives: a tick frees leavers, starts joiners,
spends the step's token budget on unfinished starts, and steps every ready sequence once.

Only ids, inputs and outputs cross to the caller, so a tick is one call to a thread, a
child process or a Ray actor; the states stay here for their whole life.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from carpool.steps.model import PrefixCounts, StepModel

__all__ = ["StepReport", "StepReplica", "Tick", "allot"]


@dataclass(frozen=True)
class Tick:
    """What one step asks of a replica: who joins (id, input), who leaves, the token budget."""

    joins: Sequence[tuple[int, Any]] = ()
    leaves: Sequence[int] = ()
    budget: int | None = (
        None  # tokens this step may spend: one per stepping sequence, rest on starts
    )


@dataclass
class StepReport:
    """What one step gave: outputs by id, the ids that ended (their last output is among
    the outputs) and the ids that failed, with their errors; ``prefixes``, the replica's
    prompt-state reuse so far (None: its model does not reuse)."""

    outputs: list[tuple[int, Any]] = field(default_factory=list)
    ended: list[int] = field(default_factory=list)
    failed: list[tuple[int, BaseException]] = field(default_factory=list)
    stepped: int = 0  # sequences the step advanced
    prefilled: int = 0  # start tokens the step spent
    prefixes: PrefixCounts | None = None


def allot(costs: Sequence[int], budget: int | None, chunk: int = 0) -> list[int]:
    """Start tokens for each starting sequence, oldest first, out of ``budget`` (None: no
    bound). Without ``chunk``, a start too big for what is left takes what is left; with
    it, each start gets one part of ``chunk`` tokens a step (its last part: what is left)
    or waits, so its parts are the same however busy the step, and a step too tight for
    any part still gives the oldest start one."""
    given = []
    left = budget
    for cost in costs:
        want = min(cost, chunk) if chunk else cost
        if left is None:
            share = want
        elif chunk:
            share = want if want <= left else 0
        else:
            share = min(want, max(left, 0))
        given.append(share)
        if left is not None:
            left -= share
    if chunk and given and not any(given):
        given[0] = min(costs[0], chunk)
    return given


class StepReplica:
    """A StepModel's live sequences by id, advanced one tick at a time. With
    ``prefix_budget`` bytes (> 0) the model is asked once to reuse prompts' state within
    them; each report then carries its counts, if it does."""

    def __init__(self, model: StepModel[Any, Any, Any], prefix_budget: int = 0) -> None:
        self.model = model
        self._states: dict[int, Any] = {}  # in join order: the oldest start goes first
        # a model without start work never owes any: its states are all ready at once
        self._prefills = type(model).start_cost is not StepModel.start_cost
        self._fuses = type(model).prefill_and_step is not StepModel.prefill_and_step
        self.reuses = prefix_budget > 0 and bool(model.reuse_prefixes(prefix_budget))

    def __call__(self, tick: Tick) -> StepReport:
        report = StepReport()
        for sid in tick.leaves:
            self._free(sid)
        self._start(tick.joins, report)
        if self._prefills:
            self._prefill_and_step(tick.budget, report)
        else:
            self._step(list(self._states), report)
        if self.reuses:
            report.prefixes = self.model.prefix_counts()
        return report

    def _prefill_and_step(self, budget: int | None, report: StepReport) -> None:
        cost = self.model.start_cost
        owed = {sid: cost(state) for sid, state in self._states.items()}
        starting = [sid for sid, tokens in owed.items() if tokens > 0]
        ready = [sid for sid, tokens in owed.items() if tokens <= 0]
        left = None if budget is None else budget - len(ready)
        shares = allot([owed[sid] for sid in starting], left, self.model.start_chunk)
        chosen = [(sid, share) for sid, share in zip(starting, shares, strict=True) if share > 0]
        report.prefilled = sum(share for _, share in chosen)
        if not (self._fuses and chosen and ready and self._fused(chosen, ready, report)):
            self._prefill(chosen, report)
            self._step([sid for sid, state in self._states.items() if cost(state) == 0], report)

    def _fused(self, chosen: list[tuple[int, int]], ready: list[int], report: StepReport) -> bool:
        """The tick's prefill and step in one call; False when it raised (the caller then
        makes the two calls apart)."""
        held = self._states
        starts = [held[sid] for sid, _ in chosen]
        try:
            errors, outputs = self.model.prefill_and_step(
                starts, [share for _, share in chosen], [held[sid] for sid in ready]
            )
        except Exception:
            return False
        finished = [
            sid
            for (sid, _), error in zip(chosen, errors, strict=True)
            if error is None and self.model.start_cost(held[sid]) == 0
        ]
        for (sid, _), error in zip(chosen, errors, strict=True):
            if error is not None:
                self._fail(sid, error, report)
        stepped = [*ready, *finished]
        self._deliver(stepped, _one_each(list(outputs), len(stepped)), report)
        return True

    def __len__(self) -> int:
        return len(self._states)

    def close(self) -> None:
        for sid in list(self._states):
            self._free(sid)

    def _start(self, joins: Sequence[tuple[int, Any]], report: StepReport) -> None:
        if not joins:
            return
        results = _isolated(self.model.start, [value for _, value in joins])
        for (sid, _), state in zip(joins, results, strict=True):
            if isinstance(state, BaseException):
                report.failed.append((sid, state))
            else:
                self._states[sid] = state

    def _prefill(self, chosen: list[tuple[int, int]], report: StepReport) -> None:
        if not chosen:
            return
        states = [self._states[sid] for sid, _ in chosen]
        tokens = [share for _, share in chosen]
        try:
            errors: Sequence[BaseException | None] = self.model.prefill(states, tokens)
        except Exception as exc:  # the whole call failed: each start fails alone
            errors = [exc] * len(chosen)
        for (sid, _), error in zip(chosen, errors or [None] * len(chosen), strict=True):
            if error is not None:
                self._fail(sid, error, report)

    def _step(self, ready: list[int], report: StepReport) -> None:
        if ready:
            self._deliver(
                ready, _isolated(self.model.step, [self._states[sid] for sid in ready]), report
            )

    def _deliver(self, stepped: list[int], outputs: list[Any], report: StepReport) -> None:
        """Hand out a step's outputs; the sequences they finish (or fail) leave."""
        held = self._states
        states = [held[sid] for sid in stepped]
        report.stepped = len(stepped)
        delivered, finished = report.outputs, self.model.finished
        for sid, state, output in zip(stepped, states, outputs, strict=True):
            if isinstance(output, BaseException):
                self._fail(sid, output, report)
                continue
            delivered.append((sid, output))
            try:
                done = finished(state, output)
            except Exception as exc:
                self._fail(sid, exc, report)
                continue
            if done:
                report.ended.append(sid)
                self._free(sid)

    def _fail(self, sid: int, error: BaseException, report: StepReport) -> None:
        report.failed.append((sid, error))
        self._free(sid)

    def _free(self, sid: int) -> None:
        state = self._states.pop(sid, None)
        if state is not None:
            self.model.free(state)


def _isolated(call: Callable[[list[Any]], Sequence[Any]], items: list[Any]) -> list[Any]:
    """``call(items)``, or, when it raises for all of them, ``call([item])`` for each, so
    that one bad sequence fails alone (as a one-shot batch is split to find its bad row).
    The model must not have changed a state before raising (check inputs first)."""
    try:
        results = list(call(items))
    except Exception as exc:
        if len(items) == 1:
            return [exc]
        return [_isolated(call, [item])[0] for item in items]
    return _one_each(results, len(items))


def _one_each(results: list[Any], count: int) -> list[Any]:
    """``results``, when there is one for each of ``count`` sequences; else an error each."""
    if len(results) != count:
        return [ValueError(f"{count} sequences in, {len(results)} results out")] * count
    return results
