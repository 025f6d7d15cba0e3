"""``carpool.server.openai.codec``: OpenAI's embeddings bodies to carpool's records and back, and
its
error body, with no server: bytes and records in, bytes and records out."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import numpy as np
import orjson
import pytest

from carpool import Model, Tensor
from carpool.errors import QueueFull
from carpool.server.failures import ModelNotFound, ModelUnavailable
from carpool.server.inference.admission import admit
from carpool.server.inference.outcomes import error_status
from carpool.server.messages import ProtocolError
from carpool.server.openai.codec import (
    EmbeddingsRequest,
    OpenAIError,
    check_opted_in,
    encode_embeddings,
    encode_error,
    infer_request,
    json_body,
    model_entry,
    model_list,
    model_name,
    parse_embeddings,
    prompt_tokens,
)
from carpool.server.statuses import HTTPError

Array = np.ndarray[Any, Any]


def _vectors(batch: Array) -> Array:
    return np.array([[len(bytes(t)), 1.0] for t in batch.reshape(-1)], dtype=np.float32)


def _words(inputs: Any) -> int:
    return sum(len(bytes(t).split()) for t in inputs["TEXT"].reshape(-1))


TEXT_TO_VECTOR = Model(
    _vectors,
    name="m",
    inputs=[Tensor("TEXT", "BYTES", (1,))],
    outputs=[Tensor("VECTOR", "FP32", (2,))],
    openai=True,
)


def request(**fields: Any) -> EmbeddingsRequest:
    return parse_embeddings({"model": "m", **fields})


def refused(call: Any, *, param: str | None, code: str, message: str) -> OpenAIError:
    with pytest.raises(OpenAIError, match=f"^{re.escape(message)}$") as info:
        call()
    assert (info.value.param, info.value.code, info.value.status) == (param, code, 400)
    return info.value


# ----------------------------------------------------------------- request bodies


def test_a_string_is_one_text_and_a_list_is_k() -> None:
    assert request(input="hi") == EmbeddingsRequest("m", ("hi",), False, False, None, None)
    parsed = request(input=["a", "", "ü"], encoding_format="base64", user="u", dimensions=2)
    assert parsed == EmbeddingsRequest("m", ("a", "", "ü"), False, True, 2, "u")
    assert request(input="x", encoding_format="float", user=None).base64 is False


@pytest.mark.parametrize("tokens", [[1, 2, 3], [[1, 2], [3]], [[]]])
def test_token_ids_are_recognised(tokens: Any) -> None:
    assert request(input=tokens) == EmbeddingsRequest("m", (), True, False, None, None)


LIST = "input must be a string or a list of strings, got"
FORMAT = "encoding_format must be 'float' or 'base64', got"
DIMENSIONS = "dimensions must be an integer >= 1, got"
UNKNOWN = "this route takes model, input, encoding_format, dimensions, user"


@pytest.mark.parametrize(
    ("fields", "param", "code", "message"),
    [
        ({}, "input", "missing_required_parameter", "you must provide a input parameter"),
        ({"input": 3}, "input", "invalid_type", f"{LIST} a number"),
        ({"input": {"a": 1}}, "input", "invalid_type", f"{LIST} an object"),
        (
            {"input": []},
            "input",
            "invalid_value",
            "input must not be an empty list: send a string, or a list of at least one string",
        ),
        ({"input": ["a", None]}, "input", "invalid_type", "input[1] must be a string, got null"),
        ({"input": [1, "a"]}, "input", "invalid_type", "input[0] must be a string, got a number"),
        ({"input": [True]}, "input", "invalid_type", "input[0] must be a string, got a boolean"),
        (
            {"input": "a", "encoding_format": "hex"},
            "encoding_format",
            "invalid_value",
            f'{FORMAT} "hex"',
        ),
        (
            {"input": "a", "encoding_format": 1},
            "encoding_format",
            "invalid_value",
            f"{FORMAT} a number",
        ),
        ({"input": "a", "dimensions": 0}, "dimensions", "invalid_value", f"{DIMENSIONS} 0"),
        ({"input": "a", "dimensions": "8"}, "dimensions", "invalid_value", f'{DIMENSIONS} "8"'),
        ({"input": "a", "dimensions": True}, "dimensions", "invalid_value", f"{DIMENSIONS} true"),
        ({"input": "a", "user": 7}, "user", "invalid_type", "user must be a string, got a number"),
        (
            {"input": "a", "stream": True},
            "stream",
            "unknown_parameter",
            f"unrecognized request argument supplied: stream; {UNKNOWN}",
        ),
    ],
)
def test_bad_fields_are_refused_naming_the_param(
    fields: dict[str, Any], param: str, code: str, message: str
) -> None:
    refused(lambda: request(**fields), param=param, code=code, message=message)


def test_the_body_must_be_a_json_object_naming_a_model() -> None:
    assert json_body(b'{"model": "m"}') == {"model": "m"}
    with pytest.raises(OpenAIError, match=r"^the request body is not valid JSON: ") as info:
        json_body(b"{")
    assert (info.value.param, info.value.code, info.value.status) == (None, "invalid_json", 400)
    refused(
        lambda: json_body(b"[1]"),
        param=None,
        code="invalid_json",
        message="the request body must be a JSON object, got a list",
    )
    assert model_name({"model": "m"}) == "m"
    refused(
        lambda: model_name({"input": "a"}),
        param="model",
        code="missing_required_parameter",
        message="you must provide a model parameter",
    )
    for name, kind in (("", "a string"), (3, "a number")):
        refused(
            lambda name=name: model_name({"model": name}),
            param="model",
            code="invalid_type",
            message=f"model must be a model's name (a string), got {kind}",
        )


# ----------------------------------------------------------------- into the inference path


def test_texts_become_one_v2_request_of_k_rows_the_model_admits() -> None:
    texts = ("a b", "", "汽车")
    infer = infer_request(TEXT_TO_VECTOR, request(input=list(texts)))
    (tensor,) = infer.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("TEXT", "BYTES", (3, 1))
    assert tensor.data.reshape(-1).tolist() == [t.encode() for t in texts]
    assert (infer.outputs, infer.parameters, infer.binary_data_output) == (None, {}, False)
    admitted = admit(TEXT_TO_VECTOR, infer)
    assert admitted.rows == 3
    assert admitted.outputs == (("VECTOR", False),)


def test_a_text_ending_in_nul_keeps_it() -> None:
    (tensor,) = infer_request(TEXT_TO_VECTOR, request(input=["a\x00", "bc"])).inputs
    assert tensor.data.reshape(-1).tolist() == [b"a\x00", b"bc"]


def test_an_input_of_shape_nothing_gets_rows_of_one_string() -> None:
    model = Model(
        _vectors,
        name="m",
        inputs=[Tensor("TEXT", "BYTES", ())],
        outputs=[Tensor("VECTOR", "FP32", (2,))],
        openai=True,
    )
    (tensor,) = infer_request(model, request(input=["a", "b"])).inputs
    assert tensor.shape == (2,)
    assert admit(model, infer_request(model, request(input=["a", "b"]))).rows == 2


def test_token_ids_and_dimensions_the_model_cannot_give_are_refused() -> None:
    refused(
        lambda: infer_request(TEXT_TO_VECTOR, request(input=[1, 2])),
        param="input",
        code="unsupported_value",
        message="model 'm' takes text, not token ids: send input as a string or a list of strings",
    )
    refused(
        lambda: infer_request(TEXT_TO_VECTOR, request(input="a", dimensions=1)),
        param="dimensions",
        code="unsupported_parameter",
        message="model 'm' cannot shorten its embeddings to 1 dimensions: leave dimensions "
        "out (or send 2)",
    )
    # Asking for the size the model gives anyway is no change.
    assert infer_request(TEXT_TO_VECTOR, request(input="a", dimensions=2)).inputs[0].shape == (
        1,
        1,
    )


def test_a_lone_surrogate_is_refused_naming_the_row() -> None:
    # JSON bodies cannot carry one (orjson refuses it); a document built otherwise can.
    with pytest.raises(OpenAIError, match="no low surrogate in string"):
        json_body(b'{"model": "m", "input": ["ok", "\\ud800"]}')
    refused(
        lambda: infer_request(TEXT_TO_VECTOR, request(input=["ok", "\ud800"])),
        param="input",
        code="invalid_value",
        message="input[1] is not valid Unicode: surrogates not allowed at character 0",
    )


def test_prompt_tokens_come_from_the_models_count() -> None:
    infer = infer_request(TEXT_TO_VECTOR, request(input=["a b", "c"]))
    assert prompt_tokens(TEXT_TO_VECTOR, admit(TEXT_TO_VECTOR, infer).value) == 0  # no count: 0
    counting = Model(
        _vectors,
        name="m",
        inputs=[Tensor("TEXT", "BYTES", (1,))],
        outputs=[Tensor("VECTOR", "FP32", (2,))],
        count_tokens=_words,
    )
    assert prompt_tokens(counting, admit(counting, infer).value) == 3


def test_a_model_that_has_not_opted_in_is_not_found() -> None:
    check_opted_in(TEXT_TO_VECTOR)
    model = Model(_vectors, name="v2only")
    with pytest.raises(OpenAIError) as info:
        check_opted_in(model)
    assert (info.value.status, info.value.param, info.value.code) == (
        404,
        "model",
        "model_not_found",
    )
    assert error_status(info.value).status == 404
    assert "([models.v2only] openai = true" in str(info.value)


# ----------------------------------------------------------------- response bodies


VECTORS = np.array([[0.1, -2.5, 1 / 3], [3.4e38, 0.0, -1e-38]], dtype=np.float32)


def test_floats_are_each_rows_float32_values_in_order() -> None:
    doc = orjson.loads(encode_embeddings(model="m", vectors=VECTORS, base64=False, prompt_tokens=7))
    assert doc["object"] == "list"
    assert doc["model"] == "m"
    assert doc["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    assert [(d["object"], d["index"]) for d in doc["data"]] == [("embedding", 0), ("embedding", 1)]
    got = np.array([d["embedding"] for d in doc["data"]], dtype=np.float32)
    assert got.tobytes() == VECTORS.tobytes()  # every float32 comes back exactly


def test_base64_is_each_rows_little_endian_float32_bytes() -> None:
    big_endian = VECTORS.astype(">f4")
    doc = orjson.loads(
        encode_embeddings(model="m", vectors=big_endian, base64=True, prompt_tokens=0)
    )
    rows = [base64.b64decode(d["embedding"]) for d in doc["data"]]
    assert rows == [row.astype("<f4").tobytes() for row in VECTORS]


def test_models_list_shape() -> None:
    entry = model_entry("minilm", 1_700_000_000)
    assert entry == {
        "id": "minilm",
        "object": "model",
        "created": 1_700_000_000,
        "owned_by": "carpool",
    }
    assert model_list([entry]) == {"object": "list", "data": [entry]}
    assert model_list([]) == {"object": "list", "data": []}


# ----------------------------------------------------------------- error bodies


def error_body(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """The status and the body the app sends for ``exc``: the one table's status."""
    error = error_status(exc)
    return error.status, json.loads(encode_error(exc, error))


def test_an_openai_error_names_its_param_and_code() -> None:
    exc = OpenAIError("bad", param="input", code="invalid_type")
    assert error_body(exc) == (
        400,
        {
            "error": {
                "message": "bad",
                "type": "invalid_request_error",
                "param": "input",
                "code": "invalid_type",
            }
        },
    )
    assert isinstance(exc, ProtocolError)  # so the one status table answers it


@pytest.mark.parametrize(
    ("exc", "status", "param", "code"),
    [
        (ModelNotFound("x"), 404, "model", "model_not_found"),
        (ModelUnavailable("x", "broken"), 400, "model", "model_not_ready"),
        (ProtocolError("row 0 is not UTF-8", field="TEXT"), 400, "input", "invalid_value"),
        (ProtocolError("too big", field="body", status=413), 413, None, "request_too_large"),
        (HTTPError(405, "Method Not Allowed"), 405, None, "method_not_allowed"),
        (HTTPError(415, "gzip only"), 415, None, "unsupported_encoding"),
        (QueueFull(max_queue_size=4, queued=4, rows=1), 503, None, "unavailable"),
        (RuntimeError("boom"), 500, None, "model_error"),
        (HTTPError(418, "teapot"), 418, None, None),
    ],
)
def test_every_status_of_the_table_in_openais_shape(
    exc: BaseException, status: int, param: str | None, code: str | None
) -> None:
    got_status, body = error_body(exc)
    assert got_status == status
    kind = "server_error" if status >= 500 else "invalid_request_error"
    assert body == {
        "error": {
            "message": error_status(exc).message,  # the v2 routes' message, word for word
            "type": kind,
            "param": param,
            "code": code,
        }
    }


def test_more_texts_than_max_client_batch_size_are_413_before_any_is_read() -> None:
    texts = ["a"] * 33
    assert len(parse_embeddings({"model": "m", "input": texts[:32]}, 32).texts) == 32
    with pytest.raises(OpenAIError) as info:
        parse_embeddings({"model": "m", "input": [*texts, 7]}, 32)  # 34th is never read
    assert str(info.value) == (
        "'input' holds 34 items; at most 32 are taken in one request "
        "(--max-client-batch-size): send them in several requests, or raise the limit"
    )
    assert (info.value.param, info.value.code, info.value.status) == (
        "input",
        "too_many_inputs",
        413,
    )
    assert len(parse_embeddings({"model": "m", "input": list(range(40))}, 32).texts) == 0
    assert len(parse_embeddings({"model": "m", "input": texts}).texts) == 33  # no limit
