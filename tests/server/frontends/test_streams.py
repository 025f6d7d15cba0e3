"""A step-wise model through carpool.server.frontends: the main process's hub over a real
StepServed, a front end's registry, linked by a real Unix socket pair on one loop.

A stream gets one output per step, then its end; a refused row crosses as its StepInputError
(a 400) naming its field; a model's error ends the stream typed; a cancelled stream, or a lost link,
frees the sequence's slot in the main process; rows are answered whole with their parameters;
the step statistics reach the front end; an output that cannot be sent ends its stream alone."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import numpy as np
import pytest

from carpool.errors import BatcherClosed
from carpool.model import Tensor
from carpool.server.frontends.hub import Hub
from carpool.server.frontends.remote import FrontEndRegistry, RemoteStepBatcher, Upstream
from carpool.server.frontends.tallies import Tallies
from carpool.server.lifecycle.registry import Registry
from carpool.steps.model import StepModel
from carpool.stepwise import StepInputError, StepServed, StepwiseModel
from server.step_models import words


class Unsendable(StepModel[int, int, Any]):
    """One output per sequence: a lock, which does not pickle."""

    def start(self, inputs: Sequence[int]) -> list[int]:
        return list(inputs)

    def step(self, states: Sequence[int]) -> list[Any]:
        return [threading.Lock() for _ in states]

    def finished(self, state: int, output: Any) -> bool:
        return True


unsendable = StepwiseModel(
    name="unsendable",
    stepper=Unsendable,
    request=lambda row, parameters: 1,
    response=lambda output: {"y": np.zeros(1, np.float32)},
    whole=lambda outputs: {"y": np.zeros(1, np.float32)},
    inputs=[Tensor("x", "FP32", (1,))],
    outputs=[Tensor("y", "FP32", (1,))],
)


class Setup:
    def __init__(self, main: Registry, hub: Hub, front: FrontEndRegistry) -> None:
        self.main = main
        self.hub = hub
        self.front = front

    @property
    def remote(self) -> RemoteStepBatcher:
        return self.remote_of("words")

    def remote_of(self, name: str) -> RemoteStepBatcher:
        batcher = self.front.get(name).batcher
        assert isinstance(batcher, RemoteStepBatcher)
        return batcher

    @property
    def served(self) -> StepServed:
        batcher = self.main.get("words").batcher
        assert isinstance(batcher, StepServed)
        return batcher


async def until(condition: Callable[[], bool], within_s: float = 10.0) -> None:
    """Until ``condition()`` holds, looking every millisecond; fails after ``within_s``."""
    for _ in range(int(within_s * 1000)):
        if condition():
            return
        await asyncio.sleep(0.001)
    pytest.fail(f"not true within {within_s:g} s")


@pytest.fixture
async def setup() -> AsyncIterator[Setup]:
    main = Registry([words, unsendable])
    started = await main.start()
    tallies = Tallies(["words", "unsendable"], 1)
    hub = Hub(main, tallies)
    ours, theirs = socket.socketpair()
    await hub.attach(1, ours, lambda index: None)
    front = FrontEndRegistry([words, unsendable], [], Upstream(), theirs, tallies.slot(1))
    await front.start()
    yield Setup(main, hub, front)
    await front.close(list(front), timeout=0)
    await main.close(started, timeout=1)
    hub.close()


def row(text: str) -> dict[str, Any]:
    return {"text_input": np.array([text.encode()], dtype=object)}


def long_text() -> str:
    return " ".join(f"w{i}" for i in range(2000))


async def test_a_stream_gets_one_output_per_step_then_its_end(setup: Setup) -> None:
    stream = setup.remote.stream(row("a b c"), {})
    with stream:
        assert [output async for output in stream] == ["a", "b", "c"]
    assert setup.served.stats().completed == 1
    await until(lambda: setup.hub.snapshot()[0]["words"][3][2] == 0)  # none aboard


async def test_a_refused_row_crosses_as_itself_naming_its_field(setup: Setup) -> None:
    stream = setup.remote.stream(row("a"), {"delay_ms": -1})
    with pytest.raises(StepInputError, match=r"delay_ms must be a number >= 0, got -1") as caught:
        await stream.collect()
    assert caught.value.field == "parameters.delay_ms"
    with pytest.raises(StepInputError, match="text_input holds no word") as whole:
        await setup.remote.infer_many({"text_input": np.array([[b" "]], dtype=object)})
    assert whole.value.field == "text_input"
    assert setup.served.stats().submitted == 0  # refused before it was a sequence


async def test_a_model_error_ends_the_stream_after_its_outputs(setup: Setup) -> None:
    stream = setup.remote.stream(row("a boom c"), {})
    assert await anext(stream) == "a"
    with pytest.raises(ValueError, match="the word 'boom' breaks its sequence"):
        await anext(stream)


async def test_a_cancelled_stream_frees_its_slot_in_the_main_process(setup: Setup) -> None:
    stream = setup.remote.stream(row(long_text()), {"delay_ms": 5})
    with stream:
        assert await anext(stream) == "w0"
        assert setup.served.steps.active == 1
    await until(lambda: setup.served.steps.active == 0)
    await until(lambda: setup.served.stats().cancelled == 1)
    assert setup.hub.snapshot()[0]["words"][3][2] == 0
    again = setup.remote.stream(row("ok"), {})
    assert await again.collect() == ["ok"]


async def test_a_lost_link_ends_every_stream_closed_and_frees_their_slots(setup: Setup) -> None:
    streams = [setup.remote.stream(row(long_text()), {"delay_ms": 5}) for _ in range(2)]
    for stream in streams:
        assert await anext(stream) == "w0"
    setup.hub.close()  # the main process is gone, as this front end sees it
    for stream in streams:
        with pytest.raises(BatcherClosed, match="lost the server's main process"):
            await stream.collect()
    await until(lambda: setup.served.steps.active == 0)
    with pytest.raises(BatcherClosed):
        await setup.remote.stream(row("a"), {}).collect()


async def test_rows_are_answered_whole_with_their_parameters(setup: Setup) -> None:
    xs = {"text_input": np.array([[b"x y z"], [b"p q"]], dtype=object)}
    out = await setup.remote.infer_many(xs, parameters={"delay_ms": 1})
    assert out["text_output"].tolist() == [[b"x y z"], [b"p q"]]
    assert setup.served.stats().completed == 2


async def test_the_step_statistics_reach_the_front_end(setup: Setup) -> None:
    remote = setup.remote
    assert await remote.stream(row("m n o"), {}).collect() == ["m", "n", "o"]
    await setup.front.refresh()
    assert remote.histograms.first_output.snapshot().count == 1
    assert remote.histograms.next_output.snapshot().count == 2
    stream = remote.stream(row(long_text()), {"delay_ms": 5})
    assert await anext(stream) == "w0"
    await setup.front.refresh()
    assert remote.steps.active == 1
    assert remote.steps.max_sequences == 4
    assert remote.histograms.first_output.snapshot().count == 2
    assert remote.stats().submitted == 2
    stream.cancel()
    await until(lambda: setup.served.steps.active == 0)
    await setup.front.refresh()
    assert remote.steps.active == 0


async def test_an_output_that_cannot_be_sent_ends_its_stream_alone(setup: Setup) -> None:
    stream = setup.remote_of("unsendable").stream({"x": np.zeros(1, np.float32)}, {})
    words_too = setup.remote.stream(row("still here"), {})
    with pytest.raises(TypeError, match=r"cannot pickle '_thread\.lock' object"):
        await stream.collect()
    assert await words_too.collect() == ["still", "here"]
