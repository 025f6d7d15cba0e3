"""OpenAI's text generation on a real ``carpool serve smollm2``, through the official ``openai``
client, sync and async, streamed and not: greedy text the same every way, usage exact (the
prompt's tokens as the model's tokenizer counts them), each parameter, stop strings split over
tokens, ``n`` and prompt lists, errors in OpenAI's shape, a client that leaves mid-stream, and
the same through two front-end processes."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from functools import cache
from typing import Any

import openai
import pytest

from carpool.backends.generation import Message, Prompt
from server.conftest import Launcher, Server, wait_until

# Slow: a server's start, and reading smollm2's tokenizer from its GGUF to count prompts.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

USER = "What is the capital of France?"
CHAT = [{"role": "user", "content": USER}]
GREEDY: dict[str, Any] = {"max_tokens": 6, "temperature": 0, "seed": 3}


@pytest.fixture(scope="module")
def server(serve_module: Launcher, tmp_path_factory: pytest.TempPathFactory) -> Server:
    config = tmp_path_factory.mktemp("generation") / "carpool.toml"
    config.write_text("[models.smollm2]\nmax_sequences = 4\n")
    return serve_module("smollm2", "--config", str(config), "--max-client-batch-size", "4")


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60.0
    ) as client:
        yield client


@cache
def prompt_tokens(prompt: Prompt) -> int:
    """The prompt's tokens as smollm2's own tokenizer counts them."""
    from carpool.backends.smollm2.files import gguf_path
    from carpool.backends.smollm2.text import TextCodec
    from carpool.backends.smollm2.weights import read_gguf

    return len(TextCodec(read_gguf(gguf_path())).prompt_ids(prompt))


def chat_stream(client: openai.OpenAI, **kwargs: Any) -> list[Any]:
    return list(
        client.chat.completions.create(model="smollm2", messages=CHAT, stream=True, **kwargs)
    )


def test_greedy_chat_is_the_same_streamed_or_not_and_its_usage_is_exact(
    client: openai.OpenAI,
) -> None:
    whole = client.chat.completions.create(model="smollm2", messages=CHAT, **GREEDY)
    again = client.chat.completions.create(model="smollm2", messages=CHAT, **GREEDY)
    (choice,) = whole.choices
    assert whole.object == "chat.completion"
    assert whole.id.startswith("chatcmpl-")
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert again.choices[0].message.content == choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert whole.usage is not None
    assert whole.usage.prompt_tokens == prompt_tokens(Prompt(messages=(Message("user", USER),)))
    assert 1 <= whole.usage.completion_tokens <= 6
    total = whole.usage.prompt_tokens + whole.usage.completion_tokens
    assert whole.usage.total_tokens == total

    chunks = chat_stream(client, stream_options={"include_usage": True}, **GREEDY)
    assert {c.id for c in chunks} == {chunks[0].id}
    assert {c.created for c in chunks} == {chunks[0].created}
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    first, *middle, usage = chunks
    assert first.choices[0].delta.role == "assistant"
    assert first.choices[0].delta.content == ""
    assert "".join(c.choices[0].delta.content or "" for c in middle) == choice.message.content
    assert middle[-1].choices[0].finish_reason == choice.finish_reason
    assert usage.choices == []
    assert usage.usage == whole.usage
    assert all(c.usage is None for c in chunks[:-1])


def test_completions_of_a_prompt_list_with_n_choices_each(client: openai.OpenAI) -> None:
    sampled: dict[str, Any] = {"max_tokens": 4, "temperature": 0.9, "top_p": 0.95}
    prompts = ["The sky is", "My favourite food is"]
    both = client.completions.create(model="smollm2", prompt=prompts, n=2, seed=7, **sampled)
    assert both.object == "text_completion"
    assert both.id.startswith("cmpl-")
    assert [c.index for c in both.choices] == [0, 1, 2, 3]
    for index, prompt in enumerate(prompts):
        for offset in (0, 1):  # choice i samples as a lone request with seed + i does
            alone = client.completions.create(
                model="smollm2", prompt=prompt, seed=7 + offset, **sampled
            )
            assert both.choices[2 * index + offset].text == alone.choices[0].text
    assert both.usage is not None
    counted = sum(prompt_tokens(Prompt(text=p, chat=False)) for p in prompts)
    assert both.usage.prompt_tokens == counted  # once per prompt, not per choice
    assert both.usage.completion_tokens <= 16


def test_max_tokens_ends_with_length_and_user_and_max_completion_tokens_pass(
    client: openai.OpenAI,
) -> None:
    text = client.completions.create(model="smollm2", prompt="One, two, three,", max_tokens=2)
    assert text.choices[0].finish_reason == "length"
    assert text.usage is not None
    assert text.usage.completion_tokens == 2
    chat = client.chat.completions.create(
        model="smollm2", messages=CHAT, max_completion_tokens=2, user="someone", temperature=0
    )
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage is not None
    assert chat.usage.completion_tokens == 2


def test_a_stop_string_split_over_tokens_is_not_returned(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {**GREEDY, "max_tokens": 8}
    pieces = [c.choices[0].delta.content or "" for c in chat_stream(client, **kwargs)]
    pieces = [p for p in pieces if p]
    at = next(i for i in range(1, len(pieces)) if len(pieces[i - 1]) > 1 and pieces[i])
    stop = pieces[at - 1][-1] + pieces[at][0]  # ends one token, begins the next
    full = "".join(pieces)
    expected = full[: full.index(stop)]
    whole = client.chat.completions.create(
        model="smollm2", messages=CHAT, stop=[stop, "zzzz"], **kwargs
    )
    assert whole.choices[0].message.content == expected
    assert whole.choices[0].finish_reason == "stop"
    streamed = chat_stream(client, stop=stop, **kwargs)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == expected
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_the_async_client_streams_and_answers_side_by_side(server: Server) -> None:
    async def both() -> tuple[str, str]:
        async with openai.AsyncOpenAI(
            base_url=f"{server.url}/v1", api_key="unused", max_retries=0
        ) as client:

            async def streamed() -> str:
                stream = await client.completions.create(
                    model="smollm2", prompt="Paris is", stream=True, **GREEDY
                )
                return "".join([c.choices[0].text async for c in stream])

            async def whole() -> str:
                answer = await client.completions.create(
                    model="smollm2", prompt="Paris is", **GREEDY
                )
                return answer.choices[0].text

            return await asyncio.gather(streamed(), whole())

    streamed, whole = asyncio.run(both())
    assert streamed == whole
    assert whole


@pytest.mark.parametrize(
    ("kwargs", "error", "param"),
    [
        ({"extra_body": {"frobnicate": 1}}, openai.BadRequestError, "frobnicate"),
        ({"logprobs": True}, openai.BadRequestError, "logprobs"),
        ({"presence_penalty": 0.5}, openai.BadRequestError, "presence_penalty"),
        ({"temperature": "hot"}, openai.BadRequestError, "temperature"),
        (
            {"messages": [{"role": "tool", "content": "x"}]},
            openai.BadRequestError,
            "messages[0].role",
        ),
        ({"n": 5}, openai.APIStatusError, "n"),
        ({"model": "nope"}, openai.NotFoundError, "model"),
        ({"max_tokens": 5000}, openai.BadRequestError, "max_tokens"),
    ],
)
def test_refusals_are_openais_errors_naming_the_field(
    client: openai.OpenAI, kwargs: dict[str, Any], error: type[openai.APIStatusError], param: str
) -> None:
    request = {"model": "smollm2", "messages": CHAT, "max_tokens": 2, **kwargs}
    with pytest.raises(error) as caught:
        client.chat.completions.create(**request)
    assert caught.value.param == param  # type: ignore[attr-defined]
    if kwargs.get("n") == 5:
        assert caught.value.status_code == 413
        assert caught.value.code == "too_many_inputs"  # type: ignore[attr-defined]


def test_defaults_of_unsupported_fields_pass(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(
        model="smollm2", messages=CHAT, max_tokens=1, logprobs=False, presence_penalty=0
    )
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 1


def test_models_lists_the_generation_model(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["smollm2"]
    assert client.models.retrieve("smollm2").id == "smollm2"


def metric(server: Server, pattern: str) -> float:
    text = server.http.get("/metrics").text
    found = re.search(rf"^{pattern} (\S+)$", text, re.M)
    assert found is not None, text
    return float(found.group(1))


ACTIVE = 'carpool_active_sequences{model="smollm2"}'
ANSWERED = r'carpool_requests_total\{model="smollm2",outcome="success",protocol="openai"\}'


def test_a_client_that_leaves_mid_stream_frees_every_slot(server: Server) -> None:
    body = {"model": "smollm2", "messages": CHAT, "max_tokens": 400, "n": 2, "stream": True}
    before = metric(server, ANSWERED)
    with server.http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        lines = response.iter_lines()  # kept: a dropped iterator closes the connection
        first = json.loads(next(lines).removeprefix("data: "))
        assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert metric(server, ACTIVE) == 2.0
    wait_until(lambda: metric(server, ACTIVE) == 0.0, "the left stream's slots freed", within=10)
    assert metric(server, ANSWERED) == before  # a 499, not a success
    answered = server.http.post(
        "/v1/completions", json={"model": "smollm2", "prompt": "x", "max_tokens": 1, "n": 2}
    )
    assert answered.status_code == 200
    assert metric(server, ANSWERED) == before + 1  # one request, two sequences: counted once


def test_through_two_front_ends(serve: Launcher, tmp_path: Any) -> None:
    config = tmp_path / "carpool.toml"
    config.write_text("[models.smollm2]\nmax_sequences = 4\n")
    server = serve("smollm2", "--config", str(config), "--frontends", "2")
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as client:
        whole = client.chat.completions.create(model="smollm2", messages=CHAT, n=2, **GREEDY)
        chunks = chat_stream(client, n=2, **GREEDY)
    texts = [
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices[0].index == i)
        for i in (0, 1)
    ]
    assert texts == [c.message.content for c in whole.choices]
    assert texts[0] == texts[1]  # greedy: the derived seed changes nothing
