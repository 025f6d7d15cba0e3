"""The packed torch engine against transformers' llama on the same GGUF, token for token, and
its sequences against themselves: alone or batched, in one prefill or in parts, by seed.

The engine and the reference load once per module (seconds each, on a loaded box more).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import gguf
import pytest
import torch

from carpool.backends.generation import Message, Piece, Prompt
from carpool.backends.smollm2.files import gguf_path
from carpool.backends.smollm2.text import Detokenizer
from carpool.backends.smollm2.torch_engine import SmolLM2Torch, TorchState
from carpool.backends.smollm2.weights import read_gguf
from carpool.steps.replica import StepReplica, Tick

pytestmark = pytest.mark.slow  # the model loads for seconds

GREEDY = Prompt("Write a short story about a lighthouse keeper.", temperature=0, max_tokens=20)
FRANCE = Prompt("What is the capital of France?", temperature=0, max_tokens=20)


@pytest.fixture(scope="module")
def reader() -> Any:
    return read_gguf(gguf_path())


@pytest.fixture(scope="module")
def engine(reader: Any) -> SmolLM2Torch:
    return SmolLM2Torch(threads=1, reader=reader)


# GGUF's tensor names, as transformers' llama names them.
_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def reference_model(reader: Any, engine: SmolLM2Torch) -> Any:
    """transformers' llama with the GGUF's tensors as its own GGUF loader processes them
    (q and k un-permuted by ``LlamaTensorProcessor``)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    c = engine.config
    assert (c.layers, c.hidden, c.heads, c.kv_heads, c.vocab) == (30, 576, 9, 3, 49152)
    config = LlamaConfig(
        vocab_size=c.vocab,
        hidden_size=c.hidden,
        intermediate_size=c.ffn,
        num_hidden_layers=c.layers,
        num_attention_heads=c.heads,
        num_key_value_heads=c.kv_heads,
        rms_norm_eps=c.rms_eps,
        rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta},
        max_position_embeddings=c.context,
        tie_word_embeddings=True,
    )
    processor = LlamaTensorProcessor(
        config={"num_attention_heads": c.heads, "num_key_value_heads": c.kv_heads}
    )
    tensors = {}
    for tensor in reader.tensors:
        array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        weights = processor.process(weights=array, name=tensor.name).weights
        block, _, rest = tensor.name.partition(".")
        if block == "blk":
            index, kind, _ = rest.split(".")
            name = f"model.layers.{index}.{_NAMES[kind]}.weight"
        else:
            name = {"token_embd": "model.embed_tokens", "output_norm": "model.norm"}[block]
            name += ".weight"
        tensors[name] = torch.tensor(weights)
    model = LlamaForCausalLM(config)
    assert model.load_state_dict(tensors, strict=False).missing_keys == ["lm_head.weight"]
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied
    return model.eval()


def run(
    engine: SmolLM2Torch, prompts: Sequence[Prompt], chunk: int | None = None
) -> list[tuple[TorchState, list[Piece]]]:
    """Generate every prompt together to its end: prefill in parts of ``chunk`` tokens (all
    at once when None), then step the ones still going."""
    states = [s for s in engine.start(prompts) if isinstance(s, TorchState)]
    assert len(states) == len(prompts)
    while any(engine.start_cost(s) for s in states):
        owed = [s for s in states if engine.start_cost(s)]
        assert engine.prefill(owed, [chunk or engine.start_cost(s) for s in owed]) == [None] * len(
            owed
        )
    pieces: dict[int, list[Piece]] = {id(s): [] for s in states}
    active = list(states)
    while active:
        going = []
        for state, piece in zip(active, engine.step(active), strict=True):
            assert isinstance(piece, Piece)
            pieces[id(state)].append(piece)
            if not engine.finished(state, piece):
                going.append(state)
        active = going
    for state in states:
        engine.free(state)
    return [(s, pieces[id(s)]) for s in states]


def text(pieces: Sequence[Piece]) -> str:
    return "".join(p.text for p in pieces)


def test_greedy_matches_transformers(reader: Any, engine: SmolLM2Torch) -> None:
    reference = reference_model(reader, engine)
    [(state, pieces)] = run(engine, [GREEDY])
    with torch.inference_mode():
        ids = torch.tensor([state.ids])
        produced = reference.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, do_sample=False
        )
    assert len(state.tokens) >= 16
    assert state.tokens == produced[0, len(state.ids) :].tolist()
    assert text(pieces) == engine.codec.decode(state.tokens)


def test_batched_tokens_equal_alone(engine: SmolLM2Torch) -> None:
    prompts = [
        dataclasses.replace(GREEDY, max_tokens=10),
        Prompt("hi", temperature=0, max_tokens=10),
        Prompt("Once upon a time", chat=False, temperature=0, max_tokens=10),
    ]
    assert len({len(engine.codec.prompt_ids(p)) for p in prompts}) == 3
    alone = [run(engine, [p])[0][0].tokens for p in prompts]
    together = [s.tokens for s, _ in run(engine, prompts)]
    assert together == alone


def test_chunked_prefill_equals_one_part(engine: SmolLM2Torch) -> None:
    prompts = [dataclasses.replace(GREEDY, max_tokens=8), dataclasses.replace(FRANCE, max_tokens=8)]
    whole = [s.tokens for s, _ in run(engine, prompts)]
    parts = [s.tokens for s, _ in run(engine, prompts, chunk=3)]
    assert parts == whole


def test_seed_repeats_sampled_text(engine: SmolLM2Torch) -> None:
    sampled = Prompt("Tell me a joke.", temperature=0.9, top_p=0.95, seed=7, max_tokens=16)
    other = Prompt("Name a color.", temperature=1.0, seed=3, max_tokens=16)
    [(_, alone)] = run(engine, [sampled])
    (_, batched), _ = run(engine, [sampled, other])
    [(_, reseeded)] = run(engine, [dataclasses.replace(sampled, seed=8)])
    assert text(alone) == text(batched)
    assert text(reseeded) != text(alone)


def test_stop_string_ends_before_it(engine: SmolLM2Torch) -> None:
    [(_, pieces)] = run(engine, [FRANCE])
    assert text(pieces) == "The capital of France is Paris."
    assert pieces[-1].finish_reason == "stop"  # <|im_end|>
    for stop in ("France", "capital of"):  # "capital of" spans two tokens
        [(_, stopped)] = run(engine, [dataclasses.replace(FRANCE, stop=(stop, "zebra"))])
        assert stopped[-1].finish_reason == "stop"
        assert text(stopped) == text(pieces).split(stop)[0]
        assert all(p.finish_reason is None for p in stopped[:-1])


def test_max_tokens_gives_length(engine: SmolLM2Torch) -> None:
    [(state, pieces)] = run(engine, [dataclasses.replace(GREEDY, max_tokens=5)])
    assert [p.finish_reason for p in pieces] == [None] * 4 + ["length"]
    assert len(state.tokens) == sum(p.tokens for p in pieces) == 5
    assert [p.prompt_tokens for p in pieces] == [len(state.ids)] + [0] * 4


def test_chat_template_frames_the_prompt(engine: SmolLM2Torch) -> None:
    codec = engine.codec
    [state] = engine.start([FRANCE])
    assert isinstance(state, TorchState)
    rendered = (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert state.ids == codec.encode(rendered)
    assert state.ids[:2] == [1, codec.encode("system")[0]]  # <|im_start|> is one token
    assert engine.start_cost(state) == len(state.ids) - 1
    engine.free(state)
    messages = (Message("system", "Be brief."), Message("user", "Hi"))
    [framed] = engine.start([Prompt(messages=messages)])
    assert isinstance(framed, TorchState)
    expected = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    assert framed.ids == codec.encode(expected + "<|im_start|>assistant\n")
    [raw] = engine.start([Prompt("Hi there", chat=False)])
    assert isinstance(raw, TorchState)
    assert raw.ids == codec.encode("Hi there")


def test_detokenizer_never_splits_a_character(engine: SmolLM2Torch) -> None:
    sample = "日本語 😀 café"
    ids = engine.codec.encode(sample)
    assert len(ids) > len(sample.split())  # some characters span several tokens
    detokenizer = Detokenizer(engine.codec.token_bytes)
    deltas = [detokenizer.feed(i) for i in ids]
    assert "".join(deltas) + detokenizer.flush() == sample
    assert all("\ufffd" not in d for d in deltas)


def test_bad_prompts_fail_alone(engine: SmolLM2Torch) -> None:
    results = engine.start(
        [Prompt("", chat=False), Prompt("x", max_tokens=0), Prompt("x", top_p=0), FRANCE]
    )
    assert [type(r) for r in results] == [ValueError, ValueError, ValueError, TorchState]
    [freed, kept] = engine.start([FRANCE, FRANCE])
    assert isinstance(freed, TorchState)
    assert isinstance(kept, TorchState)
    engine.free(freed)
    outcome = engine.prefill([freed, kept], [4, 4])
    assert isinstance(outcome[0], ValueError)
    assert outcome[1] is None
    assert engine.start_cost(kept) == len(kept.ids) - 5
    for state in (results[3], kept):
        engine.free(state)  # type: ignore[arg-type]


def test_int8_answers_and_batches_alike(reader: Any) -> None:
    """Each token is quantized with its own scale, so its neighbours in a batch never change
    it. (Prefill in other parts changes attention's float rounding, which int8 can amplify
    into another token: chunking is left out here.)"""
    int8 = SmolLM2Torch(reader=reader, int8=True)
    [(_, pieces)] = run(int8, [FRANCE])
    assert text(pieces) == "The capital of France is Paris."
    prompts = [dataclasses.replace(GREEDY, max_tokens=6), Prompt("hi", temperature=0, max_tokens=6)]
    alone = [run(int8, [p])[0][0].tokens for p in prompts]
    assert [s.tokens for s, _ in run(int8, prompts)] == alone


@pytest.mark.parametrize("int8", [False, True])
def test_the_last_prompt_token_rides_with_the_prefill(
    reader: Any, engine: SmolLM2Torch, int8: bool
) -> None:
    """The prefill that ends a prompt feeds its last token too, as a span of its own in the
    same products: the logits are the ones a separate first step computes (bit for bit in
    int8), and that first step runs no weight pass of its own."""
    model = SmolLM2Torch(reader=reader, int8=True) if int8 else engine
    [folded, apart] = model.start([GREEDY, GREEDY])
    assert isinstance(folded, TorchState)
    assert isinstance(apart, TorchState)
    assert model.prefill([folded], [model.start_cost(folded)]) == [None]
    assert folded.cache is not None
    assert folded.cache.length == len(folded.ids)
    owed, size = apart.ids[:-1], model.part_tokens  # the prompt's own split
    parts = [owed[i : i + size] for i in range(0, len(owed), size)]
    with torch.inference_mode():
        model._forward([apart] * len(parts), parts, False)
        alone = model._forward([apart], [[apart.ids[-1]]], True)
    assert folded.first is not None
    if int8:  # integer products: a row's result is the same in any batch
        assert torch.equal(folded.first, alone[0])
    else:  # numpy's BLAS sums a lone row (gemv) in another order than a matrix's rows
        assert torch.allclose(folded.first, alone[0], rtol=1e-4, atol=1e-4)
    passes: list[Any] = []
    forward = model._forward

    def counted(*args: Any) -> Any:
        passes.append(args[1])
        return forward(*args)

    model._forward = counted  # type: ignore[method-assign]
    try:
        [piece] = model.step([folded])
    finally:
        del model._forward
    assert passes == [[]]
    assert isinstance(piece, Piece)
    assert folded.tokens == [int(alone[0].argmax())]
    for state in (folded, apart):
        model.free(state)


def test_a_tick_feeds_its_prompts_and_its_steps_in_one_pass(reader: Any) -> None:
    """int8 through a replica: sequences that join while others step get the very tokens
    they get alone, and every tick, joins or not, runs one weight pass."""
    int8 = SmolLM2Torch(reader=reader, int8=True)
    prompts = [dataclasses.replace(p, max_tokens=6) for p in (GREEDY, FRANCE)]
    prompts.append(Prompt("hi", temperature=0, max_tokens=6))
    alone = [run(int8, [p])[0][0].tokens for p in prompts]
    started: list[TorchState] = []
    passes: list[int] = []
    start, forward = int8.start, int8._forward

    def starting(inputs: Sequence[Prompt]) -> Any:
        states = start(inputs)
        started.extend(s for s in states if isinstance(s, TorchState))
        return states

    def counted(states: Any, chunks: Sequence[Sequence[int]], logits: Any) -> Any:
        if any(chunks):
            passes.append(sum(map(len, chunks)))
        return forward(states, chunks, logits)

    int8.start, int8._forward = starting, counted  # type: ignore[method-assign]
    replica = StepReplica(int8)
    joins = {0: [(0, prompts[0])], 2: [(1, prompts[1])], 3: [(2, prompts[2])]}
    ended: list[int] = []
    busy = 0  # ticks with a sequence to start or step
    for tick in range(12):
        busy += bool(len(replica) or tick in joins)
        ended += replica(Tick(joins=joins.get(tick, ()))).ended
    assert sorted(ended) == [0, 1, 2]
    assert [s.tokens for s in started] == alone
    assert len(passes) == busy
    assert passes[2] == 1 + len(started[1].ids)  # 0's next token, 1's whole prompt
