"""The llama.cpp engine of SmolLM2 against llama_cpp.Llama's own greedy completion, and its
sequences against each other: alone or batched, one-part or chunked prefill, a freed slot
reused. The model (and the reference) load once per module; the loop here is the smallest
one a StepModel needs: start, prefill what is owed, step until each finishes, free.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import llama_cpp
import pytest

from carpool.backends.generation import Message, Piece, Prompt
from carpool.backends.smollm2.files import gguf_path
from carpool.backends.smollm2.llama_engine import LlamaState, SequencesFull, SmolLM2Llama

SEQUENCES = 8
CONTEXT = 256
STORY = "Write a long story about a dragon who learns to bake bread."
OTHERS = (
    "Hi!",
    "List ten fruits, one per line, with a sentence about each of them.",
    "Explain in detail how a steam engine works, for a curious child who likes trains and "
    "asks many questions about pistons, boilers, coal and water.",
)


@dataclass
class Run:
    """What one sequence gave: its pieces, and the token each step sampled."""

    pieces: list[Piece] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.pieces)


@pytest.fixture(scope="module")
def model() -> Iterator[SmolLM2Llama]:
    with SmolLM2Llama(max_sequences=SEQUENCES, context=CONTEXT) as engine:
        yield engine


@pytest.fixture(scope="module")
def reference() -> llama_cpp.Llama:
    return llama_cpp.Llama(
        str(gguf_path()), n_ctx=CONTEXT, n_threads=1, flash_attn=True, verbose=False
    )


def drive(model: SmolLM2Llama, states: Sequence[LlamaState], chunk: int = 0) -> list[Run]:
    """Prefill (in parts of ``chunk`` tokens, or whole) then step every state to its end."""
    while owed := [s for s in states if model.start_cost(s) > 0]:
        parts = [chunk or model.start_cost(s) for s in owed]
        assert model.prefill(owed, parts) == [None] * len(owed)
    runs = {id(s): Run() for s in states}
    active = list(states)
    while active:
        outputs = model.step(active)
        for state, piece in zip(active, outputs, strict=True):
            assert isinstance(piece, Piece)
            runs[id(state)].pieces.append(piece)
            runs[id(state)].tokens.append(state.pending)
        done = [s for s, p in zip(active, outputs, strict=True) if model.finished(s, p)]
        for state in done:
            model.free(state)
        active = [s for s in active if s not in done]
    return [runs[id(s)] for s in states]


def started(model: SmolLM2Llama, prompts: Sequence[Prompt]) -> list[LlamaState]:
    states = model.start(prompts)
    assert all(isinstance(s, LlamaState) for s in states)
    return [s for s in states if isinstance(s, LlamaState)]


def generate(model: SmolLM2Llama, prompts: Sequence[Prompt], chunk: int = 0) -> list[Run]:
    return drive(model, started(model, prompts), chunk)


def greedy(text: str, max_tokens: int = 32, **options: object) -> Prompt:
    return Prompt(text, temperature=0, max_tokens=max_tokens, **options)  # type: ignore[arg-type]


def test_greedy_text_equals_llama_cpp_completion(
    model: SmolLM2Llama, reference: llama_cpp.Llama
) -> None:
    prompt = greedy(STORY, max_tokens=24)
    (run,) = generate(model, [prompt])
    expected = reference.create_completion(
        model.prompt_tokens(prompt), max_tokens=24, temperature=0.0, repeat_penalty=1.0
    )
    assert run.text == expected["choices"][0]["text"]
    assert [p.finish_reason for p in run.pieces] == [None] * 23 + ["length"]
    assert run.text == reference.detokenize(run.tokens).decode()


def test_greedy_tokens_alone_equal_batched_with_others(model: SmolLM2Llama) -> None:
    alone = generate(model, [greedy(STORY)])[0].tokens
    batched = generate(model, [greedy(OTHERS[0]), greedy(STORY), *map(greedy, OTHERS[1:])])
    assert batched[1].tokens == alone
    assert len(alone) == 32


def test_same_seed_same_text_alone_or_batched(model: SmolLM2Llama) -> None:
    def sampled(seed: int) -> Prompt:
        return Prompt(STORY, temperature=0.9, top_p=0.95, seed=seed, max_tokens=24)

    first = generate(model, [sampled(7)])[0].text
    again = generate(model, [sampled(7)])[0].text
    batched = generate(model, [sampled(8), greedy(OTHERS[2]), sampled(7)])
    assert again == first
    assert batched[2].text == first
    assert batched[0].text != first


def test_stop_string_split_across_tokens_ends_the_sequence_unreturned(
    model: SmolLM2Llama,
) -> None:
    full = generate(model, [greedy(STORY, max_tokens=40)])[0]
    texts = [p.text for p in full.pieces]
    k = next(i for i in range(5, len(texts) - 1) if len(texts[i]) >= 2 and len(texts[i + 1]) >= 2)
    stop = texts[k][-2:] + texts[k + 1][:2]
    (run,) = generate(model, [greedy(STORY, max_tokens=40, stop=("never there", stop))])
    assert run.text == full.text[: full.text.index(stop)]
    assert run.pieces[-1].finish_reason == "stop"
    assert stop not in run.text


def test_max_tokens_gives_length_with_exactly_that_many_tokens(model: SmolLM2Llama) -> None:
    prompt = greedy(STORY, max_tokens=5)
    (run,) = generate(model, [prompt])
    assert sum(p.tokens for p in run.pieces) == 5
    assert [p.finish_reason for p in run.pieces] == [None, None, None, None, "length"]
    assert [p.prompt_tokens for p in run.pieces] == [len(model.prompt_tokens(prompt))] + [0] * 4


def test_eos_ends_with_stop(model: SmolLM2Llama) -> None:
    (run,) = generate(model, [greedy("Say hello.", max_tokens=100)])
    assert run.pieces[-1].finish_reason == "stop"
    assert len(run.pieces) < 100
    assert "<|im_end|>" not in run.text


def test_chunked_prefill_equals_one_part(model: SmolLM2Llama) -> None:
    prompts = [greedy(OTHERS[2]), greedy(STORY)]
    whole = generate(model, prompts)
    chunked = generate(model, prompts, chunk=7)
    assert [r.tokens for r in chunked] == [r.tokens for r in whole]


def test_start_cost_is_the_prompt_less_its_last_token(model: SmolLM2Llama) -> None:
    prompt = greedy(STORY)
    (state,) = started(model, [prompt])
    assert model.start_cost(state) == len(model.prompt_tokens(prompt)) - 1
    assert model.prefill([state], [10]) == [None]
    assert model.start_cost(state) == len(model.prompt_tokens(prompt)) - 11
    model.free(state)


def test_a_freed_slot_serves_a_new_sequence_correctly(model: SmolLM2Llama) -> None:
    expected = generate(model, [greedy(OTHERS[1])])[0].tokens
    states = started(model, [greedy(STORY, max_tokens=100)] * SEQUENCES)
    drive_steps(model, states, 3)
    (full,) = model.start([greedy(OTHERS[1])])
    assert isinstance(full, SequencesFull)
    slot = states[3].slot
    model.free(states[3])
    (state,) = started(model, [greedy(OTHERS[1])])
    assert state.slot == slot
    assert drive(model, [state])[0].tokens == expected
    for other in states:
        model.free(other)


def drive_steps(model: SmolLM2Llama, states: Sequence[LlamaState], steps: int) -> None:
    for _ in range(steps):
        assert all(isinstance(p, Piece) for p in model.step(states))


def test_a_too_long_prompt_fails_alone(model: SmolLM2Llama) -> None:
    long = Prompt("word " * (CONTEXT + 10), chat=False, temperature=0, max_tokens=8)
    states = model.start([greedy(OTHERS[0], max_tokens=8), long, greedy(STORY, max_tokens=8)])
    error = states[1]
    assert isinstance(error, ValueError)
    assert f"context of {CONTEXT} tokens" in str(error)
    runs = drive(model, [s for s in states if isinstance(s, LlamaState)])
    assert runs[1].tokens == generate(model, [greedy(STORY, max_tokens=8)])[0].tokens


def test_chat_renders_the_gguf_template(model: SmolLM2Llama) -> None:
    def raw(text: str) -> list[int]:
        return model.prompt_tokens(Prompt(text, chat=False))

    system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    as_text = model.prompt_tokens(Prompt("Hi!"))
    as_messages = model.prompt_tokens(
        Prompt(messages=(Message("system", "Be brief."), Message("user", "Hi!")))
    )
    turn = "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    assert as_text == raw(f"<|im_start|>system\n{system}<|im_end|>\n{turn}")
    assert as_messages == raw(f"<|im_start|>system\nBe brief.<|im_end|>\n{turn}")


def test_a_freed_sequence_fails_alone_in_prefill_and_step(model: SmolLM2Llama) -> None:
    kept, freed = started(model, [greedy(STORY, max_tokens=4), greedy(OTHERS[1])])
    model.free(freed)
    cost = model.start_cost(kept)
    errors = model.prefill([freed, kept], [5, cost])
    assert isinstance(errors[0], ValueError)
    assert errors[1] is None
    outputs = model.step([freed, kept])
    assert isinstance(outputs[0], ValueError)
    assert "freed" in str(outputs[0])
    assert isinstance(outputs[1], Piece)
    model.free(kept)
