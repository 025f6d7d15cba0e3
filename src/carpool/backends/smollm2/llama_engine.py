"""SmolLM2 on llama.cpp as a step-wise model: one context holds every sequence's KV cells.

Each step is one ``llama_decode`` over every active sequence (its own seq_id and position);
prefill feeds chunks of several prompts in one decode. Sampling runs in numpy per sequence,
so a seed gives the same text whoever shares the step.
"""

from __future__ import annotations

import codecs
import ctypes
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import cast

import llama_cpp
import numpy as np
from llama_cpp.llama_chat_format import Jinja2ChatFormatter
from llama_cpp.llama_types import ChatCompletionRequestMessage

from carpool.backends.generation import FinishReason, Message, Piece, Prompt, StopText
from carpool.backends.smollm2.files import gguf_path
from carpool.errors import CarpoolError, ConfigError
from carpool.steps.model import StepModel

__all__ = ["LlamaDecodeError", "LlamaState", "SequencesFull", "SmolLM2Llama"]


class LlamaDecodeError(CarpoolError, RuntimeError):
    """``llama_decode`` refused a batch; ``code`` is its return value."""

    def __init__(self, code: int, tokens: int) -> None:
        super().__init__(f"llama_decode returned {code} for a batch of {tokens} tokens")
        self.code = code


class SequencesFull(CarpoolError, RuntimeError):
    """Every seq_id slot of the context is taken: free a sequence or raise max_sequences."""

    def __init__(self, max_sequences: int) -> None:
        super().__init__(f"all {max_sequences} sequences are active (max_sequences)")
        self.max_sequences = max_sequences


@dataclass(eq=False)
class LlamaState:
    """One sequence: its prompt tokens, its slot (seq_id) and how far it has gone."""

    prompt: Prompt
    tokens: list[int]
    slot: int | None
    rng: np.random.Generator
    stop: StopText
    fed: int = 0  # tokens in the KV cache: positions 0 .. fed - 1
    pending: int = 0  # the token the next step feeds
    generated: int = 0
    decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace")
    )


class SmolLM2Llama(StepModel[Prompt, LlamaState, Piece]):
    """SmolLM2-135M-Instruct (Q4_1 GGUF) in one llama.cpp context of ``max_sequences`` slots,
    each ``context`` tokens long. Flash attention and one KV stream per sequence (not a
    unified cache) are the defaults: then a sequence's logits do not depend on who shares
    its step, so greedy tokens and seeded samples match a lone run. ``flash_attn`` None lets
    llama.cpp choose."""

    def __init__(
        self,
        *,
        max_sequences: int = 16,
        context: int = 1024,
        n_threads: int = 1,
        n_batch: int = 1024,
        n_ubatch: int = 128,
        flash_attn: bool | None = True,
        unified_kv: bool = False,
        path: Path | None = None,
    ) -> None:
        for name, value in (("max_sequences", max_sequences), ("context", context)):
            if value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}")
        for name, value in (("n_threads", n_threads), ("n_ubatch", n_ubatch)):
            if value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}")
        if n_batch < max_sequences:
            raise ConfigError(f"n_batch must be >= max_sequences ({max_sequences}), got {n_batch}")
        self.max_sequences = max_sequences
        self.context = context
        quiet = logging.getLogger("llama-cpp-python")  # llama.cpp's log, printed at its level
        if quiet.level == logging.NOTSET:
            quiet.setLevel(logging.WARNING)
        llama_cpp.llama_backend_init()
        model_params = llama_cpp.llama_model_default_params()
        file = str(path or gguf_path()).encode()
        self._model = llama_cpp.llama_model_load_from_file(file, model_params)
        if self._model is None:
            raise ConfigError(f"llama.cpp cannot load {file.decode()}")
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = context * max_sequences
        params.n_seq_max = max_sequences
        params.n_batch = n_batch
        params.n_ubatch = min(n_ubatch, n_batch)
        params.n_threads = params.n_threads_batch = n_threads
        params.kv_unified = unified_kv
        params.flash_attn_type = {
            None: llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
            True: llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
            False: llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
        }[flash_attn]
        self._ctx = llama_cpp.llama_init_from_model(self._model, params)
        if self._ctx is None:
            llama_cpp.llama_model_free(self._model)
            raise ConfigError(f"llama.cpp cannot make a context of {params.n_ctx} tokens")
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self._n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self._n_batch = n_batch
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self._free_slots = list(range(max_sequences - 1, -1, -1))
        self._chat = Jinja2ChatFormatter(
            template=self._meta("tokenizer.chat_template"),
            eos_token=self._text(llama_cpp.llama_vocab_eos(self._vocab)),
            bos_token=self._text(llama_cpp.llama_vocab_bos(self._vocab)),
        )

    def close(self) -> None:
        """Free the context, the model and the batch (idempotent)."""
        if self._ctx is not None:
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self._ctx)
            llama_cpp.llama_model_free(self._model)
            self._ctx = None

    def __enter__(self) -> SmolLM2Llama:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- the StepModel ------------------------------------------------------------------

    def start(self, inputs: Sequence[Prompt]) -> Sequence[LlamaState | BaseException]:
        states: list[LlamaState | BaseException] = []
        for prompt in inputs:
            try:
                states.append(self._start_one(prompt))
            except (ValueError, SequencesFull) as error:
                states.append(error)
        return states

    def start_cost(self, state: LlamaState) -> int:
        return max(0, len(state.tokens) - 1 - state.fed)

    def prefill(
        self, states: Sequence[LlamaState], tokens: Sequence[int]
    ) -> Sequence[BaseException | None]:
        live = [(s, min(n, self.start_cost(s))) for s, n in zip(states, tokens, strict=True)]
        live = [(s, n) for s, n in live if s.slot is not None]
        if live:
            self._feed([s for s, _ in live], [n for _, n in live])
        return [None if s.slot is not None else _freed() for s in states]

    def step(self, states: Sequence[LlamaState]) -> Sequence[Piece | BaseException]:
        live = [s for s in states if s.slot is not None]
        owed = [s for s in live if self.start_cost(s) > 0]
        if owed:
            self._feed(owed, [self.start_cost(s) for s in owed])
        self._decode(
            np.array([s.pending for s in live]),
            np.array([s.fed for s in live]),
            [self._slot(s) for s in live],
            True,
        )
        pieces: list[Piece] = []
        for i, state in enumerate(live):
            state.fed += 1
            logits = np.ctypeslib.as_array(
                llama_cpp.llama_get_logits_ith(self._ctx, i), shape=(self._n_vocab,)
            )
            pieces.append(self._advance(state, logits))
        out = iter(pieces)
        return [next(out) if s.slot is not None else _freed() for s in states]

    def finished(self, state: LlamaState, output: Piece) -> bool:
        return output.finish_reason is not None

    def free(self, state: LlamaState) -> None:
        if state.slot is not None:
            llama_cpp.llama_memory_seq_rm(self._memory, state.slot, -1, -1)
            self._free_slots.append(state.slot)
            state.slot = None

    # -- starting -----------------------------------------------------------------------

    def _start_one(self, prompt: Prompt) -> LlamaState:
        if prompt.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {prompt.max_tokens}")
        if prompt.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {prompt.temperature}")
        if not 0 < prompt.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {prompt.top_p}")
        tokens = self.prompt_tokens(prompt)
        if not tokens:
            raise ValueError("the prompt has no tokens")
        if len(tokens) > self.context:
            raise ValueError(
                f"the prompt has {len(tokens)} tokens, over the context of {self.context} "
                "tokens per sequence"
            )
        if not self._free_slots:
            raise SequencesFull(self.max_sequences)
        slot = self._free_slots.pop()
        llama_cpp.llama_memory_seq_rm(self._memory, slot, -1, -1)
        return LlamaState(
            prompt=prompt,
            tokens=tokens,
            slot=slot,
            rng=np.random.default_rng(prompt.seed),
            stop=StopText(prompt.stop),
            pending=tokens[-1],
        )

    def prompt_tokens(self, prompt: Prompt) -> list[int]:
        """The prompt's tokens: its messages or its chat text under the GGUF's chat template,
        or its raw text."""
        if prompt.messages or prompt.chat:
            messages = prompt.messages or (Message("user", prompt.text),)
            rendered = self._chat(
                messages=[
                    cast(ChatCompletionRequestMessage, {"role": m.role, "content": m.content})
                    for m in messages
                ]
            )
            return self._tokenize(rendered.prompt, add_special=False)
        return self._tokenize(prompt.text, add_special=True)

    def _tokenize(self, text: str, *, add_special: bool) -> list[int]:
        data = text.encode()
        size = len(data) + 8
        buf = (llama_cpp.llama_token * size)()
        n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, size, add_special, True)
        if n < 0:
            size = -n
            buf = (llama_cpp.llama_token * size)()
            n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, size, add_special, True)
        return list(buf[:n])

    # -- decoding -----------------------------------------------------------------------

    def _slot(self, state: LlamaState) -> int:
        if state.slot is None:
            raise _freed()
        return state.slot

    def _feed(self, states: Sequence[LlamaState], counts: Sequence[int]) -> None:
        """Put ``counts[i]`` more prompt tokens of ``states[i]`` in the cache, in as few
        decodes (of at most n_batch tokens) as there is room for."""
        tokens = np.concatenate(
            [
                np.array(s.tokens[s.fed : s.fed + n], dtype=np.int32)
                for s, n in zip(states, counts, strict=True)
            ]
        )
        positions = np.concatenate(
            [np.arange(s.fed, s.fed + n) for s, n in zip(states, counts, strict=True)]
        )
        slots = [self._slot(s) for s, n in zip(states, counts, strict=True) for _ in range(n)]
        for begin in range(0, len(tokens), self._n_batch):
            end = begin + self._n_batch
            self._decode(tokens[begin:end], positions[begin:end], slots[begin:end], False)
        for state, n in zip(states, counts, strict=True):
            state.fed += n

    def _decode(
        self, tokens: np.ndarray, positions: np.ndarray, slots: Sequence[int], outputs: bool
    ) -> None:
        n = len(tokens)
        if n == 0:
            return
        batch = self._batch
        batch.n_tokens = n
        np.ctypeslib.as_array(batch.token, shape=(n,))[:] = tokens
        np.ctypeslib.as_array(batch.pos, shape=(n,))[:] = positions
        np.ctypeslib.as_array(batch.n_seq_id, shape=(n,))[:] = 1
        np.ctypeslib.as_array(batch.logits, shape=(n,))[:] = outputs
        for i, slot in enumerate(slots):
            batch.seq_id[i][0] = slot
        code = llama_cpp.llama_decode(self._ctx, batch)
        if code != 0:
            raise LlamaDecodeError(code, n)

    # -- sampling and text --------------------------------------------------------------

    def _advance(self, state: LlamaState, logits: np.ndarray) -> Piece:
        prompt = state.prompt
        token = sample(logits, prompt.temperature, prompt.top_p, state.rng)
        state.generated += 1
        state.pending = token
        first = len(state.tokens) if state.generated == 1 else 0
        if llama_cpp.llama_vocab_is_eog(self._vocab, token):
            text, reason = _finish(state, "", "stop")
            return Piece(text, finish_reason=reason, prompt_tokens=first)
        text, stopped = state.stop.feed(state.decoder.decode(self._bytes(token)))
        if stopped:
            return Piece(text, finish_reason="stop", prompt_tokens=first)
        if state.generated >= prompt.max_tokens or state.fed >= self.context:
            text, reason = _finish(state, text, "length")
            return Piece(text, finish_reason=reason, prompt_tokens=first)
        return Piece(text, prompt_tokens=first)

    def _bytes(self, token: int, *, special: bool = False) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, 64, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, -n, 0, special)
        return buf.raw[:n]

    def _text(self, token: int) -> str:
        return self._bytes(token, special=True).decode(errors="replace")

    def _meta(self, key: str) -> str:
        size = llama_cpp.llama_model_meta_val_str(self._model, key.encode(), None, 0)
        if size < 0:
            raise ConfigError(f"the GGUF has no {key}")
        buf = ctypes.create_string_buffer(size + 1)
        llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buf, size + 1)
        return buf.value.decode()


def _freed() -> ValueError:
    return ValueError("the sequence was freed: it can no longer prefill or step")


def sample(logits: np.ndarray, temperature: float, top_p: float, rng: np.random.Generator) -> int:
    """Greedy at temperature 0; else a draw from the softmax at ``temperature`` restricted to
    the smallest set of most likely tokens whose mass reaches ``top_p``."""
    if temperature == 0:
        return int(np.argmax(logits))
    scaled = logits / np.float32(temperature)
    probs = np.exp(scaled - scaled.max())
    nucleus = top_p * float(probs.sum(dtype=np.float64))
    order = _nucleus(probs, nucleus) if top_p < 1 else np.arange(len(probs))
    mass = np.cumsum(probs[order], dtype=np.float64)
    if top_p < 1:
        mass = mass[: int(np.searchsorted(mass, nucleus)) + 1]
    drawn = int(np.searchsorted(mass, rng.random() * mass[-1], side="right"))
    return int(order[min(drawn, len(mass) - 1)])


def _nucleus(probs: np.ndarray, nucleus: float) -> np.ndarray:
    """The most likely tokens, most likely first, at least until their mass reaches
    ``nucleus``: a partition finds them without sorting the whole vocabulary."""
    size = 64
    while size < len(probs):
        top = np.argpartition(-probs, size)[:size]
        if probs[top].sum(dtype=np.float64) >= nucleus:
            return top[np.argsort(-probs[top], kind="stable")]
        size *= 8
    return np.argsort(-probs, kind="stable")


def _finish(state: LlamaState, text: str, reason: FinishReason) -> tuple[str, FinishReason]:
    """The text still held (an unfinished UTF-8 character, a possible stop's beginning)."""
    more, stopped = state.stop.feed(state.decoder.decode(b"", final=True))
    if stopped:
        return text + more, "stop"
    return text + more + state.stop.flush(), reason
