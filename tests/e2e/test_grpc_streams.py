"""gRPC ``ModelStreamInfer`` on a step-wise model end to end: one response per step, as Triton's
decoupled models, each flagged ``triton_final_response``; errors, cancellation, unary calls.

One server per module serves ``step_models:words`` (a word of ``text_input`` per step) and
``models:add_one``. Exact messages are read on a raw stub; tritonclient's own stream is used as
its users would.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from carpool.server.grpc import codec
from carpool.server.messages import ProtocolError
from server.conftest import Launcher, Server, wait_until

BOOM = "model error: ValueError: the word 'boom' breaks its sequence"
Flagged = tuple[str, list[str], bool]  # a response: its id, its words, its final flag


@pytest.fixture(scope="module")
def server(serve_module: Launcher) -> Server:
    return serve_module("step_models:words", "models:add_one", grpc=True)


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[triton.InferenceServerClient]:
    client = triton.InferenceServerClient(server.grpc_address)
    yield client
    client.close()


@pytest.fixture(scope="module")
def stub(server: Server) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(server.grpc_address) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


def text(words: str) -> list[Any]:
    """``words`` as tritonclient's ``text_input`` (one row)."""
    tensor = triton.InferInput("text_input", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[words.encode()]], dtype=object))
    return [tensor]


def request(
    request_id: str, words: str, *, empty_final: bool = False, **parameters: int
) -> pb.ModelInferRequest:
    """A raw ``ModelInferRequest`` for ``words``, with int64 ``parameters``."""
    message = pb.ModelInferRequest(model_name="words", id=request_id)
    message.inputs.add(
        name="text_input",
        datatype="BYTES",
        shape=[1, 1],
        contents=pb.InferTensorContents(bytes_contents=[words.encode()]),
    )
    for key, value in parameters.items():
        message.parameters[key].int64_param = value
    if empty_final:
        message.parameters[codec.EMPTY_FINAL].bool_param = True
    return message


def streamed(stub: Any, *requests: pb.ModelInferRequest) -> list[pb.ModelStreamInferResponse]:
    """Every response to ``requests``, sent on one stream (closed once sent), in order."""
    return list(stub.ModelStreamInfer(iter(requests), timeout=30))


def flagged(response: Any) -> Flagged:
    """A response's id, words and final flag (it must carry the flag, and no error)."""
    assert response.error_message == ""
    infer = response.infer_response
    assert infer.model_name == "words"
    assert infer.parameters[codec.FINAL].WhichOneof("parameter_choice") == "bool_param"
    data = triton.InferResult(infer).as_numpy("text_output")  # None: no outputs
    words = [] if data is None else [w.decode() for w in data.reshape(-1)]
    return infer.id, words, infer.parameters[codec.FINAL].bool_param


def of(responses: list[Any], request_id: str) -> list[Any]:
    return [r for r in responses if r.infer_response.id == request_id]


def error_of(response: Any) -> tuple[str, str, bool]:
    """An error response's message, id and final flag."""
    infer = response.infer_response
    return response.error_message, infer.id, infer.parameters[codec.FINAL].bool_param


def steps(server: Server) -> float:
    return server.metric("carpool_step_sequences_count", model="words")


def active(server: Server) -> float:
    return server.metric("carpool_active_sequences", model="words")


def closed(server: Server, outcome: str = "client_closed") -> float:
    """The words requests counted as cancelled by their client (499) over gRPC, or with
    another ``outcome``."""
    labels = f'{{model="words",outcome="{outcome}",protocol="grpc"}} '
    for line in server.metrics().splitlines():
        if line.startswith(f"carpool_requests_total{labels}"):
            return float(line.split()[-1])
    return 0.0


# ---------------------------------------------------------------- responses and their flags


def test_tritonclient_gets_a_response_per_step_the_last_flagged_final(
    client: triton.InferenceServerClient,
) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("words", text("one two three"), request_id="a")
        got = [answers.get(timeout=30) for _ in range(3)]
    finally:
        client.stop_stream()
    assert [error for _, error in got] == [None, None, None]
    assert [
        flagged(pb.ModelStreamInferResponse(infer_response=r.get_response())) for r, _ in got
    ] == [
        ("a", ["one"], False),
        ("a", ["two"], False),
        ("a", ["three"], True),
    ]
    assert answers.empty()


def test_tritonclient_asks_for_an_empty_final_response(
    client: triton.InferenceServerClient,
) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer(
            "words", text("one two"), request_id="e", enable_empty_final_response=True
        )
        got = [answers.get(timeout=30) for _ in range(3)]
    finally:
        client.stop_stream()
    assert [error for _, error in got] == [None, None, None]
    responses = [r.get_response() for r, _ in got]
    assert [flagged(pb.ModelStreamInferResponse(infer_response=r)) for r in responses] == [
        ("e", ["one"], False),
        ("e", ["two"], False),
        ("e", [], True),
    ]
    assert (len(responses[-1].outputs), len(responses[-1].raw_output_contents)) == (0, 0)


@pytest.mark.parametrize("empty_final", [False, True])
def test_the_exact_responses_with_and_without_an_empty_final_one(
    stub: Any, empty_final: bool
) -> None:
    responses = streamed(stub, request("x", "a b c", empty_final=empty_final, delay_ms=1))
    words = [("x", ["a"], False), ("x", ["b"], False)]
    if empty_final:
        assert [flagged(r) for r in responses] == [*words, ("x", ["c"], False), ("x", [], True)]
    else:
        assert [flagged(r) for r in responses] == [*words, ("x", ["c"], True)]


def test_requests_on_one_stream_run_together_each_its_own_words_in_order(
    stub: Any, server: Server
) -> None:
    texts = {"p": "p1 p2 p3 p4 p5 p6", "q": "q1 q2", "r": "r1 r2 r3", "s": "s1"}
    before = steps(server)
    responses = streamed(
        stub,
        request("p", texts["p"], delay_ms=50),
        request("q", texts["q"], delay_ms=50),
        request("r", texts["r"], delay_ms=50, empty_final=True),
        request("s", texts["s"], delay_ms=50),
    )
    for request_id in ("p", "q", "s"):
        words = texts[request_id].split()
        finals = [False] * (len(words) - 1) + [True]
        expected = [(request_id, [w], final) for w, final in zip(words, finals, strict=True)]
        assert [flagged(r) for r in of(responses, request_id)] == expected
    expected_r = [("r", [w], False) for w in texts["r"].split()] + [("r", [], True)]
    assert [flagged(r) for r in of(responses, "r")] == expected_r
    assert len(responses) == 13
    # The sequences shared steps: fewer steps than words (12), which one at a time would take.
    assert steps(server) - before < 12


# ---------------------------------------------------------------- errors


def test_an_error_mid_sequence_ends_it_after_the_steps_before(stub: Any) -> None:
    responses = streamed(stub, request("b", "fine then boom never"), request("ok", "fine"))
    broken = of(responses, "b")
    assert [flagged(r) for r in broken[:2]] == [("b", ["fine"], False), ("b", ["then"], False)]
    assert [error_of(r) for r in broken[2:]] == [(BOOM, "b", True)]
    assert [flagged(r) for r in of(responses, "ok")] == [("ok", ["fine"], True)]  # it went on


def test_an_error_mid_sequence_reaches_tritonclient(
    client: triton.InferenceServerClient,
) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer(
            "words", text("fine boom"), request_id="t", enable_empty_final_response=True
        )
        (result, error), (late, failure) = answers.get(timeout=30), answers.get(timeout=30)
    finally:
        client.stop_stream()
    assert error is None
    assert result.as_numpy("text_output").tolist() == [[b"fine"]]
    assert late is None
    assert failure.message() == BOOM


def test_a_bad_parameter_is_refused_before_any_response(stub: Any) -> None:
    responses = streamed(stub, request("neg", "a b", delay_ms=-1))
    assert [error_of(r) for r in responses] == [
        ("delay_ms must be a number >= 0, got -1", "neg", True)
    ]
    bad = request("flag", "a")
    bad.parameters[codec.EMPTY_FINAL].string_param = "yes"
    (response,) = streamed(stub, bad)
    assert error_of(response) == (
        f"parameter '{codec.EMPTY_FINAL}' must be a bool_param",
        "flag",
        True,
    )


def test_the_stream_flag_is_consumed_not_passed_to_the_model() -> None:
    decoded = codec.decode_infer_request(
        request("d", "a", empty_final=True, delay_ms=3), max_elements=100
    )
    assert decoded.parameters == {"delay_ms": 3}
    assert codec.empty_final_response(request("d", "a", empty_final=True))
    assert not codec.empty_final_response(request("d", "a"))
    bad = request("d", "a")
    bad.parameters[codec.EMPTY_FINAL].int64_param = 1
    with pytest.raises(ProtocolError, match="must be a bool_param"):
        codec.decode_infer_request(bad, max_elements=100)


# ---------------------------------------------------------------- cancellation


def test_cancelling_the_stream_frees_the_sequences_slot(
    client: triton.InferenceServerClient, server: Server
) -> None:
    cancelled = closed(server)
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        long = " ".join(f"w{i}" for i in range(200))
        client.async_stream_infer("words", text(long), request_id="c", parameters={"delay_ms": 50})
        result, error = answers.get(timeout=30)
        assert error is None
        assert result.as_numpy("text_output").tolist() == [[b"w0"]]
        assert active(server) == 1  # 199 words to go
    finally:
        client.stop_stream(cancel_requests=True)
    wait_until(lambda: active(server) == 0, "the cancelled sequence to leave", within=10.0)
    wait_until(lambda: closed(server) == cancelled + 1, "the cancel counted once", within=10.0)
    result = client.infer("words", text("after it"))
    assert result.as_numpy("text_output").tolist() == [[b"after it"]]


def test_cancelling_a_raw_call_frees_the_sequences_slot(stub: Any, server: Server) -> None:
    cancelled = closed(server)
    long = " ".join(f"w{i}" for i in range(200))
    call = stub.ModelStreamInfer(iter([request("k", long, delay_ms=50)]), timeout=30)
    assert flagged(next(call)) == ("k", ["w0"], False)
    call.cancel()
    wait_until(lambda: active(server) == 0, "the cancelled sequence to leave", within=10.0)
    wait_until(lambda: closed(server) == cancelled + 1, "the cancel counted once", within=10.0)
    assert [flagged(r) for r in streamed(stub, request("n", "next"))] == [("n", ["next"], True)]


def test_a_stream_past_its_deadline_counts_as_a_timeout_not_a_cancel(
    stub: Any, server: Server
) -> None:
    """grpc cancels the handler when the call's deadline passes: that is a 504's kind
    (``DEADLINE_EXCEEDED``), not the client's going, and the slot is freed all the same."""
    cancelled, timed_out = closed(server), closed(server, "timeout")
    long = " ".join(f"w{i}" for i in range(200))
    call = stub.ModelStreamInfer(iter([request("d", long, delay_ms=50)]), timeout=1.0)
    with pytest.raises(grpc.RpcError) as info:
        list(call)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    wait_until(lambda: active(server) == 0, "the expired sequence to leave", within=10.0)
    wait_until(lambda: closed(server, "timeout") == timed_out + 1, "counted once", within=10.0)
    assert closed(server) == cancelled


# ---------------------------------------------------------------- unary calls, other models


def test_model_infer_answers_the_whole_sequence_with_its_parameters(
    client: triton.InferenceServerClient,
) -> None:
    result = client.infer("words", text("u v w"), parameters={"delay_ms": 1})
    assert result.as_numpy("text_output").tolist() == [[b"u v w"]]
    with pytest.raises(triton.InferenceServerException) as info:
        client.infer("words", text("u v"), parameters={"delay_ms": -1})
    assert str(info.value.status()) == "StatusCode.INVALID_ARGUMENT"
    assert info.value.message() == "delay_ms must be a number >= 0, got -1"


def test_a_model_that_is_not_step_wise_answers_once_flagged_final(stub: Any) -> None:
    message = pb.ModelInferRequest(model_name="add_one", id="one")
    message.inputs.add(
        name="INPUT0",
        datatype="FP32",
        shape=[1, 1],
        contents=pb.InferTensorContents(fp32_contents=[1.0]),
    )
    message.parameters[codec.EMPTY_FINAL].bool_param = True
    (response,) = streamed(stub, message)
    infer = response.infer_response
    assert (response.error_message, infer.id, infer.parameters[codec.FINAL].bool_param) == (
        "",
        "one",
        True,
    )
    assert triton.InferResult(infer).as_numpy("OUTPUT0").tolist() == [[2.0]]


def test_the_config_says_decoupled_over_both_protocols(
    client: triton.InferenceServerClient, server: Server
) -> None:
    assert client.get_model_config("words").config.model_transaction_policy.decoupled
    rest = server.get_json("/v2/models/words/config")
    assert rest["model_transaction_policy"] == {"decoupled": True}
    assert not client.get_model_config("add_one").config.model_transaction_policy.decoupled
