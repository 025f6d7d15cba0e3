"""Text to tokens and back, from the GGUF's own vocabulary, merges and chat template.

A byte-level BPE (``tokenizers``), the chat template rendered with jinja2 as transformers
renders it, and detokenization token by token that never splits a UTF-8 character.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Any

from carpool.backends.generation import Message, Prompt
from carpool.backends.smollm2.weights import field
from carpool.errors import ConfigError

__all__ = ["Detokenizer", "TextCodec"]

_CONTROL = 3  # llama.cpp's token type for control tokens (<|im_start|>, <|im_end|>, ...)
# Control tokens that end a generation wherever the GGUF names its EOS elsewhere.
_END_TEXTS = ("<|endoftext|>", "<|im_end|>")


class TextCodec:
    """The model's tokenizer, chat template and end-of-sequence tokens."""

    def __init__(self, reader: Any) -> None:
        model = field(reader, "tokenizer.ggml.model")
        if model != "gpt2":
            raise ConfigError(f"only byte-level BPE (gpt2) GGUF tokenizers are read, not {model!r}")
        tokens: list[str] = field(reader, "tokenizer.ggml.tokens")
        types: list[int] = field(reader, "tokenizer.ggml.token_type")
        merges: list[str] = field(reader, "tokenizer.ggml.merges")
        self._tokenizer = _bpe(tokens, types, merges)
        self.template = str(field(reader, "tokenizer.chat_template"))
        self._template = _compiled(self.template)
        control = {
            t: i for i, (t, kind) in enumerate(zip(tokens, types, strict=True)) if kind == _CONTROL
        }
        eos = int(field(reader, "tokenizer.ggml.eos_token_id"))
        self.eos_ids = frozenset({eos} | {control[t] for t in _END_TEXTS if t in control})
        self._eos_text = tokens[eos]
        self._bos_text = tokens[int(field(reader, "tokenizer.ggml.bos_token_id"))]
        self.token_bytes = _token_bytes(tokens, types)

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        """The token ids of a prompt: its messages (or its text as one user message when
        ``chat``) under the chat template, else its text as it is."""
        if prompt.messages:
            return self.encode(self.render(prompt.messages))
        if prompt.chat:
            return self.encode(self.render((Message("user", prompt.text),)))
        return self.encode(prompt.text)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, control tokens written in it (``<|im_start|>``) included."""
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def render(self, messages: Sequence[Message]) -> str:
        """The chat template over ``messages``, ending with the assistant's turn opened."""
        return str(
            self._template.render(
                messages=[{"role": m.role, "content": m.content} for m in messages],
                add_generation_prompt=True,
                bos_token=self._bos_text,
                eos_token=self._eos_text,
            )
        )

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` (end-of-sequence tokens left out)."""
        detokenizer = Detokenizer(self.token_bytes)
        text = "".join(detokenizer.feed(i) for i in ids if i not in self.eos_ids)
        return text + detokenizer.flush()


class Detokenizer:
    """One sequence's text, token by token: bytes that end inside a UTF-8 character wait
    for the token that completes it."""

    def __init__(self, token_bytes: Sequence[bytes]) -> None:
        self._bytes = token_bytes
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token: int) -> str:
        """The text this token completes."""
        return str(self._utf8.decode(self._bytes[token]))

    def flush(self) -> str:
        """Whatever the sequence ends on (an incomplete character becomes U+FFFD)."""
        return str(self._utf8.decode(b"", final=True))


def _bpe(tokens: list[str], types: list[int], merges: list[str]) -> Any:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(tokens)}
    pairs = [(left, right) for left, right in (m.split(" ", 1) for m in merges)]
    tokenizer = Tokenizer(models.BPE(vocab, pairs))
    # The "smollm" pre-tokenizer (llama.cpp; SmolLM2's tokenizer.json): digits one by one,
    # then GPT-2's byte-level split.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    special = [t for t, kind in zip(tokens, types, strict=True) if kind == _CONTROL]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    return tokenizer


def _token_bytes(tokens: list[str], types: list[int]) -> list[bytes]:
    """Each token's bytes: byte-level tokens through GPT-2's byte-to-character table,
    control tokens as their UTF-8 text."""
    table = {c: b for b, c in _bytes_to_unicode().items()}
    return [
        t.encode() if kind == _CONTROL else bytes(table[c] for c in t if c in table)
        for t, kind in zip(tokens, types, strict=True)
    ]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for every byte."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    kept += range(ord("®"), ord("ÿ") + 1)
    table = {b: chr(b) for b in kept}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _compiled(template: str) -> Any:
    """The template in transformers' jinja environment: sandboxed, blocks trimmed."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ValueError(f"the chat template refused the messages: {message}")

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template)
