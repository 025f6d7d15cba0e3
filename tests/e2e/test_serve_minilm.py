"""``carpool serve minilm``: real text embeddings over the v2 protocol, batched, equal to
sentence-transformers run on each text alone."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as triton

from server.conftest import MINILM_TEXTS, Server

# Loading the model and its tokenizer in a fresh process takes 10-20 s.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(serve_module: Any) -> Server:
    # A long fixed window, so that the concurrent requests below meet in batches.
    return serve_module(  # type: ignore[no-any-return]
        "minilm", "--policy", "fixed", "--max-wait-ms", "300", "--max-batch-size", "16"
    )


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[triton.InferenceServerClient]:
    client = triton.InferenceServerClient(server.address)
    yield client
    client.close()


def embed(server: Server, texts: list[str], *, binary: bool = True) -> np.ndarray[Any, Any]:
    client = triton.InferenceServerClient(server.address)
    try:
        data = np.array([[t.encode()] for t in texts], dtype=object)
        tensor = triton.InferInput("TEXT", list(data.shape), "BYTES")
        tensor.set_data_from_numpy(data, binary_data=binary)
        result = client.infer("minilm", [tensor])
        embedding = result.as_numpy("EMBEDDING")
        assert embedding is not None
        return embedding
    finally:
        client.close()


def test_metadata(client: triton.InferenceServerClient) -> None:
    metadata = client.get_model_metadata("minilm")
    assert metadata["inputs"] == [{"name": "TEXT", "datatype": "BYTES", "shape": [-1, 1]}]
    assert metadata["outputs"] == [{"name": "EMBEDDING", "datatype": "FP32", "shape": [-1, 384]}]


def test_concurrent_texts_equal_sentence_transformers_alone(
    server: Server, minilm_reference: np.ndarray[Any, Any]
) -> None:
    before = server.stats("minilm")
    with ThreadPoolExecutor(len(MINILM_TEXTS)) as pool:
        got = list(pool.map(lambda text: embed(server, [text]), MINILM_TEXTS))
    for text, embedding, expected in zip(MINILM_TEXTS, got, minilm_reference, strict=True):
        assert embedding.shape == (1, 384), text
        np.testing.assert_allclose(embedding[0], expected, atol=1e-5, rtol=0, err_msg=text)
    after = server.stats("minilm")
    assert after["inference_count"] - before["inference_count"] == len(MINILM_TEXTS)
    assert after["execution_count"] - before["execution_count"] < len(MINILM_TEXTS)  # batched


def test_several_texts_in_one_request_json(
    server: Server, minilm_reference: np.ndarray[Any, Any]
) -> None:
    got = embed(server, MINILM_TEXTS[:3], binary=False)
    np.testing.assert_allclose(got, minilm_reference[:3], atol=1e-5, rtol=0)


def test_invalid_utf8_is_a_400_naming_the_input(server: Server) -> None:
    body = (
        b'{"inputs":[{"name":"TEXT","datatype":"BYTES","shape":[1,1],'
        b'"parameters":{"binary_data_size":6}}]}' + b"\x02\x00\x00\x00\xff\xfe"
    )
    json_length = body.index(b"\x02\x00")
    response = server.http.post(
        "/v2/models/minilm/infer",
        content=body,
        headers={"Inference-Header-Content-Length": str(json_length)},
    )
    assert response.status_code == 400
    message = response.json()["error"]
    assert message.startswith("model 'minilm' cannot use this request's inputs: input 'TEXT' row 0")
    assert server.is_live()


def test_a_worker_process_answers_bit_for_bit_as_threads(server: Server, serve_module: Any) -> None:
    # The same flags, the model in a worker process: its own load of the weights, the
    # padded batches crossing through shared memory.
    processes = serve_module(
        "minilm", "--policy", "fixed", "--max-wait-ms", "300", "--max-batch-size", "16",
        "--runner", "process",
    )  # fmt: skip
    for texts in (MINILM_TEXTS[:1], MINILM_TEXTS[1:4], MINILM_TEXTS):
        got, want = embed(processes, texts), embed(server, texts)
        assert (got.dtype, got.shape) == (want.dtype, want.shape)
        assert got.tobytes() == want.tobytes()
    assert processes.stats("minilm")["workers"]["alive"] == 1


WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "the",
    "server",
    "tokenizes",
    "it",
]
LONG_TEXT_BYTES = 64 * 1024
LONG_TEXTS = 8  # each tokenized in full; more only lengthen the model's batch, not the wait


def long_texts() -> list[str]:
    """8 different texts of 64 KiB: tokenizing them takes a few tenths of a second, dozens of
    probes' worth (minilm's tokenizer reads every word before it truncates to 256 tokens)."""
    texts = []
    for i in range(LONG_TEXTS):
        words = [WORDS[(i * 7 + j) % len(WORDS)] for j in range(LONG_TEXT_BYTES // 4)]
        texts.append(" ".join(words)[:LONG_TEXT_BYTES])
    return texts


def v2_body(texts: list[str]) -> tuple[str, bytes]:
    tensor = {"name": "TEXT", "datatype": "BYTES", "shape": [len(texts), 1], "data": texts}
    return "/v2/models/minilm/infer", json.dumps({"inputs": [tensor]}).encode()


def openai_body(texts: list[str]) -> tuple[str, bytes]:
    return "/v1/embeddings", json.dumps({"model": "minilm", "input": texts}).encode()


def vectors(route: str, answer: httpx.Response) -> np.ndarray[Any, Any]:
    assert answer.status_code == 200, answer.text
    if route == "/v1/embeddings":
        return np.array([item["embedding"] for item in answer.json()["data"]], np.float32)
    (output,) = answer.json()["outputs"]
    return np.array(output["data"], np.float32).reshape(output["shape"])


@pytest.mark.parametrize("body", [v2_body, openai_body], ids=["v2", "openai"])
def test_health_is_answered_while_a_large_request_is_tokenized(
    server: Server, body: Callable[[list[str]], tuple[str, bytes]]
) -> None:
    """A request of 8 texts of 64 KiB is tokenized in a thread of the server's own: the
    event loop goes on answering /v2/health/ready meanwhile, many times over, while the
    request has not yet reached the batcher (minilm's received count unchanged) and has not
    been answered. Tokenized on the loop, as it used to be, nothing else was answered until
    it was done: a handful of probes got in while the body travelled, never 10. (The body is
    encoded before it is sent, so that probes count from when it is on the wire.)"""
    received = "carpool_batcher_received_total"
    before = server.metric(received, model="minilm")
    route, content = body(long_texts())
    answered_while_tokenizing = 0
    with ThreadPoolExecutor(1) as pool, httpx.Client(base_url=server.url) as probe:
        answer = pool.submit(server.http.post, route, content=content, timeout=120.0)
        while not answer.done():
            ready = probe.get("/v2/health/ready")
            assert (ready.status_code, ready.json()) == (200, {"ready": True})
            metrics = probe.get("/metrics").text
            if f'{received}{{model="minilm"}} {before}' in metrics and not answer.done():
                answered_while_tokenizing += 1
        embeddings = vectors(route, answer.result())
    assert embeddings.shape == (LONG_TEXTS, 384)
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-5)
    assert server.metric(received, model="minilm") == before + 1
    assert answered_while_tokenizing >= 10, answered_while_tokenizing


def test_batch_tokens_count_what_the_model_computed_and_the_texts_own(server: Server) -> None:
    def tokens(kind: str) -> float:
        return server.metric("carpool_batch_tokens_total", kind=kind, model="minilm")

    before = {kind: tokens(kind) for kind in ("computed", "real")}
    short, long = "a short text", "a rather longer text about batching requests by their tokens"
    with ThreadPoolExecutor(2) as pool:  # the fixed 300 ms window puts them in one batch
        answers = list(
            pool.map(
                lambda text: httpx.post(
                    f"{server.url}/v1/embeddings", json={"model": "minilm", "input": text}
                ),
                [short, long],
            )
        )
    used = [answer.json()["usage"]["prompt_tokens"] for answer in answers]
    assert used[0] < used[1]
    assert tokens("real") - before["real"] == sum(used)
    assert tokens("computed") - before["computed"] == 2 * used[1]  # both at the longer length
