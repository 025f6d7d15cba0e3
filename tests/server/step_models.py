"""Step-wise models the server tests serve: words of a text, one per step; prompts of
numbers, whose state is reused by later prompts that start with them."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from carpool.model import Batching, Tensor
from carpool.steps.model import PrefixCounts, StepModel
from carpool.stepwise import StepwiseModel


class Words(StepModel[tuple[list[str], float], list[Any], str]):
    """Input (words, seconds per step): one word per step, then the sequence ends."""

    def start(self, inputs: Sequence[tuple[list[str], float]]) -> list[list[Any]]:
        return [[list(words), delay] for words, delay in inputs]

    def step(self, states: Sequence[list[Any]]) -> list[str | BaseException]:
        time.sleep(max((s[1] for s in states), default=0.0))
        out: list[str | BaseException] = []
        for state in states:
            word = state[0].pop(0)
            broken = ValueError("the word 'boom' breaks its sequence")
            out.append(broken if word == "boom" else word)
        return out

    def finished(self, state: list[Any], output: str) -> bool:
        return not state[0]


def _request(row: Mapping[str, np.ndarray[Any, Any]], parameters: Mapping[str, Any]) -> Any:
    text = row["text_input"].reshape(-1)[0]
    text = text.decode() if isinstance(text, bytes) else str(text)
    delay = parameters.get("delay_ms", 0)
    if not isinstance(delay, int | float) or isinstance(delay, bool) or delay < 0:
        raise ValueError(f"delay_ms must be a number >= 0, got {delay!r}", "parameters.delay_ms")
    if not text.split():
        raise ValueError("text_input holds no word", "text_input")
    return text.split(), delay / 1000


def _response(word: str) -> dict[str, np.ndarray[Any, Any]]:
    return {"text_output": np.array([word.encode()], dtype=object)}


def _whole(words: list[str]) -> dict[str, np.ndarray[Any, Any]]:
    return {"text_output": np.array([" ".join(words).encode()], dtype=object)}


words = StepwiseModel(
    name="words",
    stepper=Words,
    request=_request,
    response=_response,
    whole=_whole,
    inputs=[Tensor("text_input", "BYTES", (1,))],
    outputs=[Tensor("text_output", "BYTES", (1,))],
    batching=Batching(max_batch_size=8),
    max_sequences=4,
)


class Prompts(StepModel[tuple[str, ...], str, str]):
    """Input: a prompt of words, each a token of one byte. It reuses the longest prompt seen
    before that starts the new one; its one output says the budget this replica was given,
    and the tokens it reused and computed (``budget=B reused=R computed=C``)."""

    def __init__(self) -> None:
        self.budget = 0
        self.seen: set[tuple[str, ...]] = set()  # the test stays far within the budget
        self.counts = PrefixCounts()

    def reuse_prefixes(self, budget_bytes: int) -> bool:
        self.budget = budget_bytes
        return True

    def prefix_counts(self) -> PrefixCounts:
        return self.counts

    def start(self, inputs: Sequence[tuple[str, ...]]) -> list[str]:
        states = []
        for prompt in inputs:
            reused = max((len(p) for p in self.seen if prompt[: len(p)] == p), default=0)
            computed = len(prompt) - reused
            c = self.counts
            self.counts = PrefixCounts(
                c.hits + bool(reused), c.reused + reused, c.computed + computed
            )
            self.seen.add(prompt)
            states.append(f"budget={self.budget} reused={reused} computed={computed}")
        return states

    def step(self, states: Sequence[str]) -> list[str]:
        return list(states)

    def finished(self, state: str, output: str) -> bool:
        return True


prompts = StepwiseModel(
    name="prompts",
    stepper=Prompts,
    request=lambda row, parameters: tuple(_request(row, parameters)[0]),
    response=_response,
    whole=_whole,
    inputs=[Tensor("text_input", "BYTES", (1,))],
    outputs=[Tensor("text_output", "BYTES", (1,))],
    batching=Batching(max_batch_size=8),
    max_sequences=4,
)
