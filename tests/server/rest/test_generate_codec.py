"""The generate extension's encoding of one answer: every datatype's lone element as itself,
several as a list (numbers arrive as numpy arrays and scalars, which orjson must be told of)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import orjson
import pytest

from carpool.server.messages import OutputTensor
from carpool.server.rest.generate import encode


def answer(*outputs: OutputTensor) -> Any:
    return SimpleNamespace(
        served=SimpleNamespace(name="m", version="1"),
        request=SimpleNamespace(id=None),
        outputs=[(o, False) for o in outputs],
    )


@pytest.mark.parametrize(
    ("datatype", "data", "sent"),
    [
        ("INT64", np.array([7], dtype=np.int64), 7),
        ("FP32", np.array([0.5], dtype=np.float32), 0.5),
        ("BOOL", np.array([True]), True),
        ("BYTES", np.array([b"w"], dtype=object), "w"),
    ],
)
def test_a_lone_element_of_any_datatype_is_itself(datatype: str, data: Any, sent: Any) -> None:
    out = OutputTensor("out", datatype, (1,), data)
    assert orjson.loads(encode(answer(out), b"")) == {
        "model_name": "m",
        "model_version": "1",
        "out": sent,
    }


def test_several_numbers_are_a_list() -> None:
    out = OutputTensor("out", "INT64", (3,), np.array([1, 2, 3], dtype=np.int64))
    assert orjson.loads(encode(answer(out), b""))["out"] == [1, 2, 3]
