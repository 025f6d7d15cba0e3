"""The GGUF's llama weights as fp32 torch tensors, and its config read from the metadata.

Only ``gguf``, numpy and torch: no transformers. q and k are un-permuted from llama.cpp's
interleaved rope layout back to the halves layout that transformers' llama uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from carpool.errors import ConfigError

__all__ = ["LayerWeights", "LlamaConfig", "LlamaWeights", "load_weights", "read_gguf"]


@dataclass(frozen=True)
class LlamaConfig:
    """The shape of the decoder, as the GGUF's ``llama.*`` metadata gives it."""

    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    rope_theta: float
    rms_eps: float
    vocab: int
    context: int


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer; linear weights as [out, in], stored transposed (views of [in, out]
    memory, the layout a BLAS product ``x @ w`` reads fastest). ``qkv`` stacks q, k and v,
    and ``gate_up`` the MLP's gate and up, so each is one matrix product."""

    attn_norm: torch.Tensor
    qkv: torch.Tensor
    out: torch.Tensor
    ffn_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


@dataclass(frozen=True)
class LlamaWeights:
    config: LlamaConfig
    embed: torch.Tensor  # [vocab, hidden]; also the output head when the GGUF has none
    layers: tuple[LayerWeights, ...]
    norm: torch.Tensor
    head: torch.Tensor  # [vocab, hidden]


def read_gguf(path: Path) -> Any:
    """The file's ``gguf.GGUFReader``; ``ConfigError`` when it is no llama GGUF."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    if field(reader, "general.architecture") != "llama":
        raise ConfigError(f"{path} is not a llama GGUF")
    return reader


def field(reader: Any, key: str) -> Any:
    """A metadata value (a str, a number, or a list), ``ConfigError`` naming a missing key."""
    found = reader.fields.get(key)
    if found is None:
        raise ConfigError(f"the GGUF has no metadata key {key!r}")
    return found.contents()


def load_weights(reader: Any) -> LlamaWeights:
    """Every tensor dequantized to fp32, q and k in transformers' rope layout."""
    config = _config(reader)
    tensors = {t.name: t for t in reader.tensors}

    def get(name: str) -> torch.Tensor:
        import gguf

        if name not in tensors:
            raise ConfigError(f"the GGUF has no tensor {name!r}")
        tensor = tensors[name]
        array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        return torch.from_numpy(np.array(array, dtype=np.float32, order="C"))  # a writable copy

    layers = []
    for i in range(config.layers):
        q = _unpermute(get(f"blk.{i}.attn_q.weight"), config.heads)
        k = _unpermute(get(f"blk.{i}.attn_k.weight"), config.kv_heads)
        v = get(f"blk.{i}.attn_v.weight")
        gate, up = get(f"blk.{i}.ffn_gate.weight"), get(f"blk.{i}.ffn_up.weight")
        layers.append(
            LayerWeights(
                attn_norm=get(f"blk.{i}.attn_norm.weight"),
                qkv=_transposed(torch.cat([q, k, v])),
                out=_transposed(get(f"blk.{i}.attn_output.weight")),
                ffn_norm=get(f"blk.{i}.ffn_norm.weight"),
                gate_up=_transposed(torch.cat([gate, up])),
                down=_transposed(get(f"blk.{i}.ffn_down.weight")),
            )
        )
    embed = get("token_embd.weight")  # rows, for lookups; a tied head is transposed apart
    head = _transposed(get("output.weight")) if "output.weight" in tensors else embed
    return LlamaWeights(config, embed, tuple(layers), get("output_norm.weight"), head)


def _transposed(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` ([out, in]) as a view of [in, out] memory."""
    return weight.t().contiguous().t()


def _config(reader: Any) -> LlamaConfig:
    hidden = int(field(reader, "llama.embedding_length"))
    heads = int(field(reader, "llama.attention.head_count"))
    tokens = field(reader, "tokenizer.ggml.tokens")
    vocab_key = reader.fields.get("llama.vocab_size")
    return LlamaConfig(
        layers=int(field(reader, "llama.block_count")),
        hidden=hidden,
        ffn=int(field(reader, "llama.feed_forward_length")),
        heads=heads,
        kv_heads=int(field(reader, "llama.attention.head_count_kv")),
        head_dim=hidden // heads,
        rope_theta=float(field(reader, "llama.rope.freq_base")),
        rms_eps=float(field(reader, "llama.attention.layer_norm_rms_epsilon")),
        vocab=int(vocab_key.contents()) if vocab_key is not None else len(tokens),
        context=int(field(reader, "llama.context_length")),
    )


def _unpermute(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's convert script pairs each head's rope dimensions as (2i, 2i+1); transformers
    pairs (i, i + dim/2). The inverse of that permutation, over the output rows."""
    rows = weight.shape[0]
    return weight.reshape(heads, rows // heads // 2, 2, -1).transpose(1, 2).reshape(weight.shape)
