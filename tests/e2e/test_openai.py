"""OpenAI's embeddings API on a real ``carpool serve``, through the official ``openai`` client:
minilm's vectors equal sentence-transformers run on each text alone, lists are one request
of k rows, concurrent callers share batches, usage counts minilm's tokens, and every refusal
is OpenAI's error shape with the v2 routes' status."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

from server.conftest import MINILM_TEXTS, Launcher, Server

from .test_cli_serve import assert_refused, run_serve

CALLERS = 32  # concurrent single-text requests; two full batches of 16
# minilm waits up to 300 ms for a full batch of 16, so concurrent callers meet; lengths
# opts in; upper (text to text) does not.
CONFIG = """
[models.minilm]
policy = "fixed"
max_wait_ms = 300.0
max_batch_size = 16

[models.lengths]
openai = true
"""


@pytest.fixture(scope="module")
def server(serve_module: Launcher, tmp_path_factory: pytest.TempPathFactory) -> Server:
    config = tmp_path_factory.mktemp("openai") / "carpool.toml"
    config.write_text(CONFIG)
    return serve_module("minilm", "models:lengths", "models:upper", "--config", str(config))


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=30.0
    ) as client:
        yield client


def vectors(response: Any) -> np.ndarray[Any, Any]:
    assert [d.index for d in response.data] == list(range(len(response.data)))
    assert {d.object for d in response.data} == {"embedding"}
    return np.array([d.embedding for d in response.data], dtype=np.float32)


@pytest.mark.slow
def test_models_lists_the_models_that_opted_in(client: openai.OpenAI) -> None:
    listed = client.models.list()
    assert [(m.id, m.object, m.owned_by) for m in listed.data] == [
        ("minilm", "model", "carpool"),
        ("lengths", "model", "carpool"),
    ]
    minilm = client.models.retrieve("minilm")
    assert (minilm.id, minilm.owned_by) == ("minilm", "carpool")
    assert minilm.created == listed.data[0].created > 1_700_000_000  # Unix seconds
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("upper")
    assert (info.value.code, info.value.param) == ("model_not_found", "model")


@pytest.mark.slow
def test_concurrent_single_texts_equal_sentence_transformers_and_share_batches(
    server: Server, client: openai.OpenAI, minilm_reference: np.ndarray[Any, Any]
) -> None:
    before = server.stats("minilm")
    requests = [i % len(MINILM_TEXTS) for i in range(CALLERS)]

    def embed(index: int) -> np.ndarray[Any, Any]:
        response = client.embeddings.create(
            model="minilm", input=MINILM_TEXTS[index], encoding_format="float"
        )
        assert response.model == "minilm"
        return vectors(response)

    with ThreadPoolExecutor(CALLERS) as pool:
        got = list(pool.map(embed, requests))
    for index, embedding in zip(requests, got, strict=True):
        assert embedding.shape == (1, 384)
        np.testing.assert_allclose(embedding[0], minilm_reference[index], atol=1e-5, rtol=0)
    after = server.stats("minilm")
    rows = after["inference_count"] - before["inference_count"]
    calls = after["execution_count"] - before["execution_count"]
    assert rows == CALLERS
    assert calls < rows  # batched: 32 requests in fewer model calls


@pytest.mark.slow
def test_a_list_is_one_request_of_k_rows(
    server: Server, client: openai.OpenAI, minilm_reference: np.ndarray[Any, Any]
) -> None:
    labels = {"model": "minilm", "outcome": "success", "protocol": "openai"}
    counted = server.metric("carpool_requests_total", **labels)
    rows = server.stats("minilm")["inference_count"]
    response = client.embeddings.create(model="minilm", input=MINILM_TEXTS, encoding_format="float")
    np.testing.assert_allclose(vectors(response), minilm_reference, atol=1e-5, rtol=0)
    assert server.stats("minilm")["inference_count"] == rows + len(MINILM_TEXTS)
    assert server.metric("carpool_requests_total", **labels) == counted + 1


@pytest.mark.slow
def test_base64_decodes_to_the_same_vectors(
    server: Server, client: openai.OpenAI, minilm_reference: np.ndarray[Any, Any]
) -> None:
    body = {"model": "minilm", "input": MINILM_TEXTS[:3], "encoding_format": "base64"}
    response = server.http.post("/v1/embeddings", json=body)
    assert response.status_code == 200, response.text
    encoded = [item["embedding"] for item in response.json()["data"]]
    decoded = np.stack([np.frombuffer(base64.b64decode(e), dtype="<f4") for e in encoded])
    np.testing.assert_allclose(decoded, minilm_reference[:3], atol=1e-5, rtol=0)
    # The client asks for base64 itself when no encoding_format is given, and decodes it.
    default = client.embeddings.create(model="minilm", input=MINILM_TEXTS[:3])
    np.testing.assert_allclose(vectors(default), minilm_reference[:3], atol=1e-5, rtol=0)


@pytest.mark.slow
def test_usage_counts_minilms_tokens(client: openai.OpenAI, sentence_transformer: Any) -> None:
    # As the model sees them: [CLS] and [SEP] counted, the long text cut at 256 tokens.
    tokens = [int(sentence_transformer.tokenize([t])["attention_mask"].sum()) for t in MINILM_TEXTS]
    assert tokens[-2] == 256  # truncated
    response = client.embeddings.create(model="minilm", input=MINILM_TEXTS, user="someone")
    assert response.usage.prompt_tokens == response.usage.total_tokens == sum(tokens)
    single = client.embeddings.create(model="minilm", input=MINILM_TEXTS[1])
    assert single.usage.prompt_tokens == tokens[1]


@pytest.mark.slow
def test_a_python_model_that_opted_in_serves_without_a_tokenizer(client: openai.OpenAI) -> None:
    response = client.embeddings.create(
        model="lengths", input=["ab", "a b c", "汽车"], encoding_format="float"
    )
    assert vectors(response).tolist() == [[2.0, 1.0], [5.0, 3.0], [6.0, 1.0]]
    assert response.model == "lengths"
    assert (response.usage.prompt_tokens, response.usage.total_tokens) == (0, 0)


BAD_REQUESTS = [
    (
        {"model": "minilm", "input": [101, 7592, 102]},
        "input",
        "unsupported_value",
        "model 'minilm' takes text, not token ids: send input as a string or a list of strings",
    ),
    (
        {"model": "minilm", "input": [[101, 7592, 102]]},
        "input",
        "unsupported_value",
        "model 'minilm' takes text, not token ids: send input as a string or a list of strings",
    ),
    (
        {"model": "minilm", "input": "hi", "dimensions": 128},
        "dimensions",
        "unsupported_parameter",
        "model 'minilm' cannot shorten its embeddings to 128 dimensions: leave dimensions out "
        "(or send 384)",
    ),
    (
        {"model": "minilm", "input": []},
        "input",
        "invalid_value",
        "input must not be an empty list: send a string, or a list of at least one string",
    ),
    (
        {"model": "minilm", "input": "hi", "encoding_format": "hex"},
        "encoding_format",
        "invalid_value",
        "encoding_format must be 'float' or 'base64', got \"hex\"",
    ),
    (
        {"model": "minilm", "input": ["hi", 3]},
        "input",
        "invalid_type",
        "input[1] must be a string, got a number",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("params", "param", "code", "message"),
    BAD_REQUESTS,
    ids=["token-ids", "token-id-lists", "dimensions", "empty", "encoding", "non-string"],
)
def test_bad_requests_are_400_in_openais_shape(
    server: Server,
    client: openai.OpenAI,
    params: dict[str, Any],
    param: str,
    code: str,
    message: str,
) -> None:
    invalid = {"model": "minilm", "outcome": "invalid", "protocol": "openai"}
    before = _count(server, invalid)
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(**params)
    error = info.value
    assert (error.status_code, error.param, error.code, error.type) == (
        400,
        param,
        code,
        "invalid_request_error",
    )
    assert error.body == {
        "message": message,
        "type": "invalid_request_error",
        "param": param,
        "code": code,
    }
    assert _count(server, invalid) == before + 1  # counted once the model is known


def _count(server: Server, labels: dict[str, str]) -> float:
    try:
        return server.metric("carpool_requests_total", **labels)
    except AssertionError:  # not counted yet: no sample
        return 0.0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("nope", "Request for unknown model: 'nope' is not found"),
        (
            "upper",
            "model 'upper' is not served over the OpenAI API: it has not opted in "
            "([models.upper] openai = true, or --openai true, for a model that turns text "
            "into one vector); use /v2/models/upper/infer for it",
        ),
    ],
)
def test_a_model_not_served_over_openai_is_404(
    client: openai.OpenAI, model: str, message: str
) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.embeddings.create(model=model, input="hi")
    assert info.value.body == {
        "message": message,
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }


@pytest.mark.slow
def test_routes_answer_in_openais_shape(server: Server) -> None:
    wrong_method = server.http.get("/v1/embeddings")
    assert (wrong_method.status_code, wrong_method.headers["allow"]) == (405, "POST")
    assert wrong_method.json()["error"]["code"] == "method_not_allowed"
    unknown = server.http.post("/v1/audio/speech", json={})
    assert unknown.status_code == 404
    assert unknown.json() == {
        "error": {
            "message": "Not Found: /v1/audio/speech",
            "type": "invalid_request_error",
            "param": None,
            "code": "not_found",
        }
    }
    not_json = server.http.post("/v1/embeddings", content=b"{")
    assert not_json.status_code == 400
    assert not_json.json()["error"]["code"] == "invalid_json"


@pytest.mark.parametrize(
    ("args", "config"),
    [
        (["models:upper"], "[models.upper]\nopenai = true\n"),
        (["models:upper", "--openai", "true"], None),
    ],
    ids=["config", "flag"],
)
def test_a_model_that_opts_in_without_text_to_a_vector_is_refused_at_start(
    tmp_path: Path, args: list[str], config: str | None
) -> None:
    if config is not None:
        path = tmp_path / "carpool.toml"
        path.write_text(config)
        args = [*args, "--config", str(path)]
    assert_refused(
        run_serve(*args),
        "carpool serve: model 'upper': openai = true (serving OpenAI's /v1/embeddings) needs "
        "one declared BYTES input of one string per row (shape [1]), one declared FP32 output "
        "of one vector per row (shape [N]) and batching on; the model declares "
        "['TEXT:BYTES:[-1]', 'UPPER:BYTES:[-1]'] with max_batch_size=32: declare inputs and "
        "outputs that fit, or leave openai off",
    )


@pytest.mark.slow
def test_a_model_that_has_not_opted_in_counts_its_refusal(
    client: openai.OpenAI, server: Server
) -> None:
    labels = {"model": "upper", "outcome": "not_found", "protocol": "openai"}
    before = _count(server, labels)
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="upper", input="hi")
    assert _count(server, labels) == before + 1
