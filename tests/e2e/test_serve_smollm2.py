"""``carpool serve smollm2`` on each engine: the shipped SmolLM2-135M-Instruct answers in
steps over generate, generate_stream, gRPC's ModelStreamInfer (tritonclient) and infer, and
greedy text with a seed is the same whichever way it is asked; sampling settings reach it."""

from __future__ import annotations

import json
import queue
from functools import partial
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton

from carpool.backends.smollm2.served import default_engine
from server.conftest import Launcher, Server

pytestmark = pytest.mark.slow

PROMPT = "What is the capital of France?"
GREEDY = {"max_tokens": 12, "temperature": 0, "seed": 3}


# The torch engine this CPU defaults to (int8 on x86 with AVX2 and arm, else fp32), and llama.cpp.
@pytest.fixture(scope="module", params=[default_engine(), "llama"])
def server(request: pytest.FixtureRequest, serve_module: Launcher, tmp_path_factory: Any) -> Server:
    config = tmp_path_factory.mktemp(request.param) / "carpool.toml"
    config.write_text(f'[models.smollm2]\nengine = "{request.param}"\nmax_sequences = 4\n')
    return serve_module("smollm2", "--config", str(config), grpc=True)


def streamed(server: Server, body: dict[str, Any]) -> list[str]:
    with server.http.stream("POST", "/v2/models/smollm2/generate_stream", json=body) as r:
        assert r.status_code == 200
        text = r.read().decode()
    events = [json.loads(c[len("data: ") :]) for c in text.split("\n\n") if c]
    return [e["text_output"] for e in events]


def test_greedy_text_is_the_same_every_way(server: Server) -> None:
    body = {"text_input": PROMPT, "parameters": GREEDY}
    pieces = streamed(server, body)
    assert 1 <= len(pieces) <= 12  # max_tokens, or the end of its answer
    whole = server.http.post("/v2/models/smollm2/generate", json=body).json()["text_output"]
    assert "".join(pieces) == whole
    assert whole.strip()
    infer = {
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1, 1], "data": [PROMPT]}],
        "parameters": GREEDY,
    }
    answer = server.http.post("/v2/models/smollm2/infer", json=infer).json()
    assert answer["outputs"][0]["data"] == [whole]
    assert grpc_pieces(server, GREEDY) == pieces


def grpc_pieces(server: Server, parameters: dict[str, Any]) -> list[str]:
    got: queue.Queue[Any] = queue.Queue()
    client = triton.InferenceServerClient(server.grpc_address)
    tensor = triton.InferInput("text_input", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[PROMPT.encode()]], dtype=object))
    client.start_stream(callback=partial(lambda q, result, error: q.put((result, error)), got))
    try:
        client.async_stream_infer(
            "smollm2", [tensor], request_id="1", parameters=parameters,
            enable_empty_final_response=True,
        )  # fmt: skip
        pieces = []
        while True:
            result, error = got.get(timeout=60)
            assert error is None, error
            response = result.get_response()
            if response.parameters["triton_final_response"].bool_param:
                assert not response.outputs  # the empty final response
                return pieces
            pieces.append(result.as_numpy("text_output").reshape(-1)[0].decode())
    finally:
        client.stop_stream()
        client.close()


def test_seeded_sampling_repeats_and_max_tokens_bounds(server: Server) -> None:
    sampled = {"max_tokens": 8, "temperature": 0.9, "top_p": 0.9, "seed": 11}
    first = streamed(server, {"text_input": "Tell me a story.", "parameters": sampled})
    again = streamed(server, {"text_input": "Tell me a story.", "parameters": sampled})
    assert first == again
    assert len(first) <= 8


def test_a_stop_string_ends_the_text_without_it(server: Server) -> None:
    greedy = server.http.post(
        "/v2/models/smollm2/generate", json={"text_input": PROMPT, **GREEDY}
    ).json()["text_output"]
    stop = greedy[3:6]
    stopped = server.http.post(
        "/v2/models/smollm2/generate", json={"text_input": PROMPT, **GREEDY, "stop": stop}
    ).json()["text_output"]
    assert stopped == greedy[: greedy.index(stop)]


def test_bad_parameters_are_400s_naming_them(server: Server) -> None:
    response = server.http.post(
        "/v2/models/smollm2/generate", json={"text_input": PROMPT, "temperature": 5}
    )
    assert response.status_code == 400
    assert "temperature must be a number from 0 to 2" in response.json()["error"]


def test_config_is_decoupled(server: Server) -> None:
    config = server.http.get("/v2/models/smollm2/config").json()
    assert config["model_transaction_policy"] == {"decoupled": True}
    assert config["platform"] in ("smollm2_torch", "smollm2_torch_fp32", "smollm2_llama")
