"""``carpool.server.openai.generation`` and ``answers``: OpenAI's chat and completions bodies to
v2 rows and parameters, each refusal naming its field, and steps to OpenAI's answers and
chunks, with no server."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from carpool.backends.smollm2.served import smollm2_model
from carpool.server.openai.answers import DONE, Completion
from carpool.server.openai.codec import OpenAIError
from carpool.server.openai.generation import (
    Kind,
    Posted,
    Step,
    decode_generation,
    parse,
    posted,
    row_parameters,
)
from carpool.server.statuses import Status
from server.step_models import words

MODEL = smollm2_model("torch")
CHAT = [{"role": "user", "content": "hi"}]


def post(kind: Kind = "chat", **doc: Any) -> Posted:
    body = {"model": "smollm2", **({"messages": CHAT} if kind == "chat" else {}), **doc}
    return posted(orjson.dumps(body), kind)


def refused(kind: Kind, limit: int | None = None, **doc: Any) -> OpenAIError:
    with pytest.raises(OpenAIError) as caught:
        parse(post(kind, **doc), limit)
    return caught.value


def test_a_chat_is_one_empty_row_per_choice_with_its_turns_as_a_parameter() -> None:
    p = post(
        messages=[
            {
                "role": "system",
                "content": [{"type": "text", "text": "be"}, {"type": "text", "text": " brief"}],
            },
            *CHAT,
        ],
        n=2,
    )
    assert p.id.startswith("chatcmpl-")
    assert p.created > 0
    request = decode_generation(MODEL, p)
    (tensor,) = request.inputs
    assert tensor.name == "text_input"
    assert tensor.shape == (2, 1)
    assert tensor.data.reshape(-1).tolist() == [b"", b""]
    assert request.parameters == {
        "chat": True,
        "messages": [{"role": "system", "content": "be brief"}, *CHAT],
    }


def test_prompts_are_rows_prompt_by_prompt_n_each_with_openais_max_tokens() -> None:
    p = post("text", prompt=["a", "b"], n=2, seed=5, stop="\n", temperature=0, top_p=0.5)
    request = decode_generation(MODEL, p)
    assert request.inputs[0].data.reshape(-1).tolist() == [b"a", b"a", b"b", b"b"]
    given = {"chat": False, "max_tokens": 16, "seed": 5, "stop": ["\n"]}
    assert request.parameters == {**given, "temperature": 0.0, "top_p": 0.5}
    seeds = [row_parameters(p, request.parameters, row)["seed"] for row in range(4)]
    assert seeds == [5, 6, 5, 6]  # choice i samples with seed + i, whatever its prompt


def test_max_completion_tokens_stands_for_max_tokens_and_defaults_and_nulls_pass() -> None:
    assert parse(post(max_completion_tokens=3)).parameters["max_tokens"] == 3
    assert parse(post(max_tokens=3, max_completion_tokens=3)).parameters["max_tokens"] == 3
    defaults = {"logprobs": False, "presence_penalty": 0, "frequency_penalty": 0.0, "tools": None}
    assert parse(post(**defaults, user="u", stream=None)).parameters == {
        "chat": True,
        "messages": CHAT,
    }
    assert parse(post("text", prompt="x", echo=False, best_of=1, logprobs=None)).n == 1


def test_stream_options_ask_for_usage_only_on_a_stream() -> None:
    assert parse(post(stream=True, stream_options={"include_usage": True})).include_usage
    assert not parse(post(stream=True)).include_usage
    assert refused("chat", stream_options={"include_usage": True}).param == "stream_options"
    error = refused("chat", stream=True, stream_options={"x": 1})
    assert (error.param, error.code) == ("stream_options.x", "unknown_parameter")


@pytest.mark.parametrize(
    ("kind", "doc", "param", "code"),
    [
        ("chat", {"frobnicate": 1}, "frobnicate", "unknown_parameter"),
        ("chat", {"logprobs": True}, "logprobs", "unsupported_parameter"),
        ("chat", {"presence_penalty": 0.5}, "presence_penalty", "unsupported_parameter"),
        ("chat", {"tools": [{"type": "function"}]}, "tools", "unsupported_parameter"),
        (
            "chat",
            {"response_format": {"type": "json_object"}},
            "response_format",
            "unsupported_parameter",
        ),
        ("chat", {"logit_bias": {"1": 2}}, "logit_bias", "unsupported_parameter"),
        ("chat", {"prompt": "x"}, "prompt", "unknown_parameter"),
        ("text", {"prompt": "x", "echo": True}, "echo", "unsupported_parameter"),
        ("text", {"prompt": "x", "suffix": "y"}, "suffix", "unsupported_parameter"),
        ("text", {"prompt": "x", "best_of": 2}, "best_of", "unsupported_parameter"),
        ("text", {"prompt": "x", "messages": CHAT}, "messages", "unknown_parameter"),
        ("text", {"prompt": [1, 2]}, "prompt", "unsupported_value"),
        ("text", {"prompt": 3}, "prompt", "invalid_type"),
        ("text", {"prompt": ""}, "prompt", "invalid_value"),
        ("text", {}, "prompt", "missing_required_parameter"),
        ("chat", {"messages": []}, "messages", "invalid_type"),
        (
            "chat",
            {"messages": [{"role": "tool", "content": "x"}]},
            "messages[0].role",
            "invalid_value",
        ),
        (
            "chat",
            {"messages": [{"role": "user", "content": "x", "name": "a"}]},
            "messages[0].name",
            "unsupported_parameter",
        ),
        (
            "chat",
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content",
            "invalid_type",
        ),
        ("chat", {"max_tokens": "5"}, "max_tokens", "invalid_type"),
        ("chat", {"max_tokens": 0}, "max_tokens", "invalid_value"),
        (
            "chat",
            {"max_tokens": 2, "max_completion_tokens": 3},
            "max_completion_tokens",
            "invalid_value",
        ),
        ("chat", {"temperature": 3}, "temperature", "invalid_value"),
        ("chat", {"temperature": True}, "temperature", "invalid_type"),
        ("chat", {"top_p": "1"}, "top_p", "invalid_type"),
        ("chat", {"seed": 1.5}, "seed", "invalid_type"),
        ("chat", {"stop": ["a", "b", "c", "d", "e"]}, "stop", "invalid_value"),
        ("chat", {"stop": 7}, "stop", "invalid_type"),
        ("chat", {"n": 0}, "n", "invalid_value"),
        ("chat", {"n": 129}, "n", "too_many_inputs"),
        ("chat", {"stream": "yes"}, "stream", "invalid_type"),
        ("chat", {"user": 5}, "user", "invalid_type"),
        ("chat", {"model": 5}, "model", "invalid_type"),
    ],
)
def test_each_refusal_names_its_field(
    kind: Kind, doc: dict[str, Any], param: str, code: str
) -> None:
    error = refused(kind, **doc)
    assert (error.param, error.code) == (param, code)
    too_many = code == "too_many_inputs"
    assert error.status == (Status.CONTENT_TOO_LARGE if too_many else Status.BAD_REQUEST)


def test_the_client_batch_limit_bounds_prompts_n_and_their_product() -> None:
    assert refused("text", 2, prompt=["a", "b", "c"]).param == "prompt"
    assert refused("chat", 2, n=3).param == "n"
    error = refused("text", 3, prompt=["a", "b"], n=2)
    assert (error.param, error.status) == ("n", Status.CONTENT_TOO_LARGE)
    assert parse(post("text", prompt=["a", "b"], n=1), 2).rows == 2


def test_only_a_text_generating_model_that_opted_in_is_served() -> None:
    with pytest.raises(OpenAIError) as caught:
        decode_generation(words, post())
    assert (caught.value.param, caught.value.status) == ("model", Status.NOT_FOUND)


def steps(*rows: tuple[int, str, str | None, int, int]) -> list[Step]:
    return [Step(*row) for row in rows]


def test_a_whole_chat_answer_counts_each_prompt_once() -> None:
    completion = Completion(post(n=2))
    for step in steps(
        (0, "Hel", None, 7, 1),
        (1, "Hi", None, 7, 1),
        (0, "lo", "stop", 0, 2),
        (1, "", "length", 0, 1),
    ):
        completion.add(step)
    body = orjson.loads(completion.body())
    assert body["object"] == "chat.completion"
    assert body["model"] == "smollm2"
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello", "refusal": None},
            "logprobs": None,
            "finish_reason": "stop",
        },
        {
            "index": 1,
            "message": {"role": "assistant", "content": "Hi", "refusal": None},
            "logprobs": None,
            "finish_reason": "length",
        },
    ]
    assert body["usage"] == {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}


def test_a_chat_stream_opens_each_choice_then_sends_text_and_the_usage_chunk() -> None:
    p = post(n=2, stream=True, stream_options={"include_usage": True})
    completion = Completion(p)
    sent = [orjson.loads(c) for c in completion.chunks(Step(1, "", None, 4, 1))]
    assert [c["choices"][0]["delta"] for c in sent] == [{"role": "assistant", "content": ""}] * 2
    assert [c["choices"][0]["index"] for c in sent] == [0, 1]
    assert all(c["id"] == p.id and c["created"] == p.created and c["usage"] is None for c in sent)
    (last,) = [orjson.loads(c) for c in completion.chunks(Step(0, "x", "stop", 4, 1))]
    assert last["object"] == "chat.completion.chunk"
    assert last["choices"] == [
        {"index": 0, "delta": {"content": "x"}, "logprobs": None, "finish_reason": "stop"}
    ]
    assert completion.chunks(Step(1, "", "length", 0, 1))[0].count(b'"delta":{}') == 1
    usage, done = completion.closing()
    assert done == DONE
    assert orjson.loads(usage)["choices"] == []
    assert orjson.loads(usage)["usage"] == {
        "prompt_tokens": 4,
        "completion_tokens": 3,
        "total_tokens": 7,
    }


def test_a_text_stream_sends_text_chunks_and_done() -> None:
    completion = Completion(post("text", prompt=["a", "b"], stream=True))
    assert completion.chunks(Step(0, "", None, 1, 1)) == []  # held back: no chunk
    (chunk,) = [orjson.loads(c) for c in completion.chunks(Step(1, "z", None, 1, 1))]
    assert chunk["object"] == "text_completion"
    assert "usage" not in chunk
    assert chunk["choices"] == [{"index": 1, "text": "z", "logprobs": None, "finish_reason": None}]
    assert completion.closing() == [DONE]
    assert np.array_equal(completion.usage()["prompt_tokens"], 2)
