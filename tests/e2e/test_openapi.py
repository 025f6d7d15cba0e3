"""The OpenAPI document (``carpool.server.rest.openapi``): valid OpenAPI 3, served at
``GET /v2/openapi.json``, and true: schemathesis fuzzes a real ``carpool serve`` from it.

The fuzz is bounded and deterministic (a fixed number of examples per operation, derandomized
Hypothesis), and asserts what schemathesis checks on every response (no 5xx, a status the
document declares, a body that matches its schema) plus that the server stays live. Models:
``identity`` (any datatype), ``upper`` (BYTES) and ``pair`` (two inputs), from ``models.py``.
"""

from __future__ import annotations

import importlib.metadata
import json
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from openapi_spec_validator import validate
from schemathesis.specs.openapi.checks import positive_data_acceptance

from carpool.server.messages import HEADER_LENGTH
from carpool.server.rest.openapi import PATH, document
from server.conftest import Launcher, Server

MODELS = ("identity", "upper", "pair")
# Per operation (17 of them): enough to reach every status the routes answer, small enough
# that the whole fuzz stays well under a minute on two cores.
EXAMPLES = 60
BODY_LIMIT = 65536
STATEFUL_EXAMPLES = 40  # sequences of up to 6 linked calls


@pytest.fixture(scope="module")
def server(serve_module: Launcher, tmp_path_factory: pytest.TempPathFactory) -> Server:
    config = tmp_path_factory.mktemp("config") / "carpool.toml"
    config.write_text("[models.pair]\npriority_levels = 3\n[models.upper]\nmax_queue_size = 64\n")
    targets = [f"models:{name}" for name in MODELS]
    return serve_module(*targets, "--config", str(config), "--max-body-bytes", str(BODY_LIMIT))


def narrowed(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with model names and versions drawn from what is served (and one of each
    that is not), input names the models take and small shapes, so the fuzz reaches the
    models instead of a 404 or a 400 nearly every time."""
    names = {"type": "string", "enum": [*MODELS, "missing"]}
    versions = {"type": "string", "enum": ["1", "2"]}
    for item in doc["paths"].values():
        for parameter in item.get("parameters", ()):
            choices = {"model_name": names, "model_version": versions, "model": names}
            parameter["schema"] = choices[parameter["name"]]
    tensor = doc["components"]["schemas"]["RequestInput"]["properties"]
    tensor["name"] = {"type": "string", "enum": ["INPUT0", "INPUT1", "TEXT"]}
    tensor["shape"] = {"type": "array", "maxItems": 3, "items": {"type": "integer",
                       "minimum": 0, "maximum": 4}}  # fmt: skip
    return doc


@pytest.fixture(scope="module")
def api(server: Server) -> Any:
    doc = server.get_json(PATH)
    config = schemathesis.Config()
    config.projects.default.update(base_url=server.url, request_timeout=10)
    return schemathesis.openapi.from_dict(narrowed(doc), config=config)


def test_the_document_is_valid_openapi() -> None:
    doc = document("1.2.3")
    validate(doc)
    assert doc["openapi"] == "3.0.3"
    assert doc["info"]["version"] == "1.2.3"


def test_the_document_declares_the_keys_and_the_401() -> None:
    doc = document("1.2.3")
    assert doc["components"]["securitySchemes"] == {
        "bearer": {"type": "http", "scheme": "bearer"},
        "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
    }
    assert doc["security"] == [{"bearer": []}, {"apiKey": []}, {}]  # without keys: open
    for route, operations in doc["paths"].items():
        for method, operation in operations.items():
            if method == "parameters":
                continue
            if route.startswith("/v2/health/"):
                assert operation["security"] == [], route
                assert "401" not in operation["responses"], route
            else:
                shape = "OpenAIError" if route.startswith("/v1/") else "Error"
                body = operation["responses"]["401"]["content"]["application/json"]["schema"]
                assert body == {"$ref": f"#/components/schemas/{shape}"}, route


def test_the_server_serves_the_document(server: Server) -> None:
    response = server.http.get(PATH)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == document(importlib.metadata.version("carpool"))
    wrong = server.http.post(PATH)
    assert (wrong.status_code, wrong.json()) == (405, {"error": "Method Not Allowed"})


schema = schemathesis.pytest.from_fixture("api")
# Deterministic and bounded: the same examples every run, no example database, no deadline
# (a 2-core machine under load is slow, not wrong).
BOUNDED = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
# The document has one request schema for every model; a request it allows may still not fit
# the model it names (wrong input name or shape), and that 400 is right, not a failure.
NOT_CHECKED = [positive_data_acceptance]


@pytest.mark.slow
@schema.parametrize()
@BOUNDED
def test_fuzz_every_route(case: schemathesis.Case, server: Server) -> None:
    case.call_and_validate(excluded_checks=NOT_CHECKED)
    assert server.is_live()


@pytest.mark.slow
def test_fuzz_statefully(api: Any, server: Server) -> None:
    """Sequences that follow the document's links: a model name from the repository index or
    a model's metadata, fed to that model's routes."""

    class Machine(api.as_state_machine()):  # type: ignore[misc]
        def validate_response(self, response: Any, case: schemathesis.Case, **_: Any) -> None:
            case.validate_response(response, excluded_checks=NOT_CHECKED)
            assert server.is_live()

    Machine.run(settings=settings(BOUNDED, max_examples=STATEFUL_EXAMPLES, stateful_step_count=6))


# -- what the fuzz found ---------------------------------------------------------------------


def test_repository_index_reads_its_ready_flag(server: Server) -> None:
    everything = server.http.post("/v2/repository/index")
    assert [entry["name"] for entry in everything.json()] == sorted(MODELS)
    ready = server.http.post("/v2/repository/index", json={"ready": True})
    assert (ready.status_code, ready.json()) == (200, everything.json())
    wrong = server.http.post("/v2/repository/index", json={"ready": {}})
    assert (wrong.status_code, wrong.json()) == (
        400,
        {"error": "Unable to parse 'ready': expected true or false"},
    )
    assert server.is_live()


def test_a_raw_request_that_says_it_is_json_is_refused(server: Server) -> None:
    body = b'{"inputs": []}  '  # 16 bytes: read raw, 4 FP32 values and a 200
    headers = {"Inference-Header-Content-Length": "0", "Content-Type": "application/json"}
    response = server.http.post("/v2/models/identity/infer", content=body, headers=headers)
    assert response.status_code == 400
    assert response.json()["error"].startswith(
        "Inference-Header-Content-Length 0 makes the whole body raw binary tensor data"
    )
    headers["Content-Type"] = "application/octet-stream"
    raw = server.http.post("/v2/models/identity/infer", content=b"\0" * 8, headers=headers)
    assert raw.status_code == 200
    assert json.loads(raw.content[: int(raw.headers[HEADER_LENGTH])])["outputs"] == [
        {
            "name": "OUTPUT0",
            "datatype": "FP32",
            "shape": [1, 2],
            "parameters": {"binary_data_size": 8},
        }
    ]
