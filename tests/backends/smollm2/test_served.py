"""smollm2's request parameters: each becomes the Prompt's setting, and each refusal names
its field (the server answers 400 with it)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from carpool.backends.cpu_features import CpuFeatures
from carpool.backends.generation import Message, Piece, Prompt
from carpool.backends.smollm2.served import default_engine, prompt_of, smollm2_model
from carpool.errors import ConfigError


def row(text: str) -> dict[str, np.ndarray[Any, Any]]:
    return {"text_input": np.array([text.encode()], dtype=object)}


def test_defaults_and_every_parameter() -> None:
    assert prompt_of(row("hi"), {}) == Prompt(text="hi", max_tokens=128)
    given = {"max_tokens": 5, "temperature": 0, "top_p": 0.5, "seed": 7, "stop": "\n"}
    assert prompt_of(row("hi"), given) == Prompt(
        text="hi", max_tokens=5, temperature=0.0, top_p=0.5, seed=7, stop=("\n",)
    )
    assert prompt_of(row("x"), {"stop": '["a", "bc"]', "chat": False}).stop == ("a", "bc")
    assert prompt_of(row("x"), {"chat": False}).chat is False


@pytest.mark.parametrize(
    ("parameters", "field", "message"),
    [
        ({"max_tokens": 0}, "parameters.max_tokens", "max_tokens must be an int from 1"),
        ({"max_tokens": 2.5}, "parameters.max_tokens", "max_tokens must be an int"),
        ({"temperature": -1}, "parameters.temperature", "temperature must be a number"),
        ({"temperature": True}, "parameters.temperature", "temperature must be a number"),
        ({"top_p": 0}, "parameters.top_p", "top_p must be > 0"),
        ({"seed": "7"}, "parameters.seed", "seed must be an int"),
        ({"stop": ""}, "parameters.stop", "stop must be a non-empty string"),
        ({"stop": '["a","b","c","d","e"]'}, "parameters.stop", "a list of 1 to 4"),
        ({"chat": "yes"}, "parameters.chat", "chat must be true or false"),
        ({"n": 2}, "parameters.n", "smollm2 takes the parameters"),
        ({"messages": []}, "parameters.messages", "messages must be a non-empty list"),
        ({"messages": '[{"role": "tool", "content": "x"}]'}, "parameters.messages[0]", "role one"),
        ({"messages": [{"role": "user"}]}, "parameters.messages[0]", "content a string"),
    ],
)
def test_refusals_name_the_field(parameters: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as refused:
        prompt_of(row("hi"), parameters)
    assert refused.value.args[1] == field


def test_messages_are_a_chat_given_as_a_list_or_as_json_text() -> None:
    turns = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    expected = (Message("system", "Be brief."), Message("user", "Hi"))
    assert prompt_of(row(""), {"messages": turns}).messages == expected
    assert prompt_of(row(""), {"messages": json.dumps(turns)}).messages == expected
    with pytest.raises(ValueError, match="not both") as refused:
        prompt_of(row("hi"), {"messages": turns})
    assert refused.value.args[1] == "text_input"


def test_scheduling_parameters_pass() -> None:
    assert prompt_of(row("hi"), {"priority": 1, "timeout": 1000}).text == "hi"


def test_rows_become_text_and_answers() -> None:
    model = smollm2_model("torch")
    assert model.max_sequences == 16
    assert model.response is not None
    assert model.whole is not None
    assert model.openai
    first = model.response(Piece("Hel", prompt_tokens=9))
    assert {name: value.tolist() for name, value in first.items()} == {
        "text_output": [b"Hel"],
        "finish_reason": [b""],
        "num_input_tokens": [9],
        "num_output_tokens": [1],
    }
    assert model.response(Piece("", tokens=1, finish_reason="length"))[
        "finish_reason"
    ].tolist() == [b"length"]
    whole = model.whole([Piece("Hel", prompt_tokens=9), Piece("lo", finish_reason="stop")])
    assert {name: value.tolist() for name, value in whole.items()} == {
        "text_output": [b"Hello"],
        "finish_reason": [b"stop"],
        "num_input_tokens": [9],
        "num_output_tokens": [2],
    }
    assert [t.name for t in model.output_specs] == list(whole)


def test_an_unknown_engine_is_refused() -> None:
    with pytest.raises(ConfigError, match="smollm2 engine must be one of"):
        smollm2_model("vllm")


@pytest.mark.parametrize(
    ("machine", "flags", "engine"),
    [
        ("x86_64", {"avx2", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni"}, "torch"),
        ("x86_64", {"avx2", "avx_vnni"}, "torch"),
        ("aarch64", set(), "torch"),
        ("x86_64", {"avx2"}, "torch"),  # an EPYC with AVX2 only: fbgemm's kernels
        ("x86_64", {"avx2", "avx512bw", "avx512dq", "avx512vl"}, "torch"),
        ("x86_64", {"sse4_2", "avx"}, "torch-fp32"),  # no AVX2: fbgemm's reference code
        ("x86_64", set(), "torch-fp32"),  # flags unknown
    ],
)
def test_the_default_engine_is_int8_where_its_kernels_run_fast(
    machine: str, flags: set[str], engine: str
) -> None:
    assert default_engine(CpuFeatures(machine, frozenset(flags))) == engine
