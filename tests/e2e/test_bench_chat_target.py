"""An OpenAI-compatible chat endpoint streamed (``carpool.bench.targets.chat_target``): URLs,
the bodies sent, which events are outputs, conversations read from a file, the flags such a
target refuses, and ``carpool bench --stream`` against a small chat server of the test's own
(the scenario ``benchmarks.streams.chat`` runs it against ``carpool serve smollm2``)."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from carpool.bench.report.data import Report
from carpool.bench.targets.base import target_kind
from carpool.bench.targets.chat_target import ChatURL, chat_bodies, chunk_text, parse_chat
from carpool.bench.targets.requests_file import read_conversations
from carpool.cli import main
from server.conftest import free_port

USER = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http://127.0.0.1:8000/v1/chat/completions", ChatURL("http://127.0.0.1:8000")),
        ("http://h:1/v1/chat/completions/", ChatURL("http://h:1")),
        ("https://h/openai/v1/chat/completions", ChatURL("https://h", "/openai")),
    ],
)
def test_chat_urls(text: str, expected: ChatURL) -> None:
    url = parse_chat(text)
    assert url == expected
    assert target_kind(text) == "chat"
    assert url.chat == text.rstrip("/")
    assert url.models == expected.base + expected.prefix + "/v1/models"
    assert url.metrics == expected.base + "/metrics"


def test_a_body_is_a_greedy_stream_of_one_conversation() -> None:
    bodies = chat_bodies([USER, [{"role": "system", "content": "s"}, *USER]], model="m",
                         lengths=[3, None, 5])  # fmt: skip
    assert [json.loads(b) for b in bodies] == [
        {"model": "m", "messages": USER, "stream": True, "temperature": 0, "seed": 0,
         "max_tokens": 3},
        {"model": "m", "messages": [{"role": "system", "content": "s"}, *USER], "stream": True,
         "temperature": 0, "seed": 0},
        {"model": "m", "messages": USER, "stream": True, "temperature": 0, "seed": 0,
         "max_tokens": 5},
    ]  # fmt: skip
    with pytest.raises(ValueError, match=r"^no conversations to send; give at least one$"):
        chat_bodies([], model="m", lengths=[None])


@pytest.mark.parametrize(
    ("line", "text"),
    [
        (b'data: {"choices":[{"delta":{"content":"Hi"}}]}\n', "Hi"),
        (b'data:{"choices":[{"delta":{"content":" there"}}]}\n', " there"),
        (b'data: {"choices":[{"text":"x","index":0}]}\n', "x"),
        (b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n', None),
        (b'data: {"choices":[{"delta":{"content":null}}]}\n', None),
        (b'data: {"choices":[],"usage":{"completion_tokens":3}}\n', None),
        (b"data: [DONE]\n", None),
        (b"\n", None),
        (b": keep-alive\n", None),
    ],
)
def test_only_chunks_with_text_are_outputs(line: bytes, text: str | None) -> None:
    assert chunk_text(line) == text


def test_an_error_event_is_an_error() -> None:
    with pytest.raises(RuntimeError, match=re.escape("{'message': 'boom'}")):
        chunk_text(b'data: {"error": {"message": "boom"}}\n')


def test_conversations_are_read_one_per_line(tmp_path: Path) -> None:
    path = tmp_path / "chats.jsonl"
    path.write_text(json.dumps({"messages": USER}) + "\n\n" + json.dumps({"messages": USER}))
    assert read_conversations(path) == [USER, USER]
    path.write_text('{"messages": []}\n')
    message = f"{str(path)!r}, line 1: expected " + '{"messages": [{"role", "content"}, ...]}'
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        read_conversations(path)
    path.write_text("\n")
    with pytest.raises(ValueError, match=f"^{re.escape(repr(str(path)))} holds no conv"):
        read_conversations(path)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["http://h:1/v1/chat/completions"],
         "a /v1/chat/completions target is streamed: add --stream"),
        (["http://h:1/v1/chat/completions", "--stream", "--shape", "TEXT:1"],
         "--shape describes v2 tensors; /v1/chat/completions takes messages"),
    ],
)  # fmt: skip
def test_flags_a_chat_target_refuses(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", *args]) == 2
    assert capsys.readouterr().err == f"carpool bench: {message}\n"


# ----------------------------------------------------------------------------- a chat server


@pytest.fixture
async def chat_server() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A chat endpoint that streams ``max_tokens`` chunks of one word, as llama-server does:
    a role chunk first, a usage chunk last, then ``[DONE]``; the bodies it was sent."""
    received: list[dict[str, Any]] = []

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "tiny"}]})

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        received.append(body)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunks = [{"choices": [{"delta": {"role": "assistant", "content": ""}}]}]
        chunks += [{"choices": [{"delta": {"content": " w"}}]}] * body["max_tokens"]
        chunks += [{"choices": [], "usage": {"completion_tokens": body["max_tokens"]}}]
        for chunk in chunks:
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}/v1/chat/completions", received
    await runner.cleanup()


async def test_carpool_bench_streams_a_chat_endpoint(
    chat_server: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    import asyncio

    url, received = chat_server
    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps({"messages": [{"role": "system", "content": "S"}, *USER]}))
    path = tmp_path / "chat.json"
    argv = ["bench", url, "--stream", "--concurrency", "2", "--requests", "6", "--warmup", "0",
            "--lengths", "fixed:3", "--input-data", str(chats), "--json", str(path)]  # fmt: skip
    code = await asyncio.to_thread(main, argv)
    assert code == 0
    report = Report.load(path)
    assert (report.kind, report.model, report.target) == ("chat", "tiny", url)
    (step,) = report.steps
    assert (step.requests, step.ok, step.errors) == (6, 6, {})
    assert step.streams is not None
    assert (step.streams.streams, step.streams.outputs) == (6, 18)
    assert step.streams.tpo is not None
    assert step.streams.tpo.count == 12
    assert received[0] == {"model": "tiny", "stream": True, "temperature": 0, "seed": 0,
                           "max_tokens": 3,
                           "messages": [{"role": "system", "content": "S"}, *USER]}  # fmt: skip
