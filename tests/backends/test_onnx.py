"""carpool.backends.onnx: the signature read from real ONNX graphs, results through the
batcher equal to onnxruntime's own on each request alone, and errors that name the file."""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from carpool import Batching, Tensor
from carpool.backends.onnx import onnx_model

from . import onnx_graphs

LOGGER = "carpool.backends.onnx"


def session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_metadata_is_read_from_the_graph(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model = onnx_model(onnx_graphs.mixed(tmp_path / "mixed.onnx"))
    assert model.name == "mixed"
    assert model.version == "1"
    assert model.platform == "onnxruntime_onnx"
    assert model.inputs == (Tensor("x", "FP32", (4,)), Tensor("ids", "INT64", (-1,)))
    assert model.outputs == (
        Tensor("y", "FP32", (3,)),
        Tensor("total", "INT64", (1,)),
        Tensor("doubled", "INT64", (-1,)),
    )
    assert model.batching == Batching()
    assert caplog.records == []


def test_name_version_and_batching_are_kept(tmp_path: Path) -> None:
    batching = Batching(max_batch_size=4, max_wait_ms=1.0)
    path = onnx_graphs.mixed(tmp_path / "mixed.onnx")
    model = onnx_model(path, name="scorer", version="7", batching=batching)
    assert (model.name, model.version, model.batching) == ("scorer", "7", batching)


def test_bytes_are_strings_inside_and_bytes_outside(tmp_path: Path) -> None:
    model = onnx_model(onnx_graphs.strings(tmp_path / "strings.onnx"))
    assert model.inputs == (Tensor("text", "BYTES", (2,)),)
    assert model.outputs == (Tensor("same", "BYTES", (2,)),)
    text = np.array([[b"carpool", "caf\u00e9".encode()]], dtype=object)
    out = model.fn(text)["same"]
    assert out.dtype == object
    assert out.tolist() == [[b"carpool", "caf\u00e9".encode()]]
    assert model.fn(np.array([["a", "b"]]))["same"].tolist() == [[b"a", b"b"]]


def test_inputs_are_cast_to_the_graph_dtype_and_made_contiguous(tmp_path: Path) -> None:
    model = onnx_model(onnx_graphs.batch_probe(tmp_path / "probe.onnx"))
    wide = np.arange(16, dtype=np.float64).reshape(2, 8)
    out = model.fn(wide[:, ::2])  # float64 and not contiguous; the graph takes float32
    assert out["y"].dtype == np.float32
    np.testing.assert_array_equal(out["y"], wide[:, ::2] * 2)


@pytest.mark.parametrize("workers", [1, 2])
async def test_batched_results_equal_the_session_on_each_request_alone(
    tmp_path: Path, workers: int
) -> None:
    path = onnx_graphs.mixed(tmp_path / "mixed.onnx")
    model = onnx_model(path, batching=Batching(max_batch_size=8, workers=workers))
    rng = np.random.default_rng(0)
    requests = [  # small integers: every product and sum is exact in float32
        {
            "x": rng.integers(-5, 6, (rows, 4)).astype(np.float32),
            "ids": rng.integers(0, 100, (rows, seq)),
        }
        for rows, seq in [(1 + i % 3, 5 if i % 4 else 7) for i in range(12)]
    ]
    async with model.batcher() as b:
        results = await asyncio.gather(*(b.infer_many(r) for r in requests))
        stats = b.stats()
    reference = session(path)
    for request, result in zip(requests, results, strict=True):
        expected = dict(zip(["y", "total", "doubled"], reference.run(None, request), strict=True))
        assert sorted(result) == sorted(expected)
        for name, array in expected.items():
            np.testing.assert_array_equal(result[name], array, strict=True)
    assert stats.completed == len(requests)
    assert stats.batches < len(requests)


async def test_a_graph_without_a_batch_axis_runs_each_request_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = onnx_graphs.static(tmp_path / "static.onnx")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        model = onnx_model(path, batching=Batching(max_batch_size=8, allowed_batch_sizes=(4, 8)))
    assert caplog.record_tuples == [
        (
            LOGGER,
            logging.WARNING,
            f"ONNX model 'static' ({path}): input 'x' has shape [2, 3], with no dynamic first "
            "axis to batch along; serving it with batching off (each request runs alone, in "
            "that shape)",
        )
    ]
    assert model.batching == Batching(max_batch_size=0)
    assert model.inputs == (Tensor("x", "FP32", (2, 3)),)
    assert model.outputs == (Tensor("y", "FP32", (2, 3)),)
    xs = [np.arange(6, dtype=np.float32).reshape(2, 3) + i for i in range(3)]
    async with model.batcher() as b:
        results = await asyncio.gather(*(b.infer({"x": x}) for x in xs))
        stats = b.stats()
    for x, result in zip(xs, results, strict=True):
        np.testing.assert_array_equal(result["y"], x * 2, strict=True)
    assert (stats.batches, stats.batch_sizes) == (3, {1: 3})


def test_one_input_without_a_batch_axis_turns_batching_off(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = onnx_graphs.partly_static(tmp_path / "partly.onnx")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        model = onnx_model(path)
    assert [r.getMessage() for r in caplog.records] == [
        f"ONNX model 'partly' ({path}): input 'bias' has shape [2, 3], with no dynamic first "
        "axis to batch along; serving it with batching off (each request runs alone, in "
        "that shape)"
    ]
    assert model.batching.max_batch_size == 0
    assert model.inputs == (Tensor("x", "FP32", (-1, 3)), Tensor("bias", "FP32", (2, 3)))


def test_batching_turned_off_by_the_caller_is_not_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = onnx_graphs.static(tmp_path / "static.onnx")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        model = onnx_model(path, batching=Batching(max_batch_size=0))
    assert caplog.records == []
    assert model.batching == Batching(max_batch_size=0)


async def test_the_session_sees_only_allowed_batch_sizes(tmp_path: Path) -> None:
    # batch_probe's "seen" output tells each row the batch size the session ran with.
    path = onnx_graphs.batch_probe(tmp_path / "probe.onnx")
    model = onnx_model(path, batching=Batching(max_batch_size=8, allowed_batch_sizes=(4, 8)))
    xs = [np.full((1 + i % 3, 4), i, dtype=np.float32) for i in range(6)]  # 12 rows
    async with model.batcher() as b:
        alone = await b.infer_many({"x": xs[0]})
        results = await asyncio.gather(*(b.infer_many({"x": x}) for x in xs))
        stats = b.stats()
    assert alone["seen"].tolist() == [[4]]
    seen: set[int] = set()
    for x, result in zip(xs, results, strict=True):
        np.testing.assert_array_equal(result["y"], x * 2, strict=True)
        assert result["seen"].shape == (len(x), 1)
        seen.update(result["seen"].ravel().tolist())
    assert seen <= {4, 8}
    assert stats.batches < 1 + len(xs)


def test_session_options_and_default_providers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[dict[str, Any]] = []

    class Recording(ort.InferenceSession):
        def __init__(self, path: str, **kwargs: Any) -> None:
            made.append(kwargs)
            super().__init__(path, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", Recording)
    onnx_model(onnx_graphs.mixed(tmp_path / "m.onnx"), intra_op_threads=1, inter_op_threads=2)
    [kwargs] = made
    options = kwargs["sess_options"]
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (1, 2)
    available = ort.get_available_providers()
    preferred = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert kwargs["providers"] == [p for p in preferred if p in available]


def test_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.onnx"
    message = f"ONNX model {path}: no such file; give the path of a .onnx file"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        onnx_model(path)


def test_a_file_that_is_not_onnx(tmp_path: Path) -> None:
    path = tmp_path / "notes.onnx"
    path.write_text("not a model")
    head = f"ONNX model {path}: onnxruntime cannot load it ("
    tail = "); give a file exported to ONNX, e.g. with torch.onnx.export"
    with pytest.raises(
        ValueError, match=f"^{re.escape(head)}.*INVALID_PROTOBUF.*{re.escape(tail)}$"
    ):
        onnx_model(path)


def test_an_unknown_provider(tmp_path: Path) -> None:
    path = onnx_graphs.mixed(tmp_path / "mixed.onnx")
    message = (
        f"ONNX model {path}: execution providers ['NoSuchExecutionProvider'] are not "
        f"available; choose from {ort.get_available_providers()}"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        onnx_model(path, providers=["CPUExecutionProvider", "NoSuchExecutionProvider"])
    with pytest.raises(ValueError, match=re.escape(f"ONNX model {path}: none given; choose")):
        onnx_model(path, providers=[])
    with pytest.raises(TypeError, match=re.escape("e.g. ['CPUExecutionProvider']")):
        onnx_model(path, providers="CPUExecutionProvider")


def test_an_input_type_the_protocol_cannot_carry(tmp_path: Path) -> None:
    path = onnx_graphs.sequence_input(tmp_path / "seq.onnx")
    message = (
        f"ONNX model {path}: input 'items' has type seq(tensor(float)), which carpool cannot "
        "carry; it serves tensors of float, double, float16, int8, int16, int32, int64, uint8, "
        "uint16, uint32, uint64, bool, string"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        onnx_model(path)


def test_a_scalar_output_cannot_be_batched(tmp_path: Path) -> None:
    path = onnx_graphs.scalar_output(tmp_path / "scalar.onnx")
    with pytest.raises(ValueError, match=re.escape(f"ONNX model {path}: output 'total' has no")):
        onnx_model(path)
    model = onnx_model(path, batching=Batching(max_batch_size=0))
    assert model.inputs == (Tensor("x", "FP32", (-1, 4)),)
    assert model.outputs == (Tensor("total", "FP32", ()),)


def test_a_negative_thread_count(tmp_path: Path) -> None:
    path = onnx_graphs.mixed(tmp_path / "mixed.onnx")
    message = "intra_op_threads must be an int >= 0 (0: onnxruntime's default), got -1"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        onnx_model(path, intra_op_threads=-1)
