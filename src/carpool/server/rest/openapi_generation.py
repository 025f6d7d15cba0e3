"""The OpenAPI document's part for OpenAI's text generation (``/v1/chat/completions``,
``/v1/completions``; :mod:`carpool.server.openai.generation`): its request and answer schemas
and its two routes, merged into :mod:`carpool.server.rest.openapi`'s document."""

from __future__ import annotations

from typing import Any

__all__ = ["generation_routes", "generation_schemas"]

_STRING = {"type": "string"}
_INT = {"type": "integer"}


def _object(required: list[str], properties: dict[str, Any], **more: Any) -> dict[str, Any]:
    needs = {"required": required} if required else {}  # OpenAPI 3.0: never an empty list
    return {"type": "object", **needs, "properties": properties, **more}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def generation_schemas() -> dict[str, Any]:
    """The request and answer bodies, by schema name."""
    part = _object(
        ["type", "text"],
        {"type": {"type": "string", "enum": ["text"]}, "text": _STRING},
        additionalProperties=False,
    )
    message = _object(
        ["role", "content"],
        {
            "role": {"type": "string", "enum": ["system", "user", "assistant"]},
            "content": {"oneOf": [_STRING, {"type": "array", "items": part}]},
        },
        additionalProperties=False,
    )
    common = {
        "model": _STRING,
        "max_tokens": {"type": "integer", "minimum": 1, "nullable": True},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2, "nullable": True},
        "top_p": {"type": "number", "minimum": 0, "maximum": 1, "nullable": True},
        "seed": {"type": "integer", "nullable": True},
        "stop": {"oneOf": [_STRING, {"type": "array", "items": _STRING, "maxItems": 4}]},
        "n": {"type": "integer", "minimum": 1, "nullable": True},
        "user": _STRING,
        "stream": {"type": "boolean", "nullable": True},
        "stream_options": _object([], {"include_usage": {"type": "boolean"}}),
    }
    chat = _object(
        ["model", "messages"],
        {
            **common,
            "messages": {"type": "array", "minItems": 1, "items": message},
            "max_completion_tokens": {"type": "integer", "minimum": 1, "nullable": True},
        },
        description="Any other field OpenAI defines is a 400 unless null or its default.",
    )
    prompts = {"type": "array", "minItems": 1, "items": _STRING}
    text = _object(["model", "prompt"], {**common, "prompt": {"oneOf": [_STRING, prompts]}})
    usage = _object(
        ["prompt_tokens", "completion_tokens", "total_tokens"],
        {"prompt_tokens": _INT, "completion_tokens": _INT, "total_tokens": _INT},
    )
    reason = {"type": "string", "enum": ["stop", "length"], "nullable": True}
    said = _object(["role", "content"], {"role": _STRING, "content": _STRING})
    choice = _object(
        ["index", "finish_reason"],
        {"index": _INT, "message": said, "text": _STRING, "finish_reason": reason},
    )
    answer = _object(
        ["id", "object", "created", "model", "choices", "usage"],
        {
            "id": _STRING,
            "object": {"type": "string", "enum": ["chat.completion", "text_completion"]},
            "created": _INT,
            "model": _STRING,
            "choices": {"type": "array", "items": choice},
            "usage": usage,
        },
    )
    return {"ChatCompletionRequest": chat, "CompletionRequest": text, "CompletionAnswer": answer}


def generation_routes(errors: dict[str, Any]) -> dict[str, Any]:
    """The two routes, each answering ``errors`` (status -> response) besides its 200."""
    events = {"schema": _STRING}  # stream: true: data: {chunk} events, data: [DONE] last

    def route(operation: str, summary: str, request: str) -> dict[str, Any]:
        content = {"application/json": {"schema": _ref(request)}}
        answered = {
            "description": "the answer, or its chunks as server-sent events",
            "content": {
                "application/json": {"schema": _ref("CompletionAnswer")},
                "text/event-stream": events,
            },
        }
        return {
            "post": {
                "operationId": operation,
                "summary": summary,
                "requestBody": {"required": True, "content": content},
                "responses": {"200": answered, **errors},
            }
        }

    return {
        "/v1/chat/completions": route(
            "OpenAIChatCompletions", "OpenAI chat completions", "ChatCompletionRequest"
        ),
        "/v1/completions": route("OpenAICompletions", "OpenAI completions", "CompletionRequest"),
    }
