"""OpenAI's text generation as carpool's records: a ``/v1/chat/completions`` or ``/v1/completions``
body becomes a v2 request of one row per sequence (prompts x ``n``) for a step-wise model, and each
step's outputs (``text_output``, ``finish_reason``, ``num_input_tokens``, ``num_output_tokens``)
become OpenAI's answer, or its stream's chunks. Pure: no I/O, nothing kept between requests.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import orjson

from carpool.model import Model
from carpool.server.inference.call import Answer
from carpool.server.messages import InferInput, InferRequest
from carpool.server.openai.codec import (
    OpenAIError,
    check_opted_in,
    json_body,
    model_name,
    required,
)
from carpool.server.statuses import Status

__all__ = [
    "MAX_N",
    "Generated",
    "Posted",
    "ChoiceStep",
    "decode_generation",
    "parse",
    "posted",
    "row_parameters",
    "step_of",
]

Kind = Literal["chat", "text"]  # /v1/chat/completions, /v1/completions
MAX_N = 128  # OpenAI's bound on n, where --max-client-batch-size sets none
TEXT_MAX_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions
_COMMON = ("model", "max_tokens", "temperature", "top_p", "seed", "stop", "n", "user", "stream")
_FIELDS: dict[Kind, tuple[str, ...]] = {
    "chat": (*_COMMON, "stream_options", "messages", "max_completion_tokens"),
    "text": (*_COMMON, "stream_options", "prompt"),
}
# What OpenAI defines and carpool does not do: accepted only as null or OpenAI's default.
_DEFAULTS: dict[Kind, dict[str, tuple[Any, ...]]] = {
    "chat": {
        "logprobs": (False,), "top_logprobs": (0,), "presence_penalty": (0,),
        "frequency_penalty": (0,), "logit_bias": ({},), "tools": (), "tool_choice": ("none",),
        "parallel_tool_calls": (), "functions": (), "function_call": ("none",),
        "response_format": ({"type": "text"},), "service_tier": ("auto", "default"),
        "store": (False,), "metadata": (), "modalities": (["text"],), "audio": (),
        "prediction": (), "reasoning_effort": (), "web_search_options": (),
        "prompt_cache_key": (), "safety_identifier": (), "verbosity": (),
    },
    "text": {
        "logprobs": (), "echo": (False,), "best_of": (1,), "suffix": (),
        "presence_penalty": (0,), "frequency_penalty": (0,), "logit_bias": ({},),
    },
}  # fmt: skip
_ROLES = ("system", "user", "assistant")
_SEED_BOUND = 2**63


@dataclass(frozen=True, slots=True)
class Posted:
    """A generation request as it came: its body, the ``kind`` of route, and the ``id`` and
    ``created`` time (Unix seconds) every chunk of its answer carries."""

    doc: dict[str, Any]
    kind: Kind
    id: str
    created: int


def posted(body: bytes, kind: Kind) -> Posted:
    """``body`` as a JSON object (:class:`OpenAIError` if not), its answer's id minted."""
    prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
    return Posted(json_body(body), kind, prefix + uuid.uuid4().hex, int(time.time()))


@dataclass(frozen=True, slots=True)
class Generated:
    """A parsed generation body: ``prompts`` (a chat's: one, empty, its turns in
    ``parameters["messages"]``), ``n`` choices each, whether it streams, and the
    parameters each sequence's ``request`` gets."""

    model: str
    prompts: tuple[str, ...]
    n: int
    stream: bool
    include_usage: bool
    parameters: dict[str, Any] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return len(self.prompts) * self.n


def parse(post: Posted, max_client_batch_size: int | None = None) -> Generated:
    """``post``'s body, checked field by field; raises :class:`OpenAIError` (400) naming the
    field at fault, or (413) for more sequences than ``max_client_batch_size``."""
    doc, kind = post.doc, post.kind
    _check_fields(doc, kind)
    name = model_name(doc)
    parameters: dict[str, Any] = {"chat": kind == "chat"}
    if kind == "chat":
        parameters["messages"] = _messages(required(doc, "messages"))
        prompts: tuple[str, ...] = ("",)
    else:
        prompts = _prompts(required(doc, "prompt"))
    limit = max_client_batch_size
    _check_count(len(prompts), "prompt", limit)
    n = _int(doc, "n", 1, 1)
    if limit is None:
        _check_count(n, "n", MAX_N, "OpenAI's bound on n")
    _check_count(len(prompts) * n, "n", limit)
    parameters.update(_sampling(doc, kind))
    stream = _bool(doc, "stream", False)
    include_usage = _stream_options(doc.get("stream_options"), stream)
    if doc.get("user") is not None and not isinstance(doc["user"], str):
        raise _invalid_type("user", "a string", doc["user"])
    return Generated(name, prompts, n, stream, include_usage, parameters)


def _check_fields(doc: dict[str, Any], kind: Kind) -> None:
    """Every field one this route takes, or one OpenAI defines at its default (or null)."""
    taken, defaults = _FIELDS[kind], _DEFAULTS[kind]
    for key, value in doc.items():
        if key in taken:
            continue
        if key not in defaults:
            raise OpenAIError(
                f"unrecognized request argument supplied: {key}; this route takes "
                f"{', '.join(taken)}",
                param=key,
                code="unknown_parameter",
            )
        if value is not None and not any(_same(value, d) for d in defaults[key]):
            shown = " or ".join(["null", *(orjson.dumps(d).decode() for d in defaults[key])])
            raise OpenAIError(
                f"carpool does not support {key}: leave it out, or send {shown}",
                param=key,
                code="unsupported_parameter",
            )


def _same(value: Any, default: Any) -> bool:
    """JSON equality, where true is not 1 and 0 is 0.0."""
    if isinstance(value, bool) or isinstance(default, bool):
        return type(value) is type(default) and value == default
    return bool(value == default)


def _sampling(doc: dict[str, Any], kind: Kind) -> dict[str, Any]:
    """The sampling settings given, as the model's parameters."""
    out: dict[str, Any] = {}
    tokens = _int(doc, "max_tokens", None, 1)
    if kind == "chat":
        newer = _int(doc, "max_completion_tokens", None, 1)
        if newer is not None and tokens is not None and newer != tokens:
            raise OpenAIError(
                "max_tokens and max_completion_tokens differ: send one of them",
                param="max_completion_tokens",
                code="invalid_value",
            )
        tokens = tokens if newer is None else newer
    elif tokens is None:
        tokens = TEXT_MAX_TOKENS
    if tokens is not None:
        out["max_tokens"] = tokens
    for name, high in (("temperature", 2.0), ("top_p", 1.0)):
        value = doc.get(name)
        if value is not None:
            if not _is_number(value) or not 0 <= value <= high:
                raise OpenAIError(
                    f"{name} must be a number from 0 to {high:g}, got {_shown(value)}",
                    param=name,
                    code="invalid_value" if _is_number(value) else "invalid_type",
                )
            out[name] = float(value)
    seed = _int(doc, "seed", None, -_SEED_BOUND)
    if seed is not None:
        if seed >= _SEED_BOUND - MAX_N:
            raise OpenAIError(
                f"seed must be below 2**63 - {MAX_N}", param="seed", code="invalid_value"
            )
        out["seed"] = seed
    stops = _stop(doc.get("stop"))
    if stops:
        out["stop"] = stops
    return out


def _int(doc: dict[str, Any], name: str, default: int | None, low: int) -> Any:
    value = doc.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid_type(name, "an integer", value)
    if value < low:
        raise OpenAIError(f"{name} must be >= {low}, got {value}", param=name, code="invalid_value")
    return value


def _bool(doc: dict[str, Any], name: str, default: bool) -> bool:
    value = doc.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _invalid_type(name, "true or false", value)
    return value


def _stop(value: Any) -> list[str]:
    """``stop``: null, a string or a list of up to 4 of them."""
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise _invalid_type("stop", "a string or a list of strings", value)
    if len(stops) > 4 or not all(stops):
        raise OpenAIError(
            f"stop takes up to 4 non-empty strings, got {_shown(value)}",
            param="stop",
            code="invalid_value",
        )
    return list(stops)


def _stream_options(value: Any, stream: bool) -> bool:
    """Whether ``stream_options`` asks for the usage chunk; only a stream takes them."""
    if value is None:
        return False
    if not stream:
        raise OpenAIError(
            "stream_options is only allowed when stream is true",
            param="stream_options",
            code="invalid_value",
        )
    if not isinstance(value, dict):
        raise _invalid_type("stream_options", "an object", value)
    for key in value:
        if key != "include_usage":
            raise OpenAIError(
                f"unrecognized stream option {key}: stream_options takes include_usage",
                param=f"stream_options.{key}",
                code="unknown_parameter",
            )
    return _bool(value, "include_usage", False)


def _messages(value: Any) -> list[dict[str, str]]:
    """A chat's turns as ``{role, content}`` with string content (text parts joined)."""
    if not isinstance(value, list) or not value:
        raise _invalid_type("messages", "a non-empty list of messages", value)
    turns = []
    for index, turn in enumerate(value):
        where = f"messages[{index}]"
        if not isinstance(turn, dict):
            raise _invalid_type(where, "an object", turn)
        extra = sorted(set(turn) - {"role", "content"})
        if extra:
            raise OpenAIError(
                f"{where}.{extra[0]} is not supported: a message takes role and content",
                param=f"{where}.{extra[0]}",
                code="unsupported_parameter",
            )
        role = turn.get("role")
        if role not in _ROLES:
            raise OpenAIError(
                f"{where}.role must be one of {list(_ROLES)}, got {_shown(role)}",
                param=f"{where}.role",
                code="invalid_value",
            )
        turns.append({"role": role, "content": _content(turn.get("content"), where)})
    return turns


def _content(value: Any, where: str) -> str:
    """A message's content: a string, or a list of text parts (``{"type": "text", "text"}``)."""
    if isinstance(value, str):
        return value
    parts = value if isinstance(value, list) else None
    if parts is None or not all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        and set(p) == {"type", "text"}
        for p in parts
    ):  # fmt: skip
        raise _invalid_type(f"{where}.content", "a string or a list of text parts", value)
    return "".join(p["text"] for p in parts)


def _prompts(value: Any) -> tuple[str, ...]:
    """``prompt``: a string, or a non-empty list of them (each its own sequence)."""
    prompts = [value] if isinstance(value, str) else value
    if (
        isinstance(prompts, list)
        and prompts
        and all(_is_int(v) or isinstance(v, list) for v in prompts)
    ):
        raise OpenAIError(
            "prompt as token ids is not supported: send a string or a list of strings",
            param="prompt",
            code="unsupported_value",
        )
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
        raise _invalid_type("prompt", "a string or a non-empty list of strings", value)
    if not all(prompts):
        raise OpenAIError("prompt must not be empty", param="prompt", code="invalid_value")
    return tuple(prompts)


def _check_count(
    count: int, param: str, limit: int | None, why: str = "--max-client-batch-size"
) -> None:
    if limit is not None and count > limit:
        what = "prompts x n" if param == "n" else param
        raise OpenAIError(
            f"the request asks for {count} sequences ({what}); at most {limit} are taken in one "
            f"request ({why}): send several requests",
            param=param,
            code="too_many_inputs",
            status=Status.CONTENT_TOO_LARGE,
        )


def _invalid_type(name: str, wanted: str, value: Any) -> OpenAIError:
    return OpenAIError(
        f"{name} must be {wanted}, got {_shown(value)}", param=name, code="invalid_type"
    )


def _shown(value: Any) -> str:
    return orjson.dumps(value).decode()[:80]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def decode_generation(
    model: Model, post: Posted, *, max_client_batch_size: int | None = None
) -> InferRequest:
    """``post`` for ``model``: one ``text_input`` row per sequence (prompt by prompt, ``n``
    each), the parameters every row shares. Raises :class:`OpenAIError`: a model that has
    not opted in or does not generate text (404), a body :func:`parse` refuses."""
    check_opted_in(model)
    if not model.generates_text:
        raise OpenAIError(
            f"model '{model.name}' does not generate text: it serves /v1/embeddings",
            param="model",
            code="model_not_found",
            status=Status.NOT_FOUND,
        )
    request = parse(post, max_client_batch_size)
    data = np.empty(request.rows, dtype=object)
    for index, text in enumerate(p for p in request.prompts for _ in range(request.n)):
        data[index] = text.encode("utf-8", "surrogatepass")
    shape = (request.rows, 1) if model.batching.batched else (request.rows,)
    tensor = InferInput("text_input", "BYTES", shape, data.reshape(shape), {})
    return InferRequest(
        id=None,
        parameters=request.parameters,
        inputs=(tensor,),
        outputs=None,
        binary_data_output=False,
    )


def row_parameters(post: Posted, parameters: Mapping[str, Any], row: int) -> dict[str, Any]:
    """Row ``row``'s parameters: choice i of a seeded request samples with ``seed + i``, so
    that the choices differ and each repeats."""
    n = post.doc.get("n") or 1
    if "seed" not in parameters or row % n == 0:
        return dict(parameters)
    return {**parameters, "seed": parameters["seed"] + row % n}


@dataclass(frozen=True, slots=True)
class ChoiceStep:
    """One step of one sequence, as OpenAI's answer needs it."""

    index: int
    text: str
    finish_reason: str | None
    prompt_tokens: int
    tokens: int


def step_of(answer: Answer, post: Posted) -> ChoiceStep:
    """The step ``answer`` carries (the row it answers: its choice's index)."""
    out = {tensor.name: np.asarray(tensor.data).reshape(-1) for tensor, _ in answer.outputs}

    def number(name: str) -> int:
        return int(out[name][0]) if name in out else 0

    text = out["text_output"][0]
    reason = out["finish_reason"][0] if "finish_reason" in out else b""
    reason = reason.decode() if isinstance(reason, bytes) else str(reason)
    return ChoiceStep(
        index=answer.index,
        text=text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text),
        finish_reason=reason or None,
        prompt_tokens=number("num_input_tokens"),
        tokens=number("num_output_tokens"),
    )
