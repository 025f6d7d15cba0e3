"""The classic manually driven API: InferenceBatcher and batch_inference."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

import carpool
from carpool.compat import InferenceBatcher, batch_inference
from carpool.errors import BatchSizeMismatch

# a window no test run can reach, so "not yet" never depends on how fast the machine is
HOUR_MS = 3_600_000.0


class Model:
    """Records every batch it is given; returns each row doubled."""

    def __init__(self) -> None:
        self.batches: list[np.ndarray] = []

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        self.batches.append(batch.copy())
        return batch * 2


def vec(i: int) -> np.ndarray:
    return np.array([i, i + 0.5], dtype=np.float32)


# InferenceBatcher: construction and queueing


def test_classic_attributes_and_defaults() -> None:
    model = Model()
    batcher = InferenceBatcher(model)
    assert batcher.model_fn is model
    assert batcher.max_batch_size == 32
    assert batcher.max_wait_ms == 50.0
    assert batcher.queue == []


def test_add_request_appends_a_timestamped_entry() -> None:
    batcher = InferenceBatcher(Model(), max_batch_size=4, max_wait_ms=HOUR_MS)
    before = time.monotonic()
    x = vec(1)
    batcher.add_request(x, "r1")
    batcher.add_request(vec(2), "r2")
    after = time.monotonic()
    assert [item["id"] for item in batcher.queue] == ["r1", "r2"]
    assert batcher.queue[0]["input"] is x
    assert set(batcher.queue[0]) == {"id", "input", "timestamp"}
    assert before <= batcher.queue[0]["timestamp"] <= batcher.queue[1]["timestamp"] <= after


def test_is_exported_from_carpool() -> None:
    assert carpool.InferenceBatcher is InferenceBatcher
    assert carpool.batch_inference is batch_inference


# should_process


def test_should_process_is_false_when_empty() -> None:
    assert InferenceBatcher(Model(), max_wait_ms=0.0).should_process() is False


def test_should_process_is_false_before_the_batch_fills_or_the_wait_elapses() -> None:
    batcher = InferenceBatcher(Model(), max_batch_size=3, max_wait_ms=HOUR_MS)
    batcher.add_request(vec(0), 0)
    batcher.add_request(vec(1), 1)
    assert batcher.should_process() is False


def test_should_process_when_max_batch_size_requests_wait() -> None:
    batcher = InferenceBatcher(Model(), max_batch_size=3, max_wait_ms=HOUR_MS)
    for i in range(3):
        batcher.add_request(vec(i), i)
    assert batcher.should_process() is True


def test_should_process_when_the_oldest_waited_max_wait_ms() -> None:
    batcher = InferenceBatcher(Model(), max_batch_size=8, max_wait_ms=50.0)
    batcher.add_request(vec(0), "old")
    batcher.add_request(vec(1), "new")
    # move the oldest request's arrival back past the window instead of sleeping
    batcher.queue[0]["timestamp"] -= 0.051
    assert batcher.should_process() is True


def test_only_the_oldest_request_times_the_wait() -> None:
    batcher = InferenceBatcher(Model(), max_batch_size=8, max_wait_ms=50.0)
    batcher.add_request(vec(0), "a")
    batcher.add_request(vec(1), "b")
    batcher.queue[0]["timestamp"] = time.monotonic() + 3600.0  # the head arrived "later"
    batcher.queue[1]["timestamp"] -= 3600.0  # a later request waited long
    assert batcher.should_process() is False


def test_zero_wait_processes_at_once() -> None:
    batcher = InferenceBatcher(Model(), max_batch_size=8, max_wait_ms=0.0)
    batcher.add_request(vec(0), 0)
    assert batcher.should_process() is True


# process_batch


def test_process_batch_when_empty_returns_nothing_and_calls_nothing() -> None:
    model = Model()
    assert InferenceBatcher(model).process_batch() == []
    assert model.batches == []


def test_process_batch_stacks_calls_once_and_pairs_ids_with_rows() -> None:
    model = Model()
    batcher = InferenceBatcher(model, max_batch_size=4, max_wait_ms=HOUR_MS)
    for i in range(3):
        batcher.add_request(vec(i), f"r{i}")
    results = batcher.process_batch()
    assert len(model.batches) == 1
    np.testing.assert_array_equal(model.batches[0], np.stack([vec(0), vec(1), vec(2)]))
    assert model.batches[0].shape == (3, 2)
    assert [r["id"] for r in results] == ["r0", "r1", "r2"]
    assert all(set(r) == {"id", "output"} for r in results)
    for i, result in enumerate(results):
        np.testing.assert_array_equal(result["output"], vec(i) * 2)
    assert batcher.queue == []


def test_process_batch_takes_at_most_max_batch_size_in_fifo_order() -> None:
    model = Model()
    batcher = InferenceBatcher(model, max_batch_size=2, max_wait_ms=HOUR_MS)
    for i in range(5):
        batcher.add_request(vec(i), i)
    assert [r["id"] for r in batcher.process_batch()] == [0, 1]
    assert [item["id"] for item in batcher.queue] == [2, 3, 4]
    assert [r["id"] for r in batcher.process_batch()] == [2, 3]
    last = batcher.process_batch()
    assert [r["id"] for r in last] == [4]
    np.testing.assert_array_equal(last[0]["output"], vec(4) * 2)
    assert [b.shape for b in model.batches] == [(2, 2), (2, 2), (1, 2)]
    assert batcher.process_batch() == []


def test_process_batch_with_numpy_scalars_stacks_a_vector() -> None:
    seen: list[np.ndarray] = []

    def model(batch: np.ndarray) -> np.ndarray:
        seen.append(batch)
        return batch + 1

    batcher = InferenceBatcher(model)
    batcher.add_request(np.float64(1.0), "a")
    batcher.add_request(np.float64(2.0), "b")
    results = batcher.process_batch()
    assert seen[0].shape == (2,)
    assert [(r["id"], float(r["output"])) for r in results] == [("a", 2.0), ("b", 3.0)]


def test_process_batch_rejects_a_model_that_drops_rows() -> None:
    batcher = InferenceBatcher(lambda batch: batch[:1])
    batcher.add_request(vec(0), 0)
    batcher.add_request(vec(1), 1)
    with pytest.raises(BatchSizeMismatch) as info:
        batcher.process_batch()
    assert (info.value.expected, info.value.actual) == (2, 1)


@pytest.mark.parametrize("size", [0, -1])
def test_max_batch_size_below_one_is_refused_at_the_door(size: int) -> None:
    # Without validation, should_process() is always True and process_batch() fails with an
    # IndexError from an empty stack; the classic API must say what is wrong up front.
    with pytest.raises(ValueError, match="max_batch_size"):
        InferenceBatcher(Model(), max_batch_size=size)


# batch_inference


def test_batch_inference_calls_the_model_once_per_consecutive_chunk() -> None:
    model = Model()
    inputs = [vec(i) for i in range(7)]
    outputs = batch_inference(model, inputs, batch_size=3)
    assert [b.shape for b in model.batches] == [(3, 2), (3, 2), (1, 2)]
    np.testing.assert_array_equal(model.batches[1], np.stack(inputs[3:6]))
    assert len(outputs) == 7
    for i, output in enumerate(outputs):
        np.testing.assert_array_equal(output, vec(i) * 2)


def test_batch_inference_default_batch_size_is_32() -> None:
    model = Model()
    batch_inference(model, [vec(i) for i in range(65)])
    assert [len(b) for b in model.batches] == [32, 32, 1]


def test_batch_inference_exact_multiple() -> None:
    model = Model()
    batch_inference(model, [vec(i) for i in range(4)], batch_size=2)
    assert [len(b) for b in model.batches] == [2, 2]


def test_batch_inference_of_nothing_never_calls_the_model() -> None:
    model = Model()
    assert batch_inference(model, [], batch_size=4) == []
    assert model.batches == []


def test_batch_inference_of_python_objects_gives_the_model_lists() -> None:
    calls: list[Any] = []

    def model(batch: list[str]) -> list[str]:
        calls.append(batch)
        return [s.upper() for s in batch]

    assert batch_inference(model, ["a", "b", "c"], batch_size=2) == ["A", "B", "C"]
    assert calls == [["a", "b"], ["c"]]


@pytest.mark.parametrize("bad", [0, -3, 2.0, True, "4", None])
def test_batch_inference_validates_batch_size(bad: Any) -> None:
    model = Model()
    with pytest.raises(ValueError, match=r"^batch_size must be an int >= 1, got ") as info:
        batch_inference(model, [vec(0)], batch_size=bad)
    assert str(info.value) == f"batch_size must be an int >= 1, got {bad!r}"
    assert model.batches == []
