"""The OpenAPI 3 document of the v2 REST routes, served at ``GET /v2/openapi.json``: every route,
every status it can answer and its body, so client generators, gateways and fuzzers (the tests
run schemathesis) know the whole contract. Pure data, stdlib only."""

from __future__ import annotations

import copy
from typing import Any

from carpool.datatypes import DATATYPES
from carpool.server.rest.openapi_generation import generation_routes, generation_schemas

__all__ = ["PATH", "document"]

PATH = "/v2/openapi.json"
JSON_TYPE = "application/json"
BINARY_TYPE = "application/octet-stream"
HEADER_LENGTH = "Inference-Header-Content-Length"

_REF = "#/components/schemas/"
_STRING = {"type": "string"}
_INT = {"type": "integer"}
_SHAPE = {"type": "array", "items": _INT}
_DURATION = {
    "type": "object",
    "required": ["count", "ns"],
    "properties": {"count": _INT, "ns": _INT},
}


_DATATYPE = {"type": "string", "enum": list(DATATYPES)}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF + name}


def _object(required: list[str], properties: dict[str, Any], **more: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties, **more}
    if required:  # OpenAPI 3.0 forbids an empty list
        schema["required"] = required
    return schema


_TENSOR = _object(
    ["name", "datatype", "shape"], {"name": _STRING, "datatype": _DATATYPE, "shape": _SHAPE}
)


def _schemas() -> dict[str, Any]:
    parameters = {
        "type": "object",
        "additionalProperties": {"anyOf": [_STRING, {"type": "number"}, {"type": "boolean"}]},
    }
    return {
        "Error": _object(["error"], {"error": _STRING}, additionalProperties=False),
        "Parameters": parameters,
        "ServerMetadata": _object(
            ["name", "version", "extensions"],
            {
                "name": _STRING,
                "version": _STRING,
                "extensions": {"type": "array", "items": _STRING},
            },
        ),
        "MetadataTensor": _TENSOR,
        "ModelMetadata": _object(
            ["name", "platform", "inputs", "outputs"],
            {
                "name": _STRING,
                "versions": {"type": "array", "items": _STRING},
                "platform": _STRING,
                "inputs": {"type": "array", "items": _ref("MetadataTensor")},
                "outputs": {"type": "array", "items": _ref("MetadataTensor")},
            },
        ),
        "ModelConfig": _object(
            ["name", "max_batch_size", "input", "output"],
            {
                "name": _STRING,
                "max_batch_size": _INT,
                "input": {"type": "array", "items": {"type": "object"}},
                "output": {"type": "array", "items": {"type": "object"}},
            },
        ),
        "ModelStatistics": _object(
            ["name", "version", "inference_count", "execution_count", "inference_stats"],
            {
                "name": _STRING,
                "version": _STRING,
                "inference_count": _INT,
                "execution_count": _INT,
                "inference_stats": {"type": "object", "additionalProperties": _DURATION},
                "batch_stats": {"type": "array", "items": {"type": "object"}},
            },
        ),
        "StatisticsResponse": _object(
            ["model_stats"], {"model_stats": {"type": "array", "items": _ref("ModelStatistics")}}
        ),
        "RepositoryIndex": {
            "type": "array",
            "items": _object(
                ["name", "state"],
                {"name": _STRING, "version": _STRING, "state": _STRING, "reason": _STRING},
            ),
        },
        **_inference_schemas(),
    }


def _inference_schemas() -> dict[str, Any]:
    return {
        "RequestInput": _object(
            ["name", "shape", "datatype"],
            {
                "name": _STRING,
                "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                "datatype": _DATATYPE,
                "parameters": _ref("Parameters"),
                "data": {"description": "flat or nested row-major elements"},
            },
        ),
        "InferenceRequest": _object(
            ["inputs"],
            {
                "id": _STRING,
                "parameters": _ref("Parameters"),
                "inputs": {"type": "array", "items": _ref("RequestInput")},
                "outputs": {
                    "type": "array",
                    "items": _object(["name"], {"name": _STRING, "parameters": _ref("Parameters")}),
                },
            },
        ),
        "InferenceResponse": _object(
            ["model_name", "outputs"],
            {
                "model_name": _STRING,
                "model_version": _STRING,
                "id": _STRING,
                "parameters": _ref("Parameters"),
                "outputs": {
                    "type": "array",
                    "items": {
                        "allOf": [
                            _TENSOR,
                            {"properties": {"parameters": _ref("Parameters"), "data": {}}},
                        ]
                    },
                },
            },
        ),
    }


def _json(schema: str | dict[str, Any], description: str, **more: Any) -> dict[str, Any]:
    body = _ref(schema) if isinstance(schema, str) else schema
    return {"description": description, "content": {JSON_TYPE: {"schema": body}}, **more}


_ERRORS = {
    "400": "the request is malformed, or the model failed to load",
    "404": "no such model or version",
    "413": "the body (after decompression) or its element count is over the limit",
    "415": "a Content-Encoding other than gzip, deflate or identity",
    "500": "the model failed on this request",
    "503": "the queue is full, the request timed out in it, or the server is stopping",
    "504": "the model call ran past --batch-timeout-ms",
}


_UNAUTHORIZED = (
    "with --api-key: no key, not one of the server's, or more than one key header (under "
    '/v2, the body is exactly {"error": "unauthorized"}; under /v1, OpenAI\'s shape)'
)
_OPEN_ROUTES = ("/v2/health/live", "/v2/health/ready")  # never need a key (auth.is_open)


def _errors(*codes: str) -> dict[str, Any]:
    return {code: _json("Error", _ERRORS[code]) for code in codes}


def _not_ready(properties: dict[str, Any]) -> dict[str, Any]:
    schema = _object(
        ["ready", "error"], {**properties, "ready": {"type": "boolean"}, "error": _STRING}
    )
    return _json(schema, "not ready")


def _get(operation_id: str, summary: str, responses: dict[str, Any]) -> dict[str, Any]:
    return {"get": {"operationId": operation_id, "summary": summary, "responses": responses}}


_NAME_LINKS = ("ModelMetadata", "ModelReady", "ModelConfig", "ModelStatistics", "ModelInfer")


def _links(pointer: str) -> dict[str, Any]:
    # Every operation on one model, fed the name a response just gave.
    value = f"$response.body#{pointer}"
    return {op: {"operationId": op, "parameters": {"model_name": value}} for op in _NAME_LINKS}


def _model_routes(suffix: str, tag: str) -> dict[str, Any]:
    # The routes of one model, with or without ``/versions/{model_version}``.
    base = "/v2/models/{model_name}" + suffix
    ready = _object(["name", "ready"], {"name": _STRING, "ready": {"type": "boolean"}})
    return {
        base: _get(
            f"ModelMetadata{tag}",
            "model metadata",
            {
                "200": _json("ModelMetadata", "the model's signature", links=_links("/name")),
                **_errors("400", "404"),
            },
        ),
        base + "/ready": _get(
            f"ModelReady{tag}",
            "model readiness",
            {"200": _json(ready, "ready"), "503": _not_ready({"name": _STRING}), **_errors("404")},
        ),
        base + "/config": _get(
            f"ModelConfig{tag}",
            "the model's configuration (Triton's model_configuration extension)",
            {"200": _json("ModelConfig", "configuration"), **_errors("400", "404")},
        ),
        base + "/stats": _get(
            f"ModelStatistics{tag}",
            "the model's statistics (Triton's statistics extension)",
            {"200": _json("StatisticsResponse", "statistics"), **_errors("400", "404")},
        ),
        base + "/infer": {"post": _infer(f"ModelInfer{tag}")},
        base + "/generate": {"post": _generate(f"ModelGenerate{tag}", stream=False)},
        base + "/generate_stream": {"post": _generate(f"ModelGenerateStream{tag}", stream=True)},
    }


def _generate(operation_id: str, *, stream: bool) -> dict[str, Any]:
    """Triton's generate extension: a flat object in; one object, or an event per step, out."""
    body = {
        "type": "object",
        "description": "each field named as an input is that input; the rest, and "
        "'parameters', are request parameters",
        "properties": {"id": _STRING, "parameters": {"type": "object"}},
    }
    answer = {"type": "object", "required": ["model_name"], "properties": {"model_name": _STRING}}
    ok = (
        {
            "description": "one data: event per step",
            "content": {"text/event-stream": {"schema": _STRING}},
        }
        if stream
        else _json(answer, "the whole answer")
    )
    return {
        "operationId": operation_id,
        "summary": "generate (Triton's generate extension)"
        + (": server-sent events, one per step" if stream else ""),
        "requestBody": {"required": True, "content": {JSON_TYPE: {"schema": body}}},
        "responses": {"200": ok, **_errors("400", "404", "413", "500", "503", "504")},
    }


def _infer(operation_id: str) -> dict[str, Any]:
    binary = {
        "schema": {
            "type": "string",
            "format": "binary",
            "description": "JSON header, then binary tensor data; the header's length is in "
            f"{HEADER_LENGTH} (0: the whole body is the one input's raw data)",
        }
    }
    length = {"type": "integer", "minimum": 0}
    example = {"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}
    ok = _json("InferenceResponse", "the outputs")
    ok["content"][BINARY_TYPE] = binary
    ok["headers"] = {
        HEADER_LENGTH: {
            "description": "the JSON header's length, when any output is binary",
            "schema": length,
        }
    }
    return {
        "operationId": operation_id,
        "summary": "inference: JSON, or JSON plus binary tensors (binary_tensor_data)",
        "parameters": [
            {"name": HEADER_LENGTH, "in": "header", "required": False, "schema": length}
        ],
        "requestBody": {
            "description": "An empty body with Inference-Header-Content-Length 0 is a raw "
            "request of zero bytes: an empty tensor, for a model whose input has a -1 dimension",
            "required": False,
            "content": {
                JSON_TYPE: {"schema": _ref("InferenceRequest"), "example": example},
                BINARY_TYPE: binary,
            },
        },
        "responses": {"200": ok, **_errors("400", "404", "413", "415", "500", "503", "504")},
    }


def _server_routes() -> dict[str, Any]:
    live = _object(["live"], {"live": {"type": "boolean"}})
    ready = _object(["ready"], {"ready": {"type": "boolean"}})
    metrics = {
        "description": "Prometheus exposition",
        "content": {"text/plain": {"schema": _STRING}},
    }
    index = _json("RepositoryIndex", "every model, loaded or not", links=_links("/0/name"))
    index_body = _object([], {"ready": {"type": "boolean"}})
    return {
        "/v2/health/live": _get("ServerLive", "liveness", {"200": _json(live, "live")}),
        "/v2/health/ready": _get(
            "ServerReady", "readiness", {"200": _json(ready, "ready"), "503": _not_ready({})}
        ),
        "/v2": _get("ServerMetadata", "server metadata", {"200": _json("ServerMetadata", "")}),
        "/v2/models/stats": _get(
            "AllStatistics", "every model's statistics", {"200": _json("StatisticsResponse", "")}
        ),
        "/v2/repository/index": {
            "post": {
                "operationId": "RepositoryIndex",
                "summary": "the model repository's index (read-only)",
                "requestBody": {"required": False, "content": {JSON_TYPE: {"schema": index_body}}},
                "responses": {"200": index, **_errors("400", "413", "415")},
            }
        },
        "/metrics": _get("Metrics", "Prometheus metrics", {"200": metrics}),
        PATH: _get("OpenAPI", "this document", {"200": _json({"type": "object"}, "OpenAPI 3")}),
    }


def _openai_schemas() -> dict[str, Any]:
    # OpenAI's embeddings API, for the models that opted in (carpool.server.openai.codec).
    nullable = {"type": "string", "nullable": True}
    error = _object(
        ["error"],
        {
            "error": _object(
                ["message", "type", "param", "code"],
                {"message": _STRING, "type": _STRING, "param": nullable, "code": nullable},
            )
        },
    )
    entry = _object(
        ["id", "object", "created", "owned_by"],
        {"id": _STRING, "object": _STRING, "created": _INT, "owned_by": _STRING},
    )
    listing = _object(
        ["object", "data"], {"object": _STRING, "data": {"type": "array", "items": entry}}
    )
    texts = {"type": "array", "items": _STRING}
    tokens = {"type": "array", "items": _INT}
    request = _object(
        ["model", "input"],
        {
            "model": _STRING,
            "input": {"oneOf": [_STRING, texts, tokens, {"type": "array", "items": tokens}]},
            "encoding_format": {"type": "string", "enum": ["float", "base64"]},
            "dimensions": {"type": "integer", "minimum": 1},
            "user": _STRING,
        },
        additionalProperties=False,
    )
    embedding = _object(
        ["object", "index", "embedding"],
        {
            "object": _STRING,
            "index": _INT,
            "embedding": {"oneOf": [{"type": "array", "items": {"type": "number"}}, _STRING]},
        },
    )
    usage = _object(
        ["prompt_tokens", "total_tokens"], {"prompt_tokens": _INT, "total_tokens": _INT}
    )
    response = _object(
        ["object", "data", "model", "usage"],
        {
            "object": _STRING,
            "data": {"type": "array", "items": embedding},
            "model": _STRING,
            "usage": usage,
        },
    )
    return {
        "OpenAIError": error,
        "OpenAIModel": entry,
        "OpenAIModelList": listing,
        "EmbeddingsRequest": request,
        "EmbeddingsResponse": response,
    }


def _openai_routes() -> dict[str, Any]:
    errors = {
        code: _json("OpenAIError", _ERRORS[code])
        for code in ("400", "404", "413", "415", "500", "503", "504")
    }
    request = _ref("EmbeddingsRequest")
    model = {"name": "model", "in": "path", "required": True, "schema": _STRING}
    return {
        "/v1/embeddings": {
            "post": {
                "operationId": "OpenAIEmbeddings",
                "summary": "OpenAI embeddings; errors in OpenAI's shape",
                "requestBody": {"required": True, "content": {JSON_TYPE: {"schema": request}}},
                "responses": {"200": _json("EmbeddingsResponse", "the embeddings"), **errors},
            }
        },
        **generation_routes(errors),
        "/v1/models": _get(
            "OpenAIModels",
            "the models that serve OpenAI's routes",
            {"200": _json("OpenAIModelList", "")},
        ),
        "/v1/models/{model}": {
            "parameters": [model],
            **_get(
                "OpenAIModel",
                "one model",
                {"200": _json("OpenAIModel", ""), "400": errors["400"], "404": errors["404"]},
            ),
        },
    }


def _parameters() -> dict[str, Any]:
    def path(name: str) -> dict[str, Any]:
        return {"name": name, "in": "path", "required": True, "schema": _STRING}

    return {"model_name": path("model_name"), "model_version": path("model_version")}


def _build(version: str) -> dict[str, Any]:
    paths = {
        **_server_routes(),
        **_openai_routes(),
        **_model_routes("", ""),
        **_model_routes("/versions/{model_version}", "Version"),
    }
    names = [_parameters()["model_name"]]
    both = [*names, _parameters()["model_version"]]
    for route, operations in paths.items():
        if "{model_name}" in route:
            operations["parameters"] = both if "{model_version}" in route else names
        for method, operation in operations.items():
            if method == "parameters":
                continue
            if route in _OPEN_ROUTES:
                operation["security"] = []  # probes carry no credentials
            else:
                shape = "OpenAIError" if route.startswith("/v1/") else "Error"
                operation["responses"]["401"] = _json(shape, _UNAUTHORIZED)
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "carpool serve: KServe v2 / Open Inference Protocol REST API",
            "version": version,
            "description": 'Every error body is exactly {"error": <message>}. A wrong method '
            "is 405 with an Allow header; an unknown path is 404. Request bodies may be sent "
            "gzip or deflate compressed (Content-Encoding).",
        },
        "paths": paths,
        # With --api-key, one of the keys, as a bearer token or in x-api-key (one header);
        # without, nothing: hence the empty alternative.
        "security": [{"bearer": []}, {"apiKey": []}, {}],
        "components": {
            "schemas": {**_schemas(), **_openai_schemas(), **generation_schemas()},
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            },
        },
    }


_CACHE: dict[str, dict[str, Any]] = {}


def document(version: str) -> dict[str, Any]:
    """The document for server ``version``: a fresh copy, so a caller may change it."""
    if version not in _CACHE:
        _CACHE[version] = _build(version)
    return copy.deepcopy(_CACHE[version])
