"""Small ONNX graphs built with ``onnx.helper``, each written to a file the test names.

Every graph is real ONNX that onnxruntime loads and runs; the weights are fixed numbers, so
each test can compute the expected answer on its own.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17  # what onnxruntime 1.17, carpool's oldest supported, runs in full
IR_VERSION = 8  # the IR version that goes with opset 17

W = np.arange(12, dtype=np.float32).reshape(4, 3) / 8  # exact in binary, so sums are exact
B = np.array([0.5, -1.0, 2.0], dtype=np.float32)


def _save(path: Path, graph: onnx.GraphProto) -> Path:
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
    )
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    return path


def _info(name: str, elem_type: int, shape: list[int | str | None]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, shape)


def mixed(path: Path) -> Path:
    """Two inputs, three outputs, a dynamic batch axis and a symbolic inner axis ``seq``.

    ``y = x @ W + B``; ``total`` sums each row of ``ids``; ``doubled = ids + ids``.
    """
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["xw"]),
        helper.make_node("Add", ["xw", "B"], ["y"]),
        helper.make_node("ReduceSum", ["ids", "axes"], ["total"], keepdims=1),
        helper.make_node("Add", ["ids", "ids"], ["doubled"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mixed",
        [
            _info("x", TensorProto.FLOAT, ["batch", 4]),
            _info("ids", TensorProto.INT64, ["batch", "seq"]),
        ],
        [
            _info("y", TensorProto.FLOAT, ["batch", 3]),
            _info("total", TensorProto.INT64, ["batch", 1]),
            _info("doubled", TensorProto.INT64, ["batch", "seq"]),
        ],
        initializer=[
            numpy_helper.from_array(W, "W"),
            numpy_helper.from_array(B, "B"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "axes"),
        ],
    )
    return _save(path, graph)


def static(path: Path) -> Path:
    """One input of the fixed shape ``[2, 3]`` (no batch axis): ``y = x * 2``."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["y"])],
        "static",
        [_info("x", TensorProto.FLOAT, [2, 3])],
        [_info("y", TensorProto.FLOAT, [2, 3])],
        initializer=[numpy_helper.from_array(np.array(2, dtype=np.float32), "two")],
    )
    return _save(path, graph)


def partly_static(path: Path) -> Path:
    """``x`` has a dynamic first axis, ``bias`` a fixed one: ``y = x + bias``."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "bias"], ["y"])],
        "partly_static",
        [_info("x", TensorProto.FLOAT, ["batch", 3]), _info("bias", TensorProto.FLOAT, [2, 3])],
        [_info("y", TensorProto.FLOAT, [2, 3])],
    )
    return _save(path, graph)


def batch_probe(path: Path) -> Path:
    """``y = x * 2``, and ``seen``: every row holds the batch size the session ran with."""
    nodes = [
        helper.make_node("Mul", ["x", "two"], ["y"]),
        helper.make_node("Shape", ["x"], ["rows"], start=0, end=1),  # [batch]
        helper.make_node("Reshape", ["rows", "one_by_one"], ["rows_2d"]),  # [[batch]]
        helper.make_node("Concat", ["rows", "one"], ["seen_shape"], axis=0),  # [batch, 1]
        helper.make_node("Expand", ["rows_2d", "seen_shape"], ["seen"]),
    ]
    graph = helper.make_graph(
        nodes,
        "batch_probe",
        [_info("x", TensorProto.FLOAT, ["batch", 4])],
        [
            _info("y", TensorProto.FLOAT, ["batch", 4]),
            _info("seen", TensorProto.INT64, ["batch", 1]),
        ],
        initializer=[
            numpy_helper.from_array(np.array(2, dtype=np.float32), "two"),
            numpy_helper.from_array(np.array([1, 1], dtype=np.int64), "one_by_one"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "one"),
        ],
    )
    return _save(path, graph)


def scalar_output(path: Path) -> Path:
    """A dynamic batch axis in, a scalar out (the sum of the whole batch): no row per row."""
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0)],
        "scalar_output",
        [_info("x", TensorProto.FLOAT, ["batch", 4])],
        [_info("total", TensorProto.FLOAT, [])],
    )
    return _save(path, graph)


def strings(path: Path) -> Path:
    """A string input passed through unchanged: BYTES in, BYTES out."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["text"], ["same"])],
        "strings",
        [_info("text", TensorProto.STRING, ["batch", 2])],
        [_info("same", TensorProto.STRING, ["batch", 2])],
    )
    return _save(path, graph)


def sequence_input(path: Path) -> Path:
    """An input that is a sequence of tensors, which the v2 protocol cannot carry."""
    graph = helper.make_graph(
        [helper.make_node("SequenceLength", ["items"], ["count"])],
        "sequence_input",
        [helper.make_tensor_sequence_value_info("items", TensorProto.FLOAT, None)],
        [_info("count", TensorProto.INT64, [])],
    )
    return _save(path, graph)
