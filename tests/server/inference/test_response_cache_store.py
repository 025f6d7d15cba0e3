"""The response cache: what a request's key holds and what it leaves out, entries copied out
of their batch, LRU eviction by bytes, a model's entries dropped, replays' keys and their
entries. Pure: no server."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from carpool.server.inference.admission import AdmittedRequest
from carpool.server.inference.cache import (
    ENTRY_OVERHEAD,
    Entry,
    Replayed,
    ResponseCache,
    replay_key,
    request_key,
)
from carpool.server.messages import InferInput, InferRequest, OutputTensor, RequestedOutput


def tensor(
    data: Any, *, name: str = "INPUT0", datatype: str = "FP32", **parameters: Any
) -> InferInput:
    array = np.asarray(data, dtype=object if datatype == "BYTES" else None)
    if datatype == "FP32":
        array = array.astype(np.float32)
    return InferInput(name, datatype, tuple(array.shape), array, parameters)


def request(*inputs: InferInput, **fields: Any) -> InferRequest:
    defaults: dict[str, Any] = {
        "id": "a",
        "parameters": {},
        "inputs": inputs or (tensor([[1.0, 2.0]]),),
        "outputs": None,
        "binary_data_output": False,
    }
    return InferRequest(**{**defaults, **fields})


def key(r: InferRequest, model: str = "m", generation: int = 1) -> bytes:
    return request_key(model, generation, r)


BASE = key(request())


@pytest.mark.parametrize(
    "other",
    [
        pytest.param(request(tensor([[1.0], [2.0]])), id="shape"),
        pytest.param(request(tensor(np.array([[1.0, 2.0]], np.float64), datatype="FP64")),
                     id="datatype"),
        pytest.param(request(tensor([[1.0, 2.0000002]])), id="a byte"),
        pytest.param(request(tensor([[1.0, 2.0]], name="INPUT1")), id="input name"),
        pytest.param(request(tensor([[1.0, 2.0]], scale=2)), id="input parameters"),
        pytest.param(request(tensor([[1.0, 2.0]]), tensor([[0.0]], name="B")), id="an input more"),
        pytest.param(request(outputs=(RequestedOutput("OUTPUT0", None, {}),)), id="outputs"),
        pytest.param(request(outputs=(RequestedOutput("OUTPUT0", True, {}),)),
                     id="output binary"),
        pytest.param(request(outputs=(RequestedOutput("OUTPUT0", None, {"k": 1}),)),
                     id="output parameters"),
        pytest.param(request(binary_data_output=True), id="binary_data_output"),
        pytest.param(request(parameters={"top_k": 3}), id="request parameters"),
    ],
)  # fmt: skip
def test_what_can_change_the_answer_changes_the_key(other: InferRequest) -> None:
    assert key(other) != BASE


def test_the_model_and_its_generation_are_in_the_key() -> None:
    assert key(request(), model="n") != BASE
    assert key(request(), generation=2) != BASE


@pytest.mark.parametrize(
    "same",
    [
        pytest.param(request(id="b"), id="request id"),
        pytest.param(request(id=None), id="no request id"),
        pytest.param(request(parameters={"priority": 2}), id="priority"),
        pytest.param(request(parameters={"timeout": 5000}), id="timeout"),
        pytest.param(request(tensor(np.asfortranarray([[1.0, 2.0]], np.float32))), id="layout"),
    ],
)
def test_what_changes_only_when_it_is_answered_keeps_the_key(same: InferRequest) -> None:
    assert key(same) == BASE


def test_parameters_are_keyed_by_value_and_type_not_order() -> None:
    one = key(request(parameters={"a": 1, "b": "x"}))
    assert key(request(parameters={"b": "x", "a": 1})) == one
    others = [{"a": True, "b": "x"}, {"a": 1.0, "b": "x"}, {"a": "1", "b": "x"}]
    assert len({one, *(key(request(parameters=p)) for p in others)}) == 4


def test_bytes_elements_are_framed() -> None:
    def texts(*items: bytes) -> bytes:
        return key(request(tensor(list(items), name="TEXT", datatype="BYTES")))

    assert texts(b"ab", b"c") != texts(b"a", b"bc")
    assert texts(b"ab", b"c") == texts(b"ab", b"c")
    assert texts(b"ab") != key(request(tensor(["ab"], name="TEXT", datatype="BYTES")))  # str


def test_a_non_contiguous_input_is_hashed_as_its_values() -> None:
    rows = np.arange(8, dtype=np.float32).reshape(2, 4)
    strided = rows[:, ::2]
    assert not strided.flags.c_contiguous
    contiguous = np.ascontiguousarray(strided)
    assert key(request(tensor(strided))) == key(request(tensor(contiguous)))


# -- entries ----------------------------------------------------------------------------


def admitted(rows: int = 1) -> AdmittedRequest:
    value = {"INPUT0": np.ones((rows, 4), np.float32)}
    return AdmittedRequest(value, rows, (("OUTPUT0", False),), 0, None)


def outputs(batch: np.ndarray[Any, Any]) -> list[tuple[OutputTensor, bool]]:
    return [(OutputTensor("OUTPUT0", "FP32", tuple(batch.shape), batch), True)]


def test_an_entry_owns_copies_of_its_outputs_not_views_of_the_batch() -> None:
    batch = np.arange(32, dtype=np.float32).reshape(4, 8)
    entry, nbytes = Entry.copied("m", admitted(), outputs(batch[1:2]), keep_inputs=False)
    ((kept, binary),) = entry.outputs
    assert binary is True
    assert kept.data.base is None
    assert not kept.data.flags.writeable
    assert kept.data.tolist() == [list(range(8, 16))]
    batch[1] = -1.0  # the batch's buffer reused: the entry keeps its answer
    assert kept.data.tolist() == [list(range(8, 16))]
    assert nbytes == ENTRY_OVERHEAD + 32
    assert entry.admitted.value == {}
    assert entry.admitted.rows == 1


def test_an_entry_keeps_the_admitted_inputs_when_asked() -> None:
    entry, nbytes = Entry.copied(
        "m", admitted(rows=2), outputs(np.zeros((2, 8), np.float32)), keep_inputs=True
    )
    assert entry.admitted.value["INPUT0"].shape == (2, 4)
    assert nbytes == ENTRY_OVERHEAD + 2 * 8 * 4 + 2 * 4 * 4


def test_outputs_larger_than_the_limit_are_not_copied() -> None:
    batch = np.zeros((4, 8), np.float32)
    entry, nbytes = Entry.copied(
        "m", admitted(), outputs(batch), keep_inputs=False, limit=ENTRY_OVERHEAD + 100
    )
    assert nbytes == ENTRY_OVERHEAD + 128  # over the limit: the cache will not keep it
    ((kept, _),) = entry.outputs
    assert kept.data is batch  # nothing copied for an answer only its waiters read
    copied, _ = Entry.copied(
        "m", admitted(), outputs(batch), keep_inputs=False, limit=ENTRY_OVERHEAD + 128
    )
    assert copied.outputs[0][0].data is not batch


def test_bytes_outputs_count_their_elements() -> None:
    texts = np.array([b"x" * 1000, b"y" * 10], dtype=object)
    tensors = [(OutputTensor("OUTPUT0", "BYTES", (2,), texts), False)]
    _, nbytes = Entry.copied("m", admitted(), tensors, keep_inputs=False)
    assert nbytes >= ENTRY_OVERHEAD + 1010


# -- the cache --------------------------------------------------------------------------


def entry(model: str = "m") -> Entry:
    return Entry.copied(model, admitted(), outputs(np.zeros((1, 1))), keep_inputs=False)[0]


def test_get_returns_what_was_put() -> None:
    cache = ResponseCache(1000)
    one = entry()
    assert cache.put(b"k1", one, 100)
    assert cache.get(b"k1") is one
    assert cache.get(b"k2") is None
    assert (len(cache), cache.bytes) == (1, 100)


def test_the_least_recently_used_go_first_once_the_bytes_pass_the_size() -> None:
    cache = ResponseCache(300)
    for name in (b"a", b"b", b"c"):
        cache.put(name, entry(), 100)
    assert cache.get(b"a") is not None  # now the most recently used
    cache.put(b"d", entry(), 150)  # 450 bytes: b, then c, must go
    assert [k for k in (b"a", b"b", b"c", b"d") if cache.get(k) is not None] == [b"a", b"d"]
    assert cache.bytes == 250


def test_an_entry_larger_than_the_cache_is_not_held() -> None:
    cache = ResponseCache(300)
    cache.put(b"a", entry(), 100)
    assert not cache.put(b"big", entry(), 301)
    assert cache.get(b"big") is None
    assert cache.get(b"a") is not None
    assert cache.bytes == 100


def test_putting_a_key_again_replaces_its_bytes() -> None:
    cache = ResponseCache(300)
    cache.put(b"a", entry(), 100)
    cache.put(b"a", entry(), 200)
    assert (len(cache), cache.bytes) == (1, 200)


def test_drop_forgets_every_entry_of_one_model() -> None:
    cache = ResponseCache(10_000)
    cache.put(b"m1", entry("m"), 100)
    cache.put(b"m2", entry("m"), 100)
    cache.put(b"n1", entry("n"), 100)
    assert cache.drop("m") == 2
    assert cache.get(b"m1") is None
    assert cache.get(b"m2") is None
    assert cache.get(b"n1") is not None
    assert (len(cache), cache.bytes) == (1, 100)
    assert cache.drop("m") == 0


def test_an_evicted_entry_is_not_dropped_twice() -> None:
    cache = ResponseCache(200)
    cache.put(b"m1", entry("m"), 150)
    cache.put(b"n1", entry("n"), 150)  # evicts m1
    assert cache.drop("m") == 0
    assert cache.bytes == 150


@pytest.mark.parametrize("size", [0, -1, 1.5, True])
def test_the_size_is_checked(size: Any) -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        ResponseCache(size)


# -- replays -------------------------------------------------------------------------------

PARTS = (b"141", None, b"the body")


@pytest.mark.parametrize(
    ("model", "generation", "parts"),
    [
        pytest.param("n", 1, PARTS, id="model"),
        pytest.param("m", 2, PARTS, id="generation"),
        pytest.param("m", 1, (b"140", None, b"the body"), id="a header"),
        pytest.param("m", 1, (b"141", b"", b"the body"), id="a header sent empty"),
        pytest.param("m", 1, (b"141", None, b"the bodY"), id="a byte"),
        pytest.param("m", 1, (b"14", b"1", b"the body"), id="framing"),
        pytest.param("m", 1, (b"141", None), id="a part fewer"),
    ],
)
def test_every_byte_received_is_in_a_replays_key(
    model: str, generation: int, parts: tuple[bytes | None, ...]
) -> None:
    assert replay_key(model, generation, parts) != replay_key("m", 1, PARTS)


def test_a_replays_key_is_no_requests() -> None:
    assert replay_key("m", 1, PARTS) == replay_key("m", 1, list(PARTS))
    assert len(replay_key("m", 1, PARTS)) == len(BASE) == 16
    assert replay_key("m", 1, ()) != key(request(inputs=()))


def test_a_replay_and_its_entry_are_used_together() -> None:
    cache = ResponseCache(300)
    replayed = Replayed("m", b"answer", b"e1")
    cache.put(b"e1", entry(), 100)
    cache.put(b"r1", replayed, 50)
    cache.put(b"e2", entry(), 100)
    assert cache.replayed(b"r1") is replayed
    assert cache.get(b"r1") is None  # each key answers for its own kind
    assert cache.replayed(b"e1") is None
    cache.put(b"e3", entry(), 100)  # 350 bytes: e2, the least recently used, goes
    assert [k for k in (b"e1", b"e2", b"e3") if cache.get(k) is not None] == [b"e1", b"e3"]
    assert cache.replayed(b"r1") is not None


def test_a_replay_outlives_its_entry_and_goes_with_its_model() -> None:
    cache = ResponseCache(250)
    cache.put(b"e1", entry(), 100)
    cache.put(b"r1", Replayed("m", b"answer", b"e1"), 50)
    cache.put(b"e2", entry("n"), 100)
    cache.put(b"e3", entry("n"), 100)  # e1 goes; its replay stays, as correct as it was
    assert cache.get(b"e1") is None
    assert cache.replayed(b"r1") is not None
    assert cache.drop("m") == 1
    assert cache.replayed(b"r1") is None
    assert cache.bytes == 200
