"""What a step-wise model declares; carpool owns the loop that drives it.

Every step, one batched ``start`` takes the sequences that join, one batched ``step``
advances every active sequence together, and ``finished`` says who leaves.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

In = TypeVar("In")
State = TypeVar("State")
Out = TypeVar("Out")


@dataclass(frozen=True)
class PrefixCounts:
    """A replica's prompt-state reuse so far (cumulative): ``hits``, the sequences that reused
    state computed for an earlier one; ``reused`` and ``computed``, their prompt tokens whose
    state was reused, and computed."""

    hits: int = 0
    reused: int = 0
    computed: int = 0


class StepModel(ABC, Generic[In, State, Out]):
    """A model that answers in steps (a decoder, a sampler, any loop).

    ``start`` and ``step`` are batched: element i of the result belongs to element i of the
    argument. Returning an exception in place of a result fails that sequence alone;
    raising fails every sequence of the call. States never leave the replica they started on.
    ``start_chunk``: starts are paid in parts of this many tokens (the last part: what is
    left), so an engine whose floats depend on how a start was split gives the same answer
    however busy the steps were; 0 allows any split.
    """

    start_chunk: int = 0

    @abstractmethod
    def start(self, inputs: Sequence[In]) -> Sequence[State | BaseException]:
        """The states of the sequences that join at this step."""

    @abstractmethod
    def step(self, states: Sequence[State]) -> Sequence[Out | BaseException]:
        """Advance every active sequence one step: each one's output of this step."""

    def finished(self, state: State, output: Out) -> bool:
        """Whether the sequence ends with this output (it is delivered either way)."""
        return False

    def free(self, state: State) -> None:
        """Release what a sequence holds; called once for every state, however it ended."""

    def start_cost(self, state: State) -> int:
        """Start work (tokens) still owed before the state can step; 0 once it can.

        A model whose start is costly (a long prompt) returns it from ``start`` and lets
        ``prefill`` do it in parts, so the active sequences keep their pace."""
        return 0

    def prefill(
        self, states: Sequence[State], tokens: Sequence[int]
    ) -> Sequence[BaseException | None]:
        """Do ``tokens[i]`` more of ``states[i]``'s start work (only when ``start_cost`` > 0)."""
        raise NotImplementedError(f"{type(self).__name__} has start work but no prefill")

    def prefill_and_step(
        self, starts: Sequence[State], tokens: Sequence[int], ready: Sequence[State]
    ) -> tuple[Sequence[BaseException | None], Sequence[Out | BaseException]]:
        """``prefill(starts, tokens)``, then ``step`` of ``ready`` (those that owed no start
        work) followed by the starts it finished, in one call: an engine that overrides it
        can feed a step's prompt tokens and its next tokens in one pass (Sarathi's
        piggybacked prefill), paying a pass's fixed cost once. When it raises, carpool calls
        ``prefill`` and ``step`` apart for the tick, so a bad sequence fails alone: nothing
        it fed may be fed again."""
        raise NotImplementedError(f"{type(self).__name__} steps and prefills apart")

    def reuse_prefixes(self, budget_bytes: int) -> bool:
        """Keep prompts' computed state, within ``budget_bytes``, for later sequences whose
        prompts share a prefix (least recently used out first); False: this model cannot,
        and works without."""
        return False

    def prefix_counts(self) -> PrefixCounts | None:
        """What reuse has done so far on this replica; None when the model does not reuse."""
        return None
