"""OpenAI's embeddings API as carpool's records: request bodies in, response and error bodies
out. ``POST /v1/embeddings`` becomes a v2 :class:`~carpool.server.messages.InferRequest` of k
rows, batched like any other; every error body is ``{"error": {"message", "type", "param",
"code"}}``. Pure: nothing is kept between a request's decoding and its encoding."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from carpool.model import Model
from carpool.server.failures import ModelNotFound, ModelUnavailable
from carpool.server.messages import InferInput, InferRequest, ProtocolError
from carpool.server.statuses import HTTPError, Status, openai_code, openai_type
from carpool.stepwise import StepInputError

__all__ = [
    "OpenAIError",
    "EmbeddingsRequest",
    "json_body",
    "model_name",
    "required",
    "parse_embeddings",
    "check_opted_in",
    "infer_request",
    "decode",
    "wants_base64",
    "prompt_tokens",
    "encode_embeddings",
    "model_entry",
    "model_list",
    "encode_error",
]

_FIELDS = ("model", "input", "encoding_format", "dimensions", "user")
_FORMATS = ("float", "base64")
# JSON's types as Python reads them; bool before int, which it subclasses.
_KINDS: tuple[tuple[type | tuple[type, ...], str], ...] = (
    (bool, "a boolean"),
    ((int, float), "a number"),
    (str, "a string"),
    (list, "a list"),
    (dict, "an object"),
)


class OpenAIError(ProtocolError):
    """A request OpenAI's API refuses: ``param`` is the body field at fault (None for the
    body itself), ``code`` OpenAI's error code (``invalid_type``, ``model_not_found``, ...).

    A :class:`ProtocolError`, so the one status table answers it with ``status``."""

    def __init__(
        self, message: str, *, param: str | None, code: str, status: int = Status.BAD_REQUEST
    ) -> None:
        super().__init__(message, field=param or "body", status=status)
        self.param = param
        self.code = code

    def _fields(self) -> dict[str, Any]:
        return {**super()._fields(), "param": self.param, "code": self.code}


@dataclass(frozen=True, slots=True)
class EmbeddingsRequest:
    """A parsed ``POST /v1/embeddings`` body. ``texts`` is empty when the input was token
    ids (``token_ids``), which no model takes yet; ``user`` is accepted and not used."""

    model: str
    texts: tuple[str, ...]
    token_ids: bool
    base64: bool
    dimensions: int | None
    user: str | None


def json_body(body: bytes) -> dict[str, Any]:
    """The request ``body`` as a JSON object; raises :class:`OpenAIError` (400) if it is not."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise OpenAIError(
            f"the request body is not valid JSON: {exc}", param=None, code="invalid_json"
        ) from None
    if type(doc) is not dict:
        raise OpenAIError(
            f"the request body must be a JSON object, got {_kind(doc)}",
            param=None,
            code="invalid_json",
        )
    return doc


def model_name(doc: dict[str, Any]) -> str:
    """The ``model`` a request names, read first: once it is known, the request counts in
    that model's statistics whatever else is wrong with it. Raises :class:`OpenAIError`."""
    model = required(doc, "model")
    if not isinstance(model, str) or not model:
        raise OpenAIError(
            f"model must be a model's name (a string), got {_kind(model)}",
            param="model",
            code="invalid_type",
        )
    return model


def parse_embeddings(
    doc: dict[str, Any], max_client_batch_size: int | None = None
) -> EmbeddingsRequest:
    """A ``POST /v1/embeddings`` body (:func:`json_body`'s); raises :class:`OpenAIError`
    (400) naming the field at fault, or (413) when ``input`` holds more texts than
    ``max_client_batch_size`` (None: no limit)."""
    unknown = [key for key in doc if key not in _FIELDS]
    if unknown:
        raise OpenAIError(
            f"unrecognized request argument supplied: {unknown[0]}; this route takes "
            f"{', '.join(_FIELDS)}",
            param=unknown[0],
            code="unknown_parameter",
        )
    value = required(doc, "input")
    if max_client_batch_size is not None:
        _check_count(value, max_client_batch_size)
    texts, token_ids = _input(value)
    return EmbeddingsRequest(
        model=model_name(doc),
        texts=texts,
        token_ids=token_ids,
        base64=_encoding_format(doc.get("encoding_format")) == "base64",
        dimensions=_dimensions(doc.get("dimensions")),
        user=_user(doc.get("user")),
    )


def _check_count(value: Any, limit: int) -> None:
    """At most ``limit`` texts (or token lists) in one request, counted before any is read
    (a list of ints is one text's tokens)."""
    if type(value) is list and len(value) > limit and type(value[0]) is not int:
        raise OpenAIError(
            f"'input' holds {len(value)} items; at most {limit} are taken in one request "
            "(--max-client-batch-size): send them in several requests, or raise the limit",
            param="input",
            code="too_many_inputs",
            status=Status.CONTENT_TOO_LARGE,
        )


def required(doc: dict[str, Any], name: str) -> Any:
    """``doc[name]``; raises :class:`OpenAIError` (400) when it is missing or null."""
    if doc.get(name) is None:
        raise OpenAIError(
            f"you must provide a {name} parameter", param=name, code="missing_required_parameter"
        )
    return doc[name]


def _input(value: Any) -> tuple[tuple[str, ...], bool]:
    """The texts, and whether ``value`` was token ids (a list of ints, or of lists of ints)."""
    if isinstance(value, str):
        return (value,), False
    if not isinstance(value, list):
        raise OpenAIError(
            f"input must be a string or a list of strings, got {_kind(value)}",
            param="input",
            code="invalid_type",
        )
    if not value:
        raise OpenAIError(
            "input must not be an empty list: send a string, or a list of at least one string",
            param="input",
            code="invalid_value",
        )
    if all(_is_int(v) for v in value) or all(
        isinstance(v, list) and all(_is_int(i) for i in v) for v in value
    ):
        return (), True
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise OpenAIError(
                f"input[{index}] must be a string, got {_kind(item)}",
                param="input",
                code="invalid_type",
            )
    return tuple(value), False


def _encoding_format(value: Any) -> str:
    if value is None:
        return "float"  # OpenAI's default
    if value not in _FORMATS:
        shown = json.dumps(value) if isinstance(value, str) else _kind(value)
        raise OpenAIError(
            f"encoding_format must be 'float' or 'base64', got {shown}",
            param="encoding_format",
            code="invalid_value",
        )
    return str(value)


def _dimensions(value: Any) -> int | None:
    if value is None:
        return None
    if not _is_int(value) or value < 1:
        raise OpenAIError(
            f"dimensions must be an integer >= 1, got {json.dumps(value)}",
            param="dimensions",
            code="invalid_value",
        )
    return int(value)


def _user(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise OpenAIError(
            f"user must be a string, got {_kind(value)}", param="user", code="invalid_type"
        )
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    """``value``'s JSON type, as a client wrote it."""
    for kind, name in _KINDS:
        if isinstance(value, kind):
            return name
    return "null"


def check_opted_in(model: Model) -> None:
    """Raises :class:`OpenAIError` (404, ``model_not_found``) for a model served over the
    v2 routes only."""
    if not model.openai:
        raise OpenAIError(
            f"model '{model.name}' is not served over the OpenAI API: it has not opted in "
            f"([models.{model.name}] openai = true, or --openai true, for a model that turns "
            f"text into one vector); use /v2/models/{model.name}/infer for it",
            param="model",
            code="model_not_found",
            status=Status.NOT_FOUND,
        )


def infer_request(model: Model, request: EmbeddingsRequest) -> InferRequest:
    """The texts as one v2 request of k rows for ``model``'s one BYTES input. Raises
    :class:`OpenAIError` (400) for token ids and for ``dimensions`` the model cannot give."""
    if request.token_ids:
        raise OpenAIError(
            f"model '{model.name}' takes text, not token ids: send input as a string or a "
            "list of strings",
            param="input",
            code="unsupported_value",
        )
    size = model.output_specs[0].shape[0]
    if request.dimensions is not None and request.dimensions != size:
        keep = f"leave dimensions out (or send {size})" if size > 0 else "leave dimensions out"
        raise OpenAIError(
            f"model '{model.name}' cannot shorten its embeddings to {request.dimensions} "
            f"dimensions: {keep}",
            param="dimensions",
            code="unsupported_parameter",
        )
    spec = model.input_specs[0]
    rows = len(request.texts)
    data = np.empty(rows, dtype=object)
    for index, text in enumerate(request.texts):  # one by one: a list would pass through S
        data[index] = _utf8(text, index)
    shape = (rows,) if spec.shape == () else (rows, 1)
    tensor = InferInput(spec.name, "BYTES", shape, data.reshape(shape), {})
    return InferRequest(
        id=None, parameters={}, inputs=(tensor,), outputs=None, binary_data_output=False
    )


def _utf8(text: str, index: int) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate, "\\ud800", is valid JSON
        raise OpenAIError(
            f"input[{index}] is not valid Unicode: {exc.reason} at character {exc.start}",
            param="input",
            code="invalid_value",
        ) from None


def prompt_tokens(model: Model, value: Any) -> int:
    """The request's tokens as the model counts them (:attr:`Model.count_tokens`, from
    ``value``, the inputs it gets); 0 for a model that does not count."""
    if model.count_tokens is None:
        return 0
    return int(model.count_tokens(value))


def decode(
    model: Model, doc: dict[str, Any], *, max_client_batch_size: int | None = None
) -> InferRequest:
    """A ``POST /v1/embeddings`` body (:func:`json_body`'s) for ``model``: the v2 request of
    k rows. Raises :class:`OpenAIError`: a model that has not opted in
    (:func:`check_opted_in`), a body :func:`parse_embeddings` or :func:`infer_request`
    refuses."""
    check_opted_in(model)
    if model.generates_text:
        raise OpenAIError(
            f"model '{model.name}' generates text: use /v1/chat/completions or /v1/completions",
            param="model",
            code="model_not_found",
            status=Status.NOT_FOUND,
        )
    return infer_request(model, parse_embeddings(doc, max_client_batch_size))


def wants_base64(doc: dict[str, Any]) -> bool:
    """Whether a body :func:`decode` took asks for base64 vectors (else float lists)."""
    return _encoding_format(doc.get("encoding_format")) == "base64"


def encode_embeddings(
    *, model: str, vectors: np.ndarray[Any, Any], base64: bool, prompt_tokens: int
) -> bytes:
    """The response body: one ``embedding`` object per row of ``vectors``, in input order,
    as float lists or (``base64``) the base64 of each row's little-endian float32 bytes."""
    rows = np.asarray(vectors, dtype="<f4")
    data = [
        {"object": "embedding", "index": index, "embedding": _b64(row) if base64 else row}
        for index, row in enumerate(rows)
    ]
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
    doc = {"object": "list", "data": data, "model": model, "usage": usage}
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)


def _b64(row: np.ndarray[Any, Any]) -> str:
    return base64.b64encode(row.tobytes()).decode("ascii")


def model_entry(name: str, created: int) -> dict[str, Any]:
    """One model of ``GET /v1/models``; ``created`` in Unix seconds (when it was loaded)."""
    return {"id": name, "object": "model", "created": created, "owned_by": "carpool"}


def model_list(entries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The body of ``GET /v1/models``."""
    return {"object": "list", "data": list(entries)}


def encode_error(exc: BaseException, error: HTTPError) -> bytes:
    """OpenAI's error body for ``exc``, which :func:`error_status` answered with ``error``:
    the same message and status as the v2 routes, OpenAI's shape."""
    param, code = _blame(exc, error.status)
    kind = openai_type(error.status)
    body = {"error": {"message": error.message, "type": kind, "param": param, "code": code}}
    return json.dumps(body).encode()  # ASCII-escaped: any str encodes


def _blame(exc: BaseException, status: int) -> tuple[str | None, str | None]:
    """The field at fault and OpenAI's code for it."""
    if isinstance(exc, OpenAIError):
        return exc.param, exc.code
    if isinstance(exc, ModelNotFound):
        return "model", "model_not_found"
    if isinstance(exc, ModelUnavailable):
        return "model", "model_not_ready"
    if isinstance(exc, StepInputError):  # a step-wise model refused a row or parameter
        field = exc.field.removeprefix("parameters.")
        return ("prompt" if field == "text_input" else field), "invalid_value"
    if isinstance(exc, ProtocolError) and status == Status.BAD_REQUEST:  # the model refused
        return "input", "invalid_value"
    return None, openai_code(status)
