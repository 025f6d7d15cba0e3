"""Request files: JSON lines of v2 bodies or plain objects, and strings for BYTES inputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from carpool.bench.targets.payload import InputSpec, RequestSpec
from carpool.bench.targets.requests_file import read_requests, read_strings


def _metadata(*inputs: tuple[str, str, list[int]]) -> dict[str, Any]:
    return {
        "name": "m",
        "inputs": [{"name": n, "datatype": d, "shape": s} for n, d, s in inputs],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 1]}],
    }


DEMO = _metadata(("INPUT0", "FP32", [-1, 256]))


def _lines(tmp_path: Path, *docs: Any) -> Path:
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(d if isinstance(d, str) else json.dumps(d) for d in docs) + "\n")
    return path


def test_read_requests_v2_bodies_and_plain_objects(tmp_path: Path) -> None:
    meta = _metadata(("ids", "INT64", [-1, 3]), ("text", "BYTES", [-1, 1]))
    v2 = {
        "inputs": [
            {"name": "text", "datatype": "BYTES", "shape": [2, 1], "data": ["a", "b"]},
            {"name": "ids", "datatype": "INT64", "shape": [2, 3], "data": [1, 2, 3, 4, 5, 6]},
        ]
    }
    plain = {"ids": [[7, 8, 9]], "text": [["c"]]}
    requests = read_requests(_lines(tmp_path, v2, "", plain), meta)
    assert len(requests) == 2
    np.testing.assert_array_equal(requests[0]["ids"], np.array([[1, 2, 3], [4, 5, 6]]))
    assert requests[0]["ids"].dtype == np.int64
    assert requests[0]["text"].tolist() == [[b"a"], [b"b"]]
    np.testing.assert_array_equal(requests[1]["ids"], np.array([[7, 8, 9]]))
    assert requests[1]["text"].tolist() == [[b"c"]]


def test_read_requests_plain_rows_flat_lists_and_bf16(tmp_path: Path) -> None:
    meta = _metadata(("x", "FP16", [-1, 2, 2]), ("b", "BF16", [-1, 2]))
    one_row = {"x": [[0.5, 1], [2, 3]], "b": [0.1, 0.2]}  # no batch axis: one row
    flat = {"x": [0, 1, 2, 3, 4, 5, 6, 7], "b": [1, 2, 3, 4]}  # two rows, flat
    first, second = read_requests(_lines(tmp_path, one_row, flat), meta)
    assert first["x"].shape == (1, 2, 2)
    assert first["x"].dtype == np.float16
    assert first["b"].dtype == np.float32
    assert first["b"].tolist() == [[0.10009765625, 0.2001953125]]  # rounded to BF16
    assert second["x"].shape == (2, 2, 2)
    assert second["b"].tolist() == [[1, 2], [3, 4]]


def test_read_requests_against_a_spec_needs_its_shapes(tmp_path: Path) -> None:
    spec = RequestSpec((InputSpec("x", "INT32", (2, 2)),))
    [request] = read_requests(_lines(tmp_path, {"x": [1, 2, 3, 4]}), spec)
    assert request["x"].tolist() == [[1, 2], [3, 4]]
    assert request["x"].dtype == np.int32
    with pytest.raises(ValueError, match=r"line 1: input 'x' has shape \[3\], the model takes"):
        read_requests(_lines(tmp_path, {"x": [1, 2, 3]}), spec)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{nope", "line 2: not JSON"),
        ("[1, 2]", "line 2: expected a JSON object"),
        ('{"x": [1, 2], "y": [1]}', r"line 2: input 'y' is not one of the model's \(x\)"),
        ("{}", "line 2: input 'x' is missing"),
        ('{"x": 3}', "line 2: input 'x': expected a list of values"),
        ('{"x": [[1, 2], [3]]}', "line 2: .*it holds 3 elements but the shape needs 4"),
        ('{"x": [1.5, 2]}', r"line 2: .*INT32 needs integers"),
        ('{"x": [1, 2, 3]}', r"line 2: input 'x' has shape \[3\], the model takes \[-1, 2\]"),
        (
            '{"inputs": [{"name": "x", "datatype": "INT64", "shape": [1, 2], "data": [1, 2]}]}',
            "line 2: input 'x' is INT64, the model takes INT32",
        ),
        (
            '{"inputs": [{"name": "x", "datatype": "INT32", "shape": [2], "data": [1, 2]}]}',
            r"line 2: input 'x' has shape \[2\], the model takes \[-1, 2\]",
        ),
        (
            '{"inputs": [{"name": "x", "datatype": "INT32", "shape": [1, 2], '
            '"parameters": {"binary_data_size": 8}}]}',
            "line 2: input 'x' has no 'data'",
        ),
        (
            '{"inputs": [{"name": "x", "datatype": "INT32", "shape": [1, 2], "data": [1, 2]},'
            ' {"name": "x", "datatype": "INT32", "shape": [1, 2], "data": [1, 2]}]}',
            "line 2: input 'x' is given twice",
        ),
    ],
)
def test_read_requests_errors_name_the_line(tmp_path: Path, line: str, message: str) -> None:
    meta = _metadata(("x", "INT32", [-1, 2]))
    path = _lines(tmp_path, {"x": [[1, 2]]}, line)
    with pytest.raises(ValueError, match=message):
        read_requests(path, meta)


def test_read_requests_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n  \n")
    with pytest.raises(ValueError, match="holds no requests"):
        read_requests(path, DEMO)


def test_read_strings(tmp_path: Path) -> None:
    path = tmp_path / "texts.txt"
    path.write_text("first line\n\n  second, with spaces \r\nthird")
    assert read_strings(path) == ["first line", "  second, with spaces ", "third"]
    path.write_text("\n \n")
    with pytest.raises(ValueError, match="holds no strings"):
        read_strings(path)
