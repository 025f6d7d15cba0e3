"""admit() and respond(): a decoded request checked against a model, the model's outputs
shaped into response tensors. Pure: no server, no batcher. And Admissions, which runs
admit() for a large request to a model that preprocesses in a thread of its own."""

from __future__ import annotations

import asyncio
import copy
import json
import pickle
import threading
from typing import Any

import numpy as np
import pytest

from carpool import Batching, CarpoolError, Model, Tensor
from carpool.server.inference.admission import (
    DECODE_OFFLOAD_BYTES,
    OFFLOAD_BYTES,
    Admissions,
    AdmittedRequest,
    ModelOutputError,
    admit,
    reaches,
    respond,
)
from carpool.server.messages import InferInput, InferRequest, ProtocolError
from carpool.server.rest.codec import parse_infer_request


def _pair(batch: dict[str, Any]) -> dict[str, Any]:
    return {"SUM": batch["A"] + batch["B"], "TWICE": batch["B"] * 2}


def declared(**batching: Any) -> Model:
    return Model(
        _pair,
        name="pair",
        inputs=[Tensor("A", "FP32", (2, -1)), Tensor("B", "INT64", (2, -1))],
        outputs=[Tensor("SUM", "FP32", (2, -1)), Tensor("TWICE", "INT64", (2, -1))],
        batching=Batching(**batching),
    )


def undeclared(**batching: Any) -> Model:
    return Model(lambda batch: batch, name="free", batching=Batching(**batching))


def request(doc: dict[str, Any]) -> InferRequest:
    return parse_infer_request(json.dumps(doc).encode(), None, max_elements=1 << 20)


def tensor(name: str, datatype: str, shape: list[int], fill: Any = 1) -> dict[str, Any]:
    count = int(np.prod(shape))
    return {"name": name, "datatype": datatype, "shape": shape, "data": [fill] * count}


def pair_doc(rows: int = 1, width: int = 3, **extra: Any) -> dict[str, Any]:
    return {
        "inputs": [
            tensor("A", "FP32", [rows, 2, width], 1.5),
            tensor("B", "INT64", [rows, 2, width], 2),
        ],
        **extra,
    }


def free_doc(**extra: Any) -> dict[str, Any]:
    return {"inputs": [tensor("INPUT0", "INT32", [2, 3])], **extra}


def refused(model: Model, doc: dict[str, Any]) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        admit(model, request(doc))
    assert info.value.status == 400
    return info.value


# ---------------------------------------------------------------- inputs


def test_admitting_a_request_for_a_declared_model() -> None:
    admitted = admit(declared(), request(pair_doc(rows=3, width=5)))
    assert isinstance(admitted, AdmittedRequest)
    assert admitted.rows == 3
    assert list(admitted.value) == ["A", "B"]
    assert admitted.value["A"].shape == (3, 2, 5)
    assert admitted.value["A"].dtype == np.float32
    assert admitted.value["B"].dtype == np.int64
    assert np.all(admitted.value["A"] == 1.5)
    assert admitted.outputs == (("SUM", False), ("TWICE", False))
    assert (admitted.priority, admitted.timeout_ms) == (1, None)


def test_undeclared_model_takes_any_datatype_and_row_shape() -> None:
    model = undeclared()
    for datatype, shape in [("INT32", [2, 3]), ("BOOL", [1]), ("BYTES", [4, 1, 2])]:
        fill = {"INT32": 7, "BOOL": True, "BYTES": "x"}[datatype]
        doc = {"inputs": [tensor("INPUT0", datatype, shape, fill)]}
        admitted = admit(model, request(doc))
        assert admitted.rows == shape[0]
        assert admitted.value["INPUT0"].shape == tuple(shape)
        assert admitted.outputs == (("OUTPUT0", False),)


def test_missing_input() -> None:
    doc = pair_doc()
    del doc["inputs"][0]
    error = refused(declared(), doc)
    assert error.field == "inputs"
    assert str(error) == (
        "expected 2 inputs but got 1 inputs for model 'pair'. Got input(s) ['B'], "
        "but missing required input(s) ['A']"
    )


def test_unknown_input() -> None:
    doc = pair_doc()
    doc["inputs"].append(tensor("C", "FP32", [1, 2, 3]))
    error = refused(declared(), doc)
    assert error.field == "inputs"
    assert str(error) == "unexpected inference input(s) ['C'] for model 'pair'; expected ['A', 'B']"
    error = refused(undeclared(), {"inputs": [tensor("X", "FP32", [1])]})
    assert "unexpected inference input(s) ['X'] for model 'free'" in str(error)


def test_wrong_datatype_on_a_declared_model() -> None:
    doc = pair_doc()
    doc["inputs"][1] = tensor("B", "INT32", [1, 2, 3])
    error = refused(declared(), doc)
    assert error.field == "B"
    assert str(error) == (
        "inference input 'B' data-type is 'INT32', but model 'pair' expects 'INT64'"
    )


@pytest.mark.parametrize(
    ("shape", "shown"),
    [([1, 3, 3], "[1,3,3]"), ([1, 2], "[1,2]"), ([1, 2, 3, 1], "[1,2,3,1]")],
)
def test_row_shape_must_match_the_declared_one(shape: list[int], shown: str) -> None:
    doc = pair_doc()
    doc["inputs"][0] = tensor("A", "FP32", shape)
    error = refused(declared(), doc)
    assert error.field == "A"
    assert str(error) == (
        f"unexpected shape for input 'A' for model 'pair'. Expected [-1,2,-1], got {shown}"
    )


def test_variable_dimension_takes_any_size() -> None:
    for width in (1, 7):
        assert admit(declared(), request(pair_doc(width=width))).value["B"].shape == (1, 2, width)


def test_a_shape_without_batch_dimension_is_refused() -> None:
    error = refused(undeclared(), {"inputs": [tensor("INPUT0", "FP32", [])]})
    assert error.field == "INPUT0"
    assert "batches along the first dimension" in str(error)


def test_inputs_must_agree_on_rows() -> None:
    doc = pair_doc()
    doc["inputs"][1] = tensor("B", "INT64", [2, 2, 3])
    error = refused(declared(), doc)
    assert error.field == "inputs"
    assert str(error) == "inputs disagree on the batch size (first dimension): {'A': 1, 'B': 2}"


def test_zero_rows() -> None:
    error = refused(undeclared(), {"inputs": [tensor("INPUT0", "FP32", [0, 4])]})
    assert str(error) == "the batch dimension must be at least 1, got 0"


# ---------------------------------------------------------------- outputs


def test_requested_outputs_in_request_order_with_their_encoding() -> None:
    doc = pair_doc(
        outputs=[
            {"name": "TWICE", "parameters": {"binary_data": True}},
            {"name": "SUM"},
        ]
    )
    assert admit(declared(), request(doc)).outputs == (("TWICE", True), ("SUM", False))
    doc["parameters"] = {"binary_data_output": True}
    assert admit(declared(), request(doc)).outputs == (("TWICE", True), ("SUM", True))
    doc["outputs"][0]["parameters"]["binary_data"] = False
    assert admit(declared(), request(doc)).outputs == (("TWICE", False), ("SUM", True))


def test_all_outputs_follow_binary_data_output() -> None:
    doc = pair_doc(parameters={"binary_data_output": True})
    assert admit(declared(), request(doc)).outputs == (("SUM", True), ("TWICE", True))


def test_unknown_output() -> None:
    error = refused(declared(), pair_doc(outputs=[{"name": "NOPE"}]))
    assert error.field == "outputs.NOPE"
    assert (
        str(error) == "unexpected inference output 'NOPE' for model 'pair'; it has ['SUM', 'TWICE']"
    )


# ---------------------------------------------------------------- priority and timeout


@pytest.mark.parametrize(
    ("parameters", "batching", "level"),
    [
        ({}, {}, 1),
        ({"priority": 0}, {}, 1),
        ({"priority": 0}, {"priority_levels": 5, "default_priority_level": 3}, 3),
        ({}, {"priority_levels": 5, "default_priority_level": 3}, 3),
        ({"priority": 1}, {"priority_levels": 5, "default_priority_level": 3}, 1),
        ({"priority": 5}, {"priority_levels": 5, "default_priority_level": 3}, 5),
        ({"priority": 1000}, {}, 1000),  # no levels declared: any priority
    ],
)
def test_priority(parameters: dict[str, Any], batching: dict[str, Any], level: int) -> None:
    assert admit(undeclared(**batching), request(free_doc(parameters=parameters))).priority == level


def test_priority_beyond_the_levels() -> None:
    error = refused(undeclared(priority_levels=5), free_doc(parameters={"priority": 6}))
    assert error.field == "parameters.priority"
    assert str(error) == "parameter 'priority' must be in [0, 5] for model 'free', got 6"


@pytest.mark.parametrize(
    ("timeout_us", "default_ms", "expected_ms"),
    [
        (None, None, None),
        (0, None, None),  # Triton: 0 means no timeout of its own
        (2500, None, 2.5),
        (None, 10.0, 10.0),
        (0, 10.0, 10.0),
        (5000, 10.0, 5.0),  # a request may shorten the default
        (20000, 10.0, 10.0),  # ... never extend it
        (10000, 10.0, 10.0),
    ],
)
def test_timeout_in_microseconds_only_shortens_the_default(
    timeout_us: int | None, default_ms: float | None, expected_ms: float | None
) -> None:
    parameters = {} if timeout_us is None else {"timeout": timeout_us}
    model = undeclared(default_timeout_ms=default_ms)
    assert admit(model, request(free_doc(parameters=parameters))).timeout_ms == expected_ms


@pytest.mark.parametrize("name", ["priority", "timeout"])
@pytest.mark.parametrize("value", [-1, 2.5, "3", True, False])
def test_priority_and_timeout_must_be_non_negative_integers(name: str, value: Any) -> None:
    error = refused(undeclared(), free_doc(parameters={name: value}))
    assert error.field == f"parameters.{name}"
    assert str(error) == f"parameter '{name}' must be a non-negative integer, got {value!r}"


@pytest.mark.parametrize("name", ["sequence_id", "sequence_start", "sequence_end"])
@pytest.mark.parametrize("value", [7, "abc", True])
def test_sequence_parameters_are_refused(name: str, value: Any) -> None:
    error = refused(declared(), pair_doc(parameters={name: value}))
    assert error.field == f"parameters.{name}"
    assert "is stateless; sequence batching is not supported" in str(error)


def test_custom_parameters_are_allowed() -> None:
    doc = free_doc(parameters={"temperature": 0.5, "label": "x", "flag": True})
    assert admit(undeclared(), request(doc)).rows == 2


# ---------------------------------------------------------------- respond


def test_respond_casts_to_the_declared_datatypes() -> None:
    model = declared()
    admitted = admit(model, request(pair_doc(rows=2)))
    result = model.batched_fn()(admitted.value)
    assert result["SUM"].dtype == np.float64  # float32 + int64
    tensors = respond(model, admitted, result)
    assert [(t.name, t.datatype, t.shape, binary) for t, binary in tensors] == [
        ("SUM", "FP32", (2, 2, 3), False),
        ("TWICE", "INT64", (2, 2, 3), False),
    ]
    assert tensors[0][0].data.dtype == np.float32
    assert np.all(tensors[0][0].data == 3.5)
    assert np.all(tensors[1][0].data == 4)


def test_respond_sends_only_what_was_requested_in_that_order() -> None:
    model = declared()
    doc = pair_doc(outputs=[{"name": "TWICE", "parameters": {"binary_data": True}}])
    admitted = admit(model, request(doc))
    tensors = respond(model, admitted, model.batched_fn()(admitted.value))
    assert [(t.name, binary) for t, binary in tensors] == [("TWICE", True)]


@pytest.mark.parametrize(
    ("array", "datatype"),
    [
        (np.zeros((2, 3), np.int32), "INT32"),
        (np.zeros((2,), np.float16), "FP16"),
        (np.array([[True], [False]]), "BOOL"),
        (np.array([b"a", b"bc"], object), "BYTES"),
        (np.array(["a", "bc"]), "BYTES"),
    ],
)
def test_respond_names_an_undeclared_output_by_its_dtype(
    array: np.ndarray[Any, Any], datatype: str
) -> None:
    model = undeclared()
    admitted = admit(model, request(free_doc()))
    ((output, binary),) = respond(model, admitted, {"OUTPUT0": array})
    assert (output.name, output.datatype, output.shape, binary) == (
        "OUTPUT0",
        datatype,
        array.shape,
        False,
    )


def test_respond_without_a_requested_output_is_a_model_error() -> None:
    model = declared()
    admitted = admit(model, request(pair_doc()))
    with pytest.raises(ModelOutputError) as info:
        respond(model, admitted, {"SUM": np.zeros((1, 2, 3))})
    assert str(info.value) == "model 'pair' returned outputs ['SUM'], without 'TWICE'"
    assert isinstance(info.value, RuntimeError)
    assert isinstance(info.value, CarpoolError)


@pytest.mark.parametrize(
    "clone", [lambda e: pickle.loads(pickle.dumps(e)), copy.copy, copy.deepcopy]
)
def test_model_output_error_survives_pickling_and_copying(clone: Any) -> None:
    error = ModelOutputError("model 'pair' returned outputs [], without 'SUM'")
    again = clone(error)
    assert type(again) is ModelOutputError
    assert str(again) == again.message == "model 'pair' returned outputs [], without 'SUM'"


@pytest.mark.parametrize("shape", [(1, 2, 3, 1), (1, 3, 3), (1, 2)])
def test_respond_refuses_an_output_unlike_its_declaration(shape: tuple[int, ...]) -> None:
    """Declared outputs are a promise made in metadata: rows of [2,-1] here."""
    model = declared()
    admitted = admit(model, request(pair_doc()))
    result = {"SUM": np.zeros(shape, np.float32), "TWICE": np.zeros((1, 2, 3), np.int64)}
    with pytest.raises(ModelOutputError, match="SUM"):
        respond(model, admitted, result)


def test_a_request_of_more_rows_than_the_cap_is_refused_naming_the_setting() -> None:
    model = undeclared(max_batch_size=4)  # the cap: 4 x 4 = 16 rows
    doc = {"inputs": [tensor("INPUT0", "INT32", [16, 1])]}
    assert admit(model, request(doc)).rows == 16  # split over 4 batches downstream
    doc = {"inputs": [tensor("INPUT0", "INT32", [17, 1])]}
    with pytest.raises(ProtocolError) as info:
        admit(model, request(doc))
    assert str(info.value) == (
        "inference request batch-size must be <= 16 for 'free': it holds 17 rows; send fewer, "
        "or raise max_rows_per_request (--max-rows-per-request)"
    )
    assert (info.value.status, info.value.field) == (400, "inputs")
    roomy = undeclared(max_batch_size=4, max_rows_per_request=17)
    assert admit(roomy, request(doc)).rows == 17


def test_zero_size_rows_count_as_rows() -> None:
    """A shape of many rows of nothing holds no elements, and used to pass every limit: the
    scheduler then ran batch after empty batch of it."""
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2**59, 0], "data": []}]}
    with pytest.raises(ProtocolError, match=f"it holds {2**59} rows"):
        admit(undeclared(), request(doc))


@pytest.mark.parametrize("value", [0, -1, 1.5, "8"])
def test_max_rows_per_request_must_be_a_positive_int(value: Any) -> None:
    with pytest.raises(ValueError, match="max_rows_per_request"):
        Batching(max_rows_per_request=value)


# ---------------------------------------------------------------- admissions: inline or a thread


class Tokenizer:
    """A preprocess that notes the thread it ran on, and can be held until released."""

    def __init__(self, *, hold: bool = False) -> None:
        self.threads: list[threading.Thread] = []
        self.running = 0
        self.most_at_once = 0
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)
        self._lock = threading.Lock()
        if not hold:
            self.release.set()

    def __call__(self, inputs: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.threads.append(threading.current_thread())
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        self.entered.release()
        try:
            assert self.release.wait(30.0)
            texts = inputs["TEXT"].reshape(-1)
            if any(text == b"refuse" for text in texts):
                raise ValueError("a text it refuses")
            return {"LENGTH": np.array([[len(text)] for text in texts], np.int64)}
        finally:
            with self._lock:
                self.running -= 1


def text_model(tokenizer: Tokenizer) -> Model:
    return Model(
        lambda batch: batch["LENGTH"],
        name="texts",
        inputs=[Tensor("TEXT", "BYTES", (1,))],
        outputs=[Tensor("OUT", "INT64", (1,))],
        preprocess=tokenizer,
    )


def texts(*items: bytes) -> InferRequest:
    data = np.empty((len(items), 1), dtype=object)
    data[:, 0] = items
    tensor = InferInput("TEXT", "BYTES", data.shape, data, {})
    return InferRequest(
        id=None, parameters={}, inputs=(tensor,), outputs=None, binary_data_output=False
    )


def test_reaches_counts_bytes_elements_by_their_length_and_numbers_by_their_size() -> None:
    assert reaches(texts(b"x" * 10, b"y" * 10), 20)
    assert not reaches(texts(b"x" * 10, b"y" * 9), 20)
    assert reaches(texts(*[b""] * 20), 20)  # each element costs something: 20 elements
    numbers = request({"inputs": [tensor("INPUT0", "FP32", [2, 3])]})  # 24 bytes
    assert reaches(numbers, 24)
    assert not reaches(numbers, 25)


async def test_a_small_request_is_admitted_inline_and_a_large_one_in_a_thread() -> None:
    tokenizer = Tokenizer()
    model = text_model(tokenizer)
    admissions = Admissions(threads=2)
    small = b"x" * (OFFLOAD_BYTES - 1)
    admitted = await admissions.admit(model, texts(small))
    assert admitted.value["LENGTH"].tolist() == [[OFFLOAD_BYTES - 1]]
    assert tokenizer.threads == [threading.current_thread()]  # the loop's own
    assert admissions.offloaded == 0
    large = [b"x" * (OFFLOAD_BYTES // 2), b"y" * (OFFLOAD_BYTES // 2)]  # at the threshold
    admitted = await admissions.admit(model, texts(*large))
    assert admitted.value["LENGTH"].tolist() == [[OFFLOAD_BYTES // 2]] * 2
    assert tokenizer.threads[1] is not threading.current_thread()
    assert tokenizer.threads[1].name.startswith("carpool-admit")
    assert admissions.offloaded == 1


async def test_a_body_is_decoded_inline_below_the_offload_size_and_in_a_thread_at_it() -> None:
    admissions = Admissions(threads=1)

    def where(tag: str, *, suffix: str) -> tuple[str, str]:
        return tag + suffix, threading.current_thread().name

    small = await admissions.decode(DECODE_OFFLOAD_BYTES - 1, where, "a", suffix="!")
    assert small == ("a!", threading.current_thread().name)
    large = await admissions.decode(DECODE_OFFLOAD_BYTES, where, "b", suffix="?")
    assert large[0] == "b?"
    assert large[1].startswith("carpool-admit")
    assert admissions.offloaded == 1
    admissions.close()


async def test_a_model_without_a_preprocess_is_always_admitted_inline() -> None:
    admissions = Admissions(threads=1, offload_bytes=1)
    admitted = await admissions.admit(undeclared(), request(free_doc()))
    assert admitted.rows == 2
    assert admissions.offloaded == 0


async def test_a_refusal_in_a_thread_is_the_same_400() -> None:
    model = text_model(Tokenizer())
    for admissions in (Admissions(threads=1), Admissions(threads=1, offload_bytes=1)):
        with pytest.raises(ProtocolError) as info:
            await admissions.admit(model, texts(b"refuse"))
        assert (info.value.status, str(info.value)) == (
            400,
            "model 'texts' cannot use this request's inputs: a text it refuses",
        )
    assert admissions.offloaded == 1


async def test_at_most_threads_admissions_run_at_once_and_the_rest_wait_their_turn() -> None:
    """Six large requests, two threads: two preprocess at once, four wait on the loop (not
    in the pool's queue); a waiter that is cancelled takes no turn. Meanwhile the loop is
    free: a small request is admitted inline."""
    tokenizer = Tokenizer(hold=True)
    model = text_model(tokenizer)
    admissions = Admissions(threads=2, offload_bytes=8)
    calls = [asyncio.create_task(admissions.admit(model, texts(b"%08d" % i))) for i in range(6)]
    for _ in range(2):
        assert await asyncio.to_thread(tokenizer.entered.acquire, True, 30.0)
    await asyncio.sleep(0.05)  # room for a third to start, were it let
    assert (tokenizer.running, admissions.offloaded) == (2, 2)
    assert admissions._pool is not None
    assert admissions._pool._work_queue.qsize() == 0  # the others wait on the loop
    calls[2].cancel()
    admitted = await admissions.admit(text_model(Tokenizer()), texts(b"inline"))
    assert admitted.value["LENGTH"].tolist() == [[6]]
    tokenizer.release.set()
    done = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(done[2], asyncio.CancelledError)
    lengths = [a.value["LENGTH"].tolist() for i, a in enumerate(done) if i != 2]
    assert lengths == [[[8]]] * 5
    assert tokenizer.most_at_once == 2
    assert admissions.offloaded == 5
