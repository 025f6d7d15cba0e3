"""Step-wise models for the tests: counters that say who stepped together, one that steps
only when the test lets it, so joins and leaves can be checked step by step, and one that
reuses prompts' state."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from carpool.steps.model import PrefixCounts, StepModel


class Counter(StepModel[int, list[int], int]):
    """Input n: outputs 1..n, one per step; ``steps`` records the inputs of each step."""

    def __init__(self) -> None:
        self.steps: list[list[int]] = []
        self.freed: list[int] = []

    def start(self, inputs: Sequence[int]) -> list[list[int]]:
        return [[n, 0] for n in inputs]

    def step(self, states: Sequence[list[int]]) -> list[int]:
        self.steps.append([s[0] for s in states])
        for s in states:
            s[1] += 1
        return [s[1] for s in states]

    def finished(self, state: list[int], output: int) -> bool:
        return output >= state[0]

    def free(self, state: list[int]) -> None:
        self.freed.append(state[0])


class Gated(Counter):
    """A Counter whose every step waits for ``release()``: the test decides when steps run."""

    def __init__(self) -> None:
        super().__init__()
        self._allowed = threading.Semaphore(0)
        self.entered = threading.Semaphore(0)

    def step(self, states: Sequence[list[int]]) -> list[int]:
        self.entered.release()
        assert self._allowed.acquire(timeout=10), "the test never released the step"
        return super().step(states)

    def release(self, steps: int = 1) -> None:
        for _ in range(steps):
            self._allowed.release()

    def wait_entered(self) -> None:
        assert self.entered.acquire(timeout=10), "no step started"


class Faulty(Counter):
    """A Counter that fails the sequence whose input is ``bad`` at its ``at``-th output, by
    raising for the whole step (the engine splits it to find the bad one)."""

    def __init__(self, bad: int, at: int) -> None:
        super().__init__()
        self.bad, self.at = bad, at

    def step(self, states: Sequence[list[int]]) -> list[int]:
        for s in states:
            if s[0] == self.bad and s[1] + 1 == self.at:
                raise ValueError(f"input {self.bad} fails at step {self.at}")
        return super().step(states)


class Prompted(StepModel[tuple[int, int], dict[str, Any], int]):
    """(prompt tokens, outputs): a start that owes prompt tokens, paid by ``prefill``."""

    def __init__(self) -> None:
        self.prefills: list[list[int]] = []

    def start(self, inputs: Sequence[tuple[int, int]]) -> list[dict[str, Any]]:
        return [{"owed": p, "left": n, "made": 0} for p, n in inputs]

    def start_cost(self, state: dict[str, Any]) -> int:
        return int(state["owed"])

    def prefill(self, states: Sequence[dict[str, Any]], tokens: Sequence[int]) -> list[None]:
        self.prefills.append(list(tokens))
        for state, n in zip(states, tokens, strict=True):
            state["owed"] -= n
        return [None] * len(states)

    def step(self, states: Sequence[dict[str, Any]]) -> list[int]:
        for s in states:
            s["made"] += 1
        return [s["made"] for s in states]

    def finished(self, state: dict[str, Any], output: int) -> bool:
        return output >= state["left"]


class Fused(Prompted):
    """Prompted that feeds a tick's prefill and step in one call (``prefill_and_step``); a
    start whose prompt is ``bad`` tokens long makes it raise, and ``prefill`` too."""

    def __init__(self, bad: int = -1) -> None:
        super().__init__()
        self.bad = bad
        self.fused: list[tuple[list[int], int]] = []  # (prefill tokens, sequences ready)

    def prefill_and_step(
        self,
        starts: Sequence[dict[str, Any]],
        tokens: Sequence[int],
        ready: Sequence[dict[str, Any]],
    ) -> tuple[list[None], list[int]]:
        if any(s["prompt"] == self.bad for s in starts):
            raise ValueError(f"a {self.bad}-token prompt fails the fused call")
        self.fused.append((list(tokens), len(ready)))
        for state, n in zip(starts, tokens, strict=True):
            state["owed"] -= n
        finished = [s for s in starts if not s["owed"]]
        return [None] * len(starts), self.step([*ready, *finished])

    def start(self, inputs: Sequence[tuple[int, int]]) -> list[dict[str, Any]]:
        states = super().start(inputs)
        return [{**state, "prompt": p} for state, (p, _) in zip(states, inputs, strict=True)]

    def prefill(self, states: Sequence[dict[str, Any]], tokens: Sequence[int]) -> list[Any]:
        if any(s["prompt"] == self.bad for s in states):
            raise ValueError(f"a {self.bad}-token prompt fails")
        return super().prefill(states, tokens)


class Reusing(StepModel[tuple[int, ...], dict[str, Any], tuple[int, int, int]]):
    """Prompts of ints, each state's tokens a byte: a prompt that starts with a stored one
    reuses its tokens. One output per sequence: (the budget this replica was given, the
    prompt tokens it reused, those it computed), so a test sees each replica's share."""

    def __init__(self) -> None:
        self.budget = 0
        self.store: OrderedDict[tuple[int, ...], None] = OrderedDict()  # least recent first
        self.counts = PrefixCounts()

    def reuse_prefixes(self, budget_bytes: int) -> bool:
        self.budget = budget_bytes
        return True

    def prefix_counts(self) -> PrefixCounts | None:
        return self.counts if self.budget else None

    def start(self, inputs: Sequence[tuple[int, ...]]) -> list[dict[str, Any]]:
        return [self._start(tuple(prompt)) for prompt in inputs]

    def _start(self, prompt: tuple[int, ...]) -> dict[str, Any]:
        reused = max((len(p) for p in self.store if prompt[: len(p)] == p), default=0)
        if reused:
            self.store.move_to_end(prompt[:reused])
        c = self.counts
        self.counts = PrefixCounts(
            c.hits + bool(reused), c.reused + reused, c.computed + len(prompt) - reused
        )
        if self.budget:
            self.store[prompt] = None
            while sum(map(len, self.store)) > self.budget:
                self.store.popitem(last=False)
        return {"reused": reused, "computed": len(prompt) - reused}

    def step(self, states: Sequence[dict[str, Any]]) -> list[tuple[int, int, int]]:
        return [(self.budget, s["reused"], s["computed"]) for s in states]

    def finished(self, state: dict[str, Any], output: tuple[int, int, int]) -> bool:
        return True
