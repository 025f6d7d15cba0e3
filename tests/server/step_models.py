"""Step-wise models the server tests serve: words of a text, one per step."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from carpool.model import Batching, Tensor
from carpool.steps.model import StepModel
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
