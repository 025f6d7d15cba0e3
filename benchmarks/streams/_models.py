"""The scenario's step-wise models: a GPU-like step cost (a fixed part plus a part per
sequence, slept so the GIL is free, as an accelerator leaves it) and outputs that are a
function of the input alone, so every stream's outputs can be checked exactly."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from carpool.model import Batching, Tensor
from carpool.steps.model import StepModel
from carpool.stepwise import StepwiseModel

SPREAD = 1024  # output k of sequence ``key``: key * SPREAD + k (lengths stay below it)


def expected(key: int, length: int) -> list[int]:
    """The outputs of the sequence ``(key, length)``, in order."""
    return [key * SPREAD + k for k in range(1, length + 1)]


def lengths(count: int, mean: float, cap: int, seed: int) -> list[int]:
    """``count`` long-tailed lengths: geometric with ``mean``, capped at ``cap``, seeded."""
    rng = random.Random(seed)
    p = 1 / mean
    log_q = math.log1p(-p)
    return [min(int(math.log(1 - rng.random()) / log_q) + 1, cap) for _ in range(count)]


def step_seconds(fixed: float, per: float, sequences: int) -> float:
    return fixed + per * sequences if sequences else 0.0


class Synthetic(StepModel[tuple[int, int], list[int], int]):
    """Input ``(key, length)``: ``length`` outputs; each step sleeps ``fixed + per * n``.

    ``model_seconds`` sums the time spent inside ``start`` and ``step`` (the model's own)."""

    def __init__(self, fixed: float, per: float) -> None:
        self.fixed, self.per = fixed, per
        self.model_seconds = 0.0

    def start(self, inputs: Sequence[tuple[int, int]]) -> list[list[int]]:
        t = time.perf_counter()
        states = [[key, length, 0] for key, length in inputs]
        self.model_seconds += time.perf_counter() - t
        return states

    def step(self, states: Sequence[list[int]]) -> list[int]:
        t = time.perf_counter()
        if self.fixed or self.per:
            time.sleep(step_seconds(self.fixed, self.per, len(states)))
        outputs = []
        for s in states:
            s[2] += 1
            outputs.append(s[0] * SPREAD + s[2])
        self.model_seconds += time.perf_counter() - t
        return outputs

    def finished(self, state: list[int], output: int) -> bool:
        return state[2] >= state[1]


def held_batch(model: Synthetic, jobs: Sequence[tuple[int, int]]) -> Iterator[list[int | None]]:
    """Static batching's steps of ``jobs``: each step's outputs, one per member (None once
    it ended: it is no longer stepped), until the longest member ends."""
    states = model.start(jobs)
    live = list(range(len(states)))
    while live:
        row: list[int | None] = [None] * len(states)
        still = []
        for i, output in zip(live, model.step([states[i] for i in live]), strict=True):
            row[i] = output
            if not model.finished(states[i], output):
                still.append(i)
        live = still
        yield row


class Prompted(Synthetic):
    """Input ``(key, length, prompt)``: a start owing ``prompt`` tokens, paid by ``prefill``
    at ``per_token`` seconds a token (in the same step as the others' outputs)."""

    def __init__(self, fixed: float, per: float, per_token: float) -> None:
        super().__init__(fixed, per)
        self.per_token = per_token

    def start(self, inputs: Sequence[tuple[int, ...]]) -> list[list[int]]:
        return [[key, length, 0, prompt] for key, length, prompt in inputs]

    def start_cost(self, state: list[int]) -> int:
        return state[3]

    def prefill(self, states: Sequence[list[int]], tokens: Sequence[int]) -> list[None]:
        time.sleep(self.per_token * sum(tokens))
        for state, n in zip(states, tokens, strict=True):
            state[3] -= n
        return [None] * len(states)


def served(name: str, stepper: Callable[[], StepModel[Any, Any, int]], most: int) -> StepwiseModel:
    """A ``(key, length)`` step model as ``carpool serve`` serves it: inputs ``key`` and
    ``length`` (INT64), one ``value`` (INT64) a step, ``most`` sequences at a time."""
    return StepwiseModel(
        name=name,
        stepper=stepper,
        request=_request,
        response=_response,
        whole=_whole,
        inputs=[Tensor("key", "INT64", (1,)), Tensor("length", "INT64", (1,))],
        outputs=[Tensor("value", "INT64", (-1,))],
        batching=Batching(max_batch_size=8),
        max_sequences=most,
    )


def _request(row: Mapping[str, np.ndarray[Any, Any]], parameters: Mapping[str, Any]) -> Any:
    return int(row["key"].reshape(-1)[0]), int(row["length"].reshape(-1)[0])


def _response(output: int) -> dict[str, np.ndarray[Any, Any]]:
    return {"value": np.array([output], dtype=np.int64)}


def _whole(outputs: list[int]) -> dict[str, np.ndarray[Any, Any]]:
    return {"value": np.array(outputs, dtype=np.int64)}
