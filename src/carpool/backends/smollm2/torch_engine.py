"""SmolLM2 as a packed torch decoder: every step's new tokens, of every sequence, are one
[tokens, hidden] matrix for the matrix products (Orca's selective batching), and attention
runs per sequence against its own KV cache, so caches need no padding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from threadpoolctl import threadpool_limits
from torch.nn import functional

from carpool.backends.generation import FinishReason, Piece, Prompt, StopText
from carpool.backends.prefixes import PrefixStore, final_key, part_keys
from carpool.backends.smollm2.attention import PassAttention, Span
from carpool.backends.smollm2.files import gguf_path
from carpool.backends.smollm2.kv_cache import KVCache
from carpool.backends.smollm2.products import Fp32Linear, Int8Linear
from carpool.backends.smollm2.sampling import Sampler, pick
from carpool.backends.smollm2.text import Detokenizer, TextCodec
from carpool.backends.smollm2.weights import LlamaConfig, LlamaWeights, load_weights, read_gguf
from carpool.steps.model import PrefixCounts, StepModel

__all__ = ["KVCache", "SmolLM2Torch", "TorchState"]


@dataclass(eq=False)
class TorchState:
    """One sequence: its prompt's tokens, its cache, and what it has generated."""

    prompt: Prompt
    ids: list[int]
    sampler: Sampler
    text: Detokenizer
    stop: StopText
    cache: KVCache | None
    pending: int  # the token the next step feeds
    fed: int = 0  # prompt tokens prefilled (all but the last, which rides along or steps)
    tokens: list[int] = field(default_factory=list)  # generated so far
    done: bool = False
    keys: list[bytes] = field(default_factory=list)  # its prefill parts' (when reusing)
    reused: int = 0  # prompt tokens whose state it reused
    first: torch.Tensor | None = None  # logits of the token the next step feeds, once fed


class SmolLM2Torch(StepModel[Prompt, TorchState, Piece]):
    """SmolLM2-135M-Instruct from its GGUF, dequantized to fp32, on the CPU.

    ``threads``: torch's intra-op threads and numpy's BLAS threads (process-wide; one by
    default, one core per replica).
    ``reader``: the GGUF already open (a ``gguf.GGUFReader``), else the shipped one is read.
    ``int8``: the matrix products in integers (7-bit weights per output row, 8-bit activations
    per token, exact on every CPU): 2.4x fp32's decode step at 16 sequences on one AMD EPYC
    core, not the same tokens as fp32 (the text stays the model's).
    Prompts are prefilled ``start_chunk`` tokens a step at most, cut at every ``part_tokens``:
    int8's answer depends on how a prompt was split, so it is always split the same way,
    however busy the steps; a part is what a shared prefix reuses. int8 cuts at 8 (its rows
    are exact in any batch), so the chat template's 24-token opening is three shared parts;
    fp32's rows depend on the rows beside them (BLAS blocking), so fp32 cuts where the
    steps do, at ``start_chunk``.
    """

    start_chunk = 64

    def __init__(self, *, threads: int = 1, reader: Any = None, int8: bool = False) -> None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be an int >= 1, got {threads!r}")
        torch.set_num_threads(threads)
        threadpool_limits(threads, user_api="blas")  # numpy's BLAS runs the fp32 products
        if reader is None:
            reader = read_gguf(gguf_path())
        self.codec = TextCodec(reader)
        self.weights: LlamaWeights = load_weights(reader)
        self.config = self.weights.config
        self._cos, self._sin = _rope_tables(self.config)
        linear = Int8Linear if int8 else Fp32Linear
        self._exact = int8  # a row's floats are the same in any batch
        self.part_tokens = 8 if self._exact else self.start_chunk
        self._linears = [
            (linear(x.qkv), linear(x.out), linear(x.gate_up), linear(x.down))
            for x in self.weights.layers
        ]
        self._head = linear(self.weights.head)
        self._store: PrefixStore[torch.Tensor] | None = None

    def start(self, inputs: Sequence[Prompt]) -> list[TorchState | BaseException]:
        return [self._start(p) for p in inputs]

    def _start(self, prompt: Prompt) -> TorchState | BaseException:
        try:
            if prompt.max_tokens < 1:
                raise ValueError(f"max_tokens must be >= 1, got {prompt.max_tokens!r}")
            sampler = Sampler(prompt.temperature, prompt.top_p, prompt.seed)
            ids = self.codec.prompt_ids(prompt)
        except ValueError as exc:
            return exc
        if not ids:
            return ValueError("the prompt has no tokens: give text or messages")
        if len(ids) >= self.config.context:
            return ValueError(
                f"the prompt has {len(ids)} tokens; the model's context is {self.config.context}"
            )
        limit = min(len(ids) + prompt.max_tokens, self.config.context)
        state = TorchState(
            prompt=prompt,
            ids=ids,
            sampler=sampler,
            text=Detokenizer(self.codec.token_bytes),
            stop=StopText(prompt.stop),
            cache=KVCache(self.config, limit),
            pending=ids[-1],
        )
        if self._store is not None:
            state.keys = part_keys(ids[:-1], self.part_tokens)
            self._reuse(state, self._store)
        return state

    def reuse_prefixes(self, budget_bytes: int) -> bool:
        """Keep prefill parts' keys and values (fp32: ``layers * 2 * kv_heads * head_dim * 4``
        bytes a token) within ``budget_bytes``; 0 turns reuse off. Only what a fresh prefill
        reproduces bit for bit is reused: whole parts, as the prompt's own ``part_tokens``
        split cuts them, each after the same tokens. Sequences that start the same part in
        one prefill compute it once."""
        self._store = None if budget_bytes == 0 else PrefixStore(budget_bytes)
        return self._store is not None

    def prefix_counts(self) -> PrefixCounts | None:
        """``computed`` counts prefill tokens (each prompt's all but its last, which rides
        with the last part or the first step feeds); None while reuse is off."""
        return None if self._store is None else self._store.counts()

    def start_cost(self, state: TorchState) -> int:
        return len(state.ids) - 1 - state.fed

    def prefill(
        self, states: Sequence[TorchState], tokens: Sequence[int]
    ) -> list[BaseException | None]:
        return self._prefill(states, tokens, ())

    def prefill_and_step(
        self, starts: Sequence[TorchState], tokens: Sequence[int], ready: Sequence[TorchState]
    ) -> tuple[list[BaseException | None], list[Piece | BaseException]]:
        """int8: the ready sequences' next tokens ride in the prefill's pass, their logits
        kept (``first``), so the step only samples: one weight pass a tick, not two. A row's
        floats are its own in any batch there; fp32's prompt rows would depend on who steps
        beside them (and so would their reuse), so fp32 passes apart."""
        riders = [  # those a step would feed a token (not those whose logits are at hand)
            s
            for s in ready
            if self._exact and s.cache is not None and not s.done and s.first is None
        ]
        errors = self._prefill(starts, tokens, riders)
        finished = [
            s for s, e in zip(starts, errors, strict=True) if e is None and not self.start_cost(s)
        ]
        return errors, self.step([*ready, *finished])

    def _prefill(
        self, states: Sequence[TorchState], tokens: Sequence[int], riders: Sequence[TorchState]
    ) -> list[BaseException | None]:
        live = [s.cache is not None for s in states]
        store = self._store
        plans = []
        for state, count, alive in zip(states, tokens, live, strict=True):
            if alive and store is not None:
                self._reuse(state, store)  # parts stored since it started
            take = max(0, min(count, self.start_cost(state))) if alive else 0
            plans.append(self._cut(state, take))
        leaders: dict[bytes, TorchState] = {}  # who computes each part that several start
        fed = []  # each state's spans up to the first part another computes
        for state, plan in zip(states, plans, strict=True):
            own = 0
            for _, _, part in plan:
                if part is not None and leaders.setdefault(state.keys[part], state) is not state:
                    break
                own += 1
            fed.append(plan[:own])
        self._prefill_forward(states, fed, riders)
        for state, plan, spans in zip(states, plans, fed, strict=True):
            self._keep(state, plan[: len(spans)], store)
        if store is not None:  # once every part and prompt computed here is kept
            for state, plan, spans in zip(states, plans, fed, strict=True):
                self._follow(state, plan[len(spans) :], leaders, store)
        return [None if alive else ValueError("the sequence was freed") for alive in live]

    def _cut(self, state: TorchState, take: int) -> list[tuple[int, int, int | None]]:
        """The next ``take`` prompt tokens as spans (start, end, part): cut at every
        ``part_tokens`` from the prompt's start, so a prompt's floats never depend on the
        steps' budgets; ``part`` indexes a whole part (reusable), None for a caller's split."""
        size, owed, spans = self.part_tokens, len(state.ids) - 1, []
        start, stop = state.fed, state.fed + take
        while start < stop:
            end = min(start - start % size + size, stop)
            whole = bool(state.keys) and not start % size and end == min(start + size, owed)
            spans.append((start, end, start // size if whole else None))
            start = end
        return spans

    def _prefill_forward(
        self,
        states: Sequence[TorchState],
        fed: Sequence[Sequence[tuple[int, int, int | None]]],
        riders: Sequence[TorchState],
    ) -> None:
        """Feed the spans, after the riders' next tokens; a state whose spans end its prefill
        takes the prompt's last token along, in the same products, as its own span. The
        riders' and those tokens' logits are the very ones a step would compute, so that
        step then only samples, a weight pass sooner."""
        ends = [
            s
            for s, spans in zip(states, fed, strict=True)
            if spans and spans[-1][1] == len(s.ids) - 1
        ]
        fedding = [
            (s, s.ids[a:b]) for s, spans in zip(states, fed, strict=True) for a, b, _ in spans
        ]
        chunks = [[s.pending] for s in riders] + [chunk for _, chunk in fedding]
        chunks += [[s.ids[-1]] for s in ends]
        wanted = [True] * len(riders) + [False] * len(fedding) + [True] * len(ends)
        with torch.inference_mode():
            logits = self._forward([*riders, *(s for s, _ in fedding), *ends], chunks, wanted)
        for state, row in zip([*riders, *ends], logits, strict=True):
            state.first = row
        for state, row in zip(riders, logits[: len(riders)], strict=True):
            self._keep_first(state, row)  # a first step's token: its prompt's last

    def _keep(
        self,
        state: TorchState,
        spans: Sequence[tuple[int, int, int | None]],
        store: PrefixStore[torch.Tensor] | None,
    ) -> None:
        """After a prefill: move ``fed`` past the spans the state computed, store the whole
        parts among them and, when they ended its prefill, what its last token left."""
        computed = sum(end - start for start, end, _ in spans)
        state.fed += computed
        if store is None or state.cache is None or not computed:
            return
        for start, end, part in spans:
            if part is not None:
                block = state.cache.part(start, end)
                store.put(state.keys[: part + 1], block, block.numel() * block.element_size())
        store.record(computed=computed)
        if state.first is not None:  # the prefill fed the prompt's last token too
            self._keep_first(state, state.first)

    def _follow(
        self,
        state: TorchState,
        rest: Sequence[tuple[int, int, int | None]],
        leaders: dict[bytes, TorchState],
        store: PrefixStore[torch.Tensor],
    ) -> None:
        """Copy the parts after the state's own that others computed in this prefill, and
        then what its last token left, when its whole prompt was kept."""
        for start, end, part in rest:
            leader = leaders.get(state.keys[part]) if part is not None else None
            if leader is None or leader is state or leader.cache is None or state.cache is None:
                break
            state.cache.extend(leader.cache.part(start, end))
            store.record(reused=end - start, hit=not state.reused)
            state.reused += end - start
            state.fed = end
        if state.cache is not None:
            self._kept_first(state, store)

    def _reuse(self, state: TorchState, store: PrefixStore[torch.Tensor]) -> None:
        """Append the stored parts that continue the state's prefill, as far as they go."""
        cache, size = _cache(state), self.part_tokens
        index, first = state.fed // size, state.fed
        while not state.fed % size and index < len(state.keys):
            part = store.get(state.keys[index])
            if part is None:
                break
            cache.extend(part)
            state.fed += part.shape[3]
            index += 1
        if state.fed > first:
            store.touch(state.keys[:index])
            store.record(reused=state.fed - first, hit=not state.reused)
            state.reused += state.fed - first
        self._kept_first(state, store)

    def _keep_first(self, state: TorchState, logits: torch.Tensor) -> None:
        """Keep what a whole prompt's last token left (its keys and values, then its logits,
        as one flat tensor), so that the same prompt again only samples its first token.
        Only where a row's floats never depend on its batch: they are the very ones again."""
        store, cache, at = self._store, state.cache, len(state.ids) - 1
        if store is None or cache is None or not self._exact or state.tokens:
            return
        kept = torch.cat([cache.data[..., at : at + 1, :].flatten(), logits])
        store.put([*state.keys, final_key(state.ids)], kept, kept.numel() * kept.element_size())

    def _kept_first(self, state: TorchState, store: PrefixStore[torch.Tensor]) -> None:
        """A whole prompt kept before, its parts all reused: its last token's state and
        logits, so its first step only samples (as after a prefill that fed the token)."""
        cache = _cache(state)
        if self.start_cost(state) or state.first is not None or cache.length > state.fed:
            return
        key = final_key(state.ids)
        kept = store.get(key)
        if kept is None:
            return
        c = self.config
        size = c.layers * 2 * c.kv_heads * c.head_dim
        cache.extend(kept[:size].view(c.layers, 2, c.kv_heads, 1, c.head_dim))
        state.first = kept[size:]
        store.touch([*state.keys, key])

    def step(self, states: Sequence[TorchState]) -> list[Piece | BaseException]:
        ready = [s for s in states if self.start_cost(s) == 0 and not s.done]
        picks: dict[int, int] = {}
        if ready:
            fresh = [s for s in ready if s.first is None]
            with torch.inference_mode():
                logits = self._forward(fresh, [[s.pending] for s in fresh], True)
                if self._store is not None and self._exact:  # first steps fed prompts' last
                    for state, row in zip(fresh, logits, strict=True):
                        self._keep_first(state, row)
                if len(fresh) < len(ready):  # some have their logits from their prefill
                    computed = iter(logits)
                    rows = [next(computed) if s.first is None else s.first for s in ready]
                    logits = torch.stack(rows)
                chosen = pick(logits, [s.sampler for s in ready])
            for state in ready:
                state.first = None
            picks = {id(s): token for s, token in zip(ready, chosen, strict=True)}
        pieces: list[Piece | BaseException] = []
        for state in states:
            if id(state) in picks:
                pieces.append(self._piece(state, picks[id(state)]))
            elif state.done:
                pieces.append(ValueError("the sequence has finished; it cannot step again"))
            else:
                pieces.append(ValueError(f"{self.start_cost(state)} prompt tokens await prefill"))
        return pieces

    def finished(self, state: TorchState, output: Piece) -> bool:
        return output.finish_reason is not None

    def free(self, state: TorchState) -> None:
        state.cache = state.first = None
        state.done = True

    def _piece(self, state: TorchState, token: int) -> Piece:
        """The sequence's output for the token just chosen."""
        state.tokens.append(token)
        state.pending = token
        generated = len(state.tokens)
        first = len(state.ids) if generated == 1 else 0
        ended = token in self.codec.eos_ids
        text, hit = state.stop.feed("" if ended else state.text.feed(token))
        full = state.cache is None or state.cache.length >= self.config.context
        if hit or (not ended and generated < state.prompt.max_tokens and not full):
            return Piece(text, finish_reason="stop" if hit else None, prompt_tokens=first)
        state.done = True
        rest, hit = state.stop.feed(state.text.flush())
        text += rest if hit else rest + state.stop.flush()
        reason: FinishReason = "stop" if ended or hit else "length"
        return Piece(text, finish_reason=reason, prompt_tokens=first)

    def _forward(
        self,
        states: Sequence[TorchState],
        chunks: Sequence[Sequence[int]],
        logits: bool | Sequence[bool],
    ) -> torch.Tensor:
        """Feed each state its chunk of tokens through the decoder, appending to its cache (a
        state listed twice feeds its chunks in turn); the logits of each chunk's last token
        ([chunks, vocab]) for the chunks ``logits`` asks for (True: all, False: none)."""
        c, w = self.config, self.weights
        spans = _spans(states, chunks)
        flat = [t for chunk in chunks for t in chunk]
        if not flat:
            return torch.empty(0, c.vocab)
        tokens, rotated = len(flat), c.heads + c.kv_heads
        attend = PassAttention(c, spans)
        positions = torch.cat([torch.arange(past, past + n) for _, n, past in spans])
        cos, sin = self._cos[positions][:, None, :], self._sin[positions][:, None, :]
        x = w.embed[torch.tensor(flat)]
        for index, layer in enumerate(w.layers):
            h = functional.rms_norm(x, (c.hidden,), layer.attn_norm, c.rms_eps)
            qkv = self._linears[index][0](h).view(tokens, rotated + c.kv_heads, c.head_dim)
            qk = _rotate(qkv[:, :rotated], cos, sin)
            x = x + self._linears[index][1](attend(index, qk, qkv[:, rotated:]))
            h = functional.rms_norm(x, (c.hidden,), layer.ffn_norm, c.rms_eps)
            gate, up = self._linears[index][2](h).chunk(2, dim=1)
            x = x + self._linears[index][3](functional.silu(gate) * up)
        asks = [logits] * len(chunks) if isinstance(logits, bool) else logits
        picked = [bool(ask) for ask, chunk in zip(asks, chunks, strict=True) if chunk]
        ends = torch.tensor([n for _, n, _ in spans]).cumsum(0) - 1  # each span's last row
        last = ends[torch.tensor(picked, dtype=torch.bool)]
        out = x.new_empty(0, c.vocab)
        if len(last):
            out = self._head(functional.rms_norm(x[last], (c.hidden,), w.norm, c.rms_eps))
        for cache, n, _ in spans:  # fed only once the pass has not raised
            cache.length += n
        return out


def _cache(state: TorchState) -> KVCache:
    """The state's cache; ``ValueError`` once it has been freed."""
    if state.cache is None:
        raise ValueError("the sequence was freed: it cannot be fed again")
    return state.cache


def _spans(states: Sequence[TorchState], chunks: Sequence[Sequence[int]]) -> list[Span]:
    """(cache, tokens, tokens before) of each non-empty chunk, in order, each cache reserved
    for all its chunks: a state's second chunk follows its first."""
    spans: list[Span] = []
    ends: dict[int, int] = {}
    for state, chunk in zip(states, chunks, strict=True):
        if chunk:
            cache = _cache(state)
            past = ends.get(id(cache), cache.length)
            ends[id(cache)] = past + len(chunk)
            spans.append((cache, len(chunk), past))
    for cache, _, _ in spans:
        cache.reserve(ends[id(cache)] - cache.length)
    return spans


def _rope_tables(config: LlamaConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin for every position, [context, head_dim], halves layout (transformers')."""
    half = torch.arange(0, config.head_dim, 2, dtype=torch.int64).float() / config.head_dim
    inverse = 1.0 / (config.rope_theta**half)
    angles = torch.arange(config.context).float()[:, None] * inverse[None, :]
    angles = torch.cat([angles, angles], dim=1)
    return angles.cos(), angles.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rope on [tokens, heads, head_dim] with each token's cos and sin ([tokens, 1, head_dim])."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin
