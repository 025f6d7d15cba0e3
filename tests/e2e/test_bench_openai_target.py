"""An OpenAI-compatible embeddings endpoint (``carpool.bench.targets.openai_target``): URLs, the
request bodies sent, the model chosen from ``/v1/models``, the flags such a target refuses,
and ``carpool bench`` against ``carpool serve minilm``'s ``/v1/embeddings``."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp import web

from carpool.bench.report.data import Report
from carpool.bench.targets.base import BenchError, target_kind
from carpool.bench.targets.openai_target import (
    EmbeddingsURL,
    OpenAITarget,
    embedding_bodies,
    parse_embeddings,
)
from carpool.bench.targets.sentences import SENTENCES
from carpool.cli import main
from server.conftest import Launcher, Server, free_port


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http://127.0.0.1:8000/v1/embeddings", EmbeddingsURL("http://127.0.0.1:8000")),
        ("http://h:1/v1/embeddings/", EmbeddingsURL("http://h:1")),
        ("https://h/openai/v1/embeddings", EmbeddingsURL("https://h", "/openai")),
    ],
)
def test_embeddings_urls(text: str, expected: EmbeddingsURL) -> None:
    url = parse_embeddings(text)
    assert url == expected
    assert target_kind(text) == "openai"
    assert url.embeddings == text.rstrip("/")
    assert url.models == url.embeddings.removesuffix("/embeddings") + "/models"
    assert url.metrics == expected.base + "/metrics"


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("http://h:1/v2/models/demo", "http"),
        ("http://h:1/v1/embeddings", "openai"),
        ("grpc://h:1", "grpc"),
        ("demo", "in-process"),
    ],
)
def test_what_a_target_is(text: str, kind: str) -> None:
    assert target_kind(text) == kind


def test_a_body_is_one_text_and_the_model() -> None:
    bodies = embedding_bodies(["a", "b", "c"], model="m", count=4)
    assert [json.loads(b) for b in bodies] == [
        {"model": "m", "input": text, "encoding_format": "float"} for text in "abca"
    ]
    assert embedding_bodies(["é"], model="m", count=1)[0] == (
        '{"model":"m","input":"é","encoding_format":"float"}'.encode()
    )


def test_rows_put_several_texts_in_one_request() -> None:
    bodies = embedding_bodies(["a", "b", "c"], model="m", count=2, rows=2, encoding="base64")
    assert [json.loads(b) for b in bodies] == [
        {"model": "m", "input": ["a", "b"], "encoding_format": "base64"},
        {"model": "m", "input": ["c", "a"], "encoding_format": "base64"},
    ]


@pytest.mark.parametrize(
    ("texts", "count", "rows", "encoding", "message"),
    [
        ([], 1, 1, "float", "no texts to send; give at least one"),
        (["a"], 0, 1, "float", "count and rows must be >= 1, got 0 and 1"),
        (["a"], 1, 1, "json", "encoding_format must be one of float, base64, got 'json'"),
    ],
)
def test_bodies_that_cannot_be_made(
    texts: list[str], count: int, rows: int, encoding: str, message: str
) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        embedding_bodies(texts, model="m", count=count, rows=rows, encoding=encoding)


def test_the_built_in_sentences_vary() -> None:
    assert len(SENTENCES) == len(set(SENTENCES)) == 64
    words = sorted(len(s.split()) for s in SENTENCES)
    assert (words[0], words[-1]) == (1, 43)
    assert any(not s.isascii() for s in SENTENCES)


# ----------------------------------------------------------------------------- /v1/models


@pytest.fixture
async def models_server() -> AsyncIterator[tuple[str, dict[str, list[str]]]]:
    listed: dict[str, list[str]] = {"ids": ["a"]}

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": i} for i in listed["ids"]]})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}/v1/embeddings", listed
    await runner.cleanup()


async def test_the_model_is_the_only_one_listed_or_the_one_named(
    models_server: tuple[str, dict[str, list[str]]],
) -> None:
    url, listed = models_server
    async with OpenAITarget.connect(url, None) as target:
        assert (target.kind, target.name, str(target)) == ("openai", "a", url)
        assert await target.snapshot() is None  # no /metrics here: not read again
    listed["ids"] = ["a", "b"]
    async with OpenAITarget.connect(url, "b") as target:
        assert target.name == "b"
    models = url.removesuffix("/embeddings") + "/models"
    for model, message in [
        (None, f"{models} lists models a, b: choose one with --model NAME"),
        ("c", f"{models} does not list model 'c' (it lists a, b)"),
    ]:
        with pytest.raises(BenchError) as caught:
            async with OpenAITarget.connect(url, model):
                pass
        assert str(caught.value) == message


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["http://h:1/v1/embeddings", "--encoding", "binary"],
         "--encoding for a openai target must be float or base64, got 'binary'"),
        (["http://h:1/v2/models/demo", "--encoding", "base64"],
         "--encoding for a http target must be json or binary, got 'base64'"),
        (["http://h:1/v1/embeddings", "--shape", "TEXT:1"],
         "--shape describes v2 tensors; /v1/embeddings takes texts: give them with --strings FILE"),
        (["http://h:1/v2/models/demo", "--model", "demo"],
         "--model applies to grpc:// and OpenAI (/v1/...) targets; the URL names the model"),
        (["demo", "--model", "demo"],
         "--model applies to grpc:// and OpenAI (/v1/...) targets; TARGET is the model"),
    ],
)  # fmt: skip
def test_flags_a_target_has_no_use_for_are_refused(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", *args]) == 2
    assert capsys.readouterr().err == f"carpool bench: {message}\n"


# ----------------------------------------------------------------------------- carpool serve


@pytest.fixture(scope="module")
def minilm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    launcher = Launcher(tmp_path_factory.mktemp("servers"))
    yield launcher("minilm")
    launcher.close()


@pytest.mark.slow  # loading the model and its tokenizer takes 10-20 s
@pytest.mark.parametrize("encoding", ["float", "base64"])
def test_carpool_bench_against_carpool_serves_embeddings(
    minilm: Server, encoding: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    texts = tmp_path / "texts.txt"
    texts.write_text("hello\nA short sentence about batching.\n")
    path = tmp_path / "openai.json"
    url = f"{minilm.url}/v1/embeddings"
    code = main(["bench", url, "--concurrency", "4", "--requests", "40", "--warmup", "0",
                 "--strings", str(texts), "--encoding", encoding, "--json", str(path)])  # fmt: skip
    out, err = capsys.readouterr()
    assert (code, err) == (0, ""), out
    report = Report.load(path)
    assert (report.kind, report.model, report.target) == ("openai", "minilm", url)
    assert report.settings["encoding"] == encoding
    (step,) = report.steps
    assert (step.requests, step.ok, step.errors) == (40, 40, {})
    assert step.server is not None  # carpool's /metrics describes the model behind it
    assert step.server.rows == 40
    assert f"minilm on {url} (openai)" in out


@pytest.mark.slow
def test_what_bench_sends_is_what_the_endpoint_embeds(minilm: Server) -> None:
    (body,) = embedding_bodies(["hello"], model="minilm", count=1, encoding="base64")
    answer: dict[str, Any] = minilm.http.post(
        "/v1/embeddings", content=body, headers={"Content-Type": "application/json"}
    ).json()
    (item,) = answer["data"]
    vector = np.frombuffer(base64.b64decode(item["embedding"]), "<f4")
    assert (answer["model"], item["index"], vector.shape) == ("minilm", 0, (384,))
    assert np.isclose(np.linalg.norm(vector), 1.0, atol=1e-5)
