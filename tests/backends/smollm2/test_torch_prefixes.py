"""The torch engine's prefix reuse: a sequence that reuses a prefix's state holds the very
floats a fresh prefill computes and generates the same tokens; counts exact, within budget;
and a decode step computes each sequence alone.

Prefill goes in the scheduler's parts (``start_chunk`` tokens, the last: the rest).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from carpool.backends.generation import Message, Piece, Prompt
from carpool.backends.smollm2.files import gguf_path
from carpool.backends.smollm2.served import default_engine
from carpool.backends.smollm2.torch_engine import SmolLM2Torch, TorchState
from carpool.backends.smollm2.weights import read_gguf
from carpool.steps.model import PrefixCounts
from carpool.steps.replica import StepReplica, Tick

pytestmark = pytest.mark.slow  # the model loads for seconds

SYSTEM = (
    "You are a careful assistant for a lighthouse museum. Answer in one or two sentences, "
    "plainly, without lists. The museum opens at nine and closes at five, every day but "
    "Monday. Tickets cost eight euros, children under twelve enter free, and the tower's "
    "two hundred and seventeen steps are closed in storms. The keeper's cottage shows the "
    "lamps, the logbooks and the fog horn of 1911. Guided tours leave from the gift shop at "
    "ten, at noon and at three; they last fifty minutes and end on the gallery, weather "
    "permitting. Dogs on a lead are welcome in the garden but not in the tower. The cafe "
    "serves soup, sandwiches and cakes from eleven to four, and the car park is free for "
    "visitors. Groups of more than fifteen people should book a week ahead by email."
)


def ask(question: str, max_tokens: int = 8) -> Prompt:
    messages = (Message("system", SYSTEM), Message("user", question))
    return Prompt(messages=messages, temperature=0, max_tokens=max_tokens)


WHEN = ask("When does the museum open?")
PRICE = ask("How much is a ticket?")


@pytest.fixture(scope="module")
def reader() -> Any:
    return read_gguf(gguf_path())


# The flavour this CPU serves by default (int8 on x86 with AVX2 and on arm, else fp32); the
# other flavour is checked once, below.
INT8 = default_engine() == "torch"


@pytest.fixture(scope="module")
def served(reader: Any) -> SmolLM2Torch:
    return SmolLM2Torch(reader=reader, int8=INT8)


@pytest.fixture
def engine(served: SmolLM2Torch) -> Any:
    yield served
    served.reuse_prefixes(0)


def prefilled(engine: SmolLM2Torch, prompts: Sequence[Prompt]) -> list[TorchState]:
    """Started together and prefilled in the scheduler's parts, every start each step."""
    states = [s for s in engine.start(prompts) if isinstance(s, TorchState)]
    assert len(states) == len(prompts)
    while owed := [s for s in states if engine.start_cost(s)]:
        parts = [min(engine.start_cost(s), engine.start_chunk) for s in owed]
        assert engine.prefill(owed, parts) == [None] * len(owed)
    return states


def generated(engine: SmolLM2Torch, states: Sequence[TorchState]) -> list[list[int]]:
    active = list(states)
    while active:
        going = []
        for state, piece in zip(active, engine.step(active), strict=True):
            assert isinstance(piece, Piece)
            if not engine.finished(state, piece):
                going.append(state)
        active = going
    for state in states:
        engine.free(state)
    return [s.tokens for s in states]


def prompt_kv(state: TorchState) -> torch.Tensor:
    assert state.cache is not None
    return state.cache.data[..., : len(state.ids) - 1, :].clone()


def fresh(engine: SmolLM2Torch, prompt: Prompt) -> tuple[torch.Tensor, list[int]]:
    """The prompt's prefill state and tokens with reuse off."""
    engine.reuse_prefixes(0)
    [state] = prefilled(engine, [prompt])
    kv = prompt_kv(state)
    return kv, generated(engine, [state])[0]


def shared_parts(engine: SmolLM2Torch, *prompts: Prompt) -> int:
    """Whole parts the prompts' prefills share, from the first."""
    owed = [engine.codec.prompt_ids(p)[:-1] for p in prompts]
    size, parts = engine.part_tokens, 0
    while all(len(o) >= (parts + 1) * size for o in owed) and all(
        o[: (parts + 1) * size] == owed[0][: (parts + 1) * size] for o in owed
    ):
        parts += 1
    return parts


def test_a_shared_prefix_is_reused_bit_for_bit(engine: SmolLM2Torch) -> None:
    parts = shared_parts(engine, WHEN, PRICE)
    assert parts >= 2
    kv, tokens = fresh(engine, PRICE)
    assert engine.prefix_counts() is None
    assert engine.reuse_prefixes(64 << 20)
    generated(engine, prefilled(engine, [WHEN]))
    [state] = engine.start([PRICE])
    assert isinstance(state, TorchState)
    assert state.fed == state.reused == parts * engine.part_tokens  # whole parts only
    while engine.start_cost(state):
        engine.prefill([state], [min(engine.start_cost(state), engine.start_chunk)])
    assert torch.equal(prompt_kv(state), kv)
    assert generated(engine, [state]) == [tokens]
    owed = len(engine.codec.prompt_ids(WHEN)) + len(state.ids) - 2
    assert engine.prefix_counts() == PrefixCounts(1, state.reused, owed - state.reused)


def test_a_repeated_prompt_skips_its_prefill(engine: SmolLM2Torch) -> None:
    kv, tokens = fresh(engine, WHEN)
    engine.reuse_prefixes(64 << 20)
    assert generated(engine, prefilled(engine, [WHEN])) == [tokens]
    [again] = engine.start([dataclasses.replace(WHEN, seed=5)])
    assert isinstance(again, TorchState)
    assert engine.start_cost(again) == 0
    assert torch.equal(prompt_kv(again), kv)
    assert generated(engine, [again]) == [tokens]
    owed = len(again.ids) - 1
    assert engine.prefix_counts() == PrefixCounts(hits=1, reused=owed, computed=owed)


def test_n_identical_prompts_compute_it_once(engine: SmolLM2Torch) -> None:
    _, tokens = fresh(engine, PRICE)
    engine.reuse_prefixes(64 << 20)
    states = prefilled(engine, [PRICE] * 3)
    # the first fed the last prompt token with its prefill; the others took its logits
    assert [s.first is not None for s in states] == [True, INT8, INT8]
    assert generated(engine, states) == [tokens] * 3
    owed = len(states[0].ids) - 1
    assert engine.prefix_counts() == PrefixCounts(hits=2, reused=2 * owed, computed=owed)


def test_later_starts_pick_up_parts_stored_since(engine: SmolLM2Torch) -> None:
    """The scheduler gives one part a step (the oldest start first): the second and third
    sequences find the first one's parts stored by the time their turn comes."""
    _, tokens = fresh(engine, PRICE)
    engine.reuse_prefixes(64 << 20)
    replica = StepReplica(engine)
    report = replica(Tick(joins=[(i, PRICE) for i in range(3)], budget=engine.start_chunk))
    outputs: dict[int, list[Piece]] = {i: [] for i in range(3)}
    while True:
        for sid, piece in report.outputs:
            outputs[sid].append(piece)
        if not len(replica):
            break
        report = replica(Tick(budget=engine.start_chunk + 3))
    texts = {"".join(p.text for p in pieces) for pieces in outputs.values()}
    assert texts == {engine.codec.decode(tokens)}
    owed = len(engine.codec.prompt_ids(PRICE)) - 1
    assert engine.prefix_counts() == PrefixCounts(hits=2, reused=2 * owed, computed=owed)


def test_eviction_keeps_the_budget_and_the_first_parts(engine: SmolLM2Torch) -> None:
    c = engine.config
    part = engine.part_tokens * c.layers * 2 * c.kv_heads * c.head_dim * 4
    _, tokens = fresh(engine, PRICE)
    engine.reuse_prefixes(part + part // 2)  # one whole part, never two
    generated(engine, prefilled(engine, [WHEN]))
    store = engine._store
    assert store is not None
    assert (len(store), store.used) == (1, part)  # the first part: later ones need it
    [state] = prefilled(engine, [PRICE])
    assert state.reused == engine.part_tokens
    assert generated(engine, [state]) == [tokens]
    assert store.used <= store.budget


def test_budget_zero_is_off(engine: SmolLM2Torch) -> None:
    assert not engine.reuse_prefixes(0)
    states = prefilled(engine, [WHEN, WHEN])
    assert [s.reused for s in states] == [0, 0]
    assert engine.prefix_counts() is None
    assert engine._store is None


def test_the_other_flavour_reuses_too(reader: Any) -> None:
    other = SmolLM2Torch(reader=reader, int8=not INT8)
    kv, tokens = fresh(other, PRICE)
    other.reuse_prefixes(64 << 20)
    generated(other, prefilled(other, [WHEN]))
    [state] = prefilled(other, [PRICE])
    assert state.reused == shared_parts(other, WHEN, PRICE) * other.part_tokens
    assert torch.equal(prompt_kv(state), kv)
    assert generated(other, [state]) == [tokens]


def test_a_decode_step_is_alone_whoever_shares_it(engine: SmolLM2Torch) -> None:
    """Sixteen sequences of other lengths step together (one attention call each, the views
    made once a step): the first one's tokens are the ones it gets alone."""
    first = ask("Is the tower open in storms?", max_tokens=12)
    others = [Prompt(f"Count to {i}.", temperature=0, max_tokens=4 + i) for i in range(15)]
    [alone] = generated(engine, prefilled(engine, [first]))
    assert generated(engine, prefilled(engine, [first, *others]))[0] == alone


def test_prompts_sharing_only_the_chat_template_reuse_its_opening(engine: SmolLM2Torch) -> None:
    """Two unrelated questions share the template's opening (its default system message and
    the user's tag): the second reuses its whole parts, bit for bit, and computes the rest."""
    first = Prompt("Explain glaciers to a sailor.", temperature=0, max_tokens=6)
    second = Prompt("Why is the sky blue?", temperature=0, max_tokens=6)
    kv, tokens = fresh(engine, second)
    engine.reuse_prefixes(64 << 20)
    generated(engine, prefilled(engine, [first]))
    [state] = prefilled(engine, [second])
    shared = shared_parts(engine, first, second) * engine.part_tokens
    assert shared == (24 if INT8 else 0)  # int8's parts are 8 tokens; fp32's 64
    assert state.reused == shared
    assert torch.equal(prompt_kv(state), kv)
    assert generated(engine, [state]) == [tokens]
    owed = len(engine.codec.prompt_ids(first)) + len(state.ids) - 2
    assert engine.prefix_counts() == PrefixCounts(int(INT8), shared, owed - shared)


def test_a_repeated_prompt_only_samples_its_first_token(
    engine: SmolLM2Torch, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same prompt again finds its last token's state and logits kept too (int8, whose
    rows are the same floats in any batch): its first step runs no weight pass, and its
    tokens are the ones a fresh prefill gives. fp32 feeds that token again."""
    _, tokens = fresh(engine, WHEN)
    engine.reuse_prefixes(64 << 20)
    generated(engine, prefilled(engine, [WHEN]))
    [again] = engine.start([WHEN])
    assert isinstance(again, TorchState)
    assert engine.start_cost(again) == 0
    assert again.cache is not None
    assert again.cache.length == len(again.ids) - (not INT8)
    passes: list[Any] = []
    forward = engine._forward

    def counted(*args: Any) -> Any:
        passes.append(args[1])
        return forward(*args)

    monkeypatch.setattr(engine, "_forward", counted)
    [piece] = engine.step([again])
    assert passes == ([[]] if INT8 else [[[again.ids[-1]]]])
    assert isinstance(piece, Piece)
    monkeypatch.undo()
    assert generated(engine, [again]) == [tokens]
