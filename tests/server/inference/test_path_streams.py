"""The inference path's streams of a step-wise model: a call whose rows may each get their own
parameters runs them side by side, each step tagged with its row; any other stream carries one
row; a client that goes frees every one of its sequences. In process: a real registry and
StepServed, no server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest

from carpool.model import Model
from carpool.server.inference.call import NOT_WITHDRAWN, Answer, Call, Withdrawal
from carpool.server.inference.path import ClientGone, Inference
from carpool.server.lifecycle.registry import Registry
from carpool.server.messages import InferInput, InferRequest, ProtocolError
from carpool.stepwise import StepServed
from server.step_models import words

TEXTS = ["a b c", "d e", "f g h i"]


@pytest.fixture
async def inference() -> AsyncIterator[Inference]:
    path = Inference(Registry([words]))
    started = await path.registry.start()
    path.registry.ready = True
    yield path
    await path.registry.close(started, timeout=10.0)


def decode(model: Model, read: list[str]) -> InferRequest:
    data = np.array([[t.encode()] for t in read], dtype=object)
    tensor = InferInput("text_input", "BYTES", data.shape, data, {})
    return InferRequest(
        id=None, parameters={}, inputs=(tensor,), outputs=None, binary_data_output=False
    )


def encode(answer: Answer, read: list[str]) -> tuple[int, str]:
    ((tensor, _),) = answer.outputs
    return answer.index, tensor.data.reshape(-1)[0].decode()


def call(
    texts: list[str],
    each: Callable[[list[str], Any, int], Any] | None,
    withdrawal: Withdrawal = NOT_WITHDRAWN,
) -> Call[list[str], tuple[int, str]]:
    async def read() -> list[str]:
        return texts

    return Call(
        protocol="test",
        model="words",
        read=read,
        decode=decode,
        encode=encode,
        withdrawal=withdrawal,
        row_parameters=each,
    )


def delayed(read: list[str], parameters: Any, row: int) -> Any:
    return {**parameters, "delay_ms": row}  # each row its own parameters


async def test_a_call_with_row_parameters_streams_each_row_tagged(inference: Inference) -> None:
    got: list[tuple[int, str]] = []

    async def emit(step: tuple[int, str]) -> None:
        got.append(step)

    await inference.stream(call(TEXTS, delayed), emit)
    for index, text in enumerate(TEXTS):
        assert [word for i, word in got if i == index] == text.split()
    assert len(got) == 9
    (served,) = inference.registry
    assert served.statuses["test"] == {200: 1}  # one request, counted once


async def test_any_other_stream_carries_one_row(inference: Inference) -> None:
    async def emit(step: tuple[int, str]) -> None:
        raise AssertionError("nothing is emitted")

    with pytest.raises(ProtocolError, match="a streamed request carries one sequence"):
        await inference.stream(call(TEXTS, None), emit)


async def test_a_client_that_goes_frees_every_sequence(inference: Inference) -> None:
    went: list[Callable[[], None]] = []

    def client_gone(run: Callable[[], None]) -> Callable[[], None]:
        went.append(run)
        return lambda: None

    long = [" ".join(["w"] * 500)] * 3
    slow = {"delay_ms": 5}

    async def emit(step: tuple[int, str]) -> None:
        went[0]()  # the client leaves at the first step

    with pytest.raises(ClientGone):
        await inference.stream(
            call(long, lambda r, p, i: {**p, **slow}, Withdrawal(client_gone=client_gone)), emit
        )
    (served,) = inference.registry
    batcher = served.batcher
    assert isinstance(batcher, StepServed)
    for _ in range(2000):  # the next step frees them
        if batcher.steps.active == 0:
            break
        await asyncio.sleep(0.005)
    assert batcher.steps.active == 0
