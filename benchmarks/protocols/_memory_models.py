"""``body_memory.py``'s models (not a benchmark itself): each answers one number per row, so
what a request costs the server is its body's decoding, not its answer.

* ``rowsum``: one FP32 input of any length per row, its sum out.
* ``texts``: one BYTES input of any length per row, its total length in bytes out.

Served as ``carpool serve _memory_models:rowsum _memory_models:texts`` with ``benchmarks/``
on ``PYTHONPATH``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from carpool import Batching, Model, Tensor

Array = np.ndarray[Any, Any]


def _sums(batch: Array) -> Array:
    return batch.sum(axis=1, keepdims=True, dtype=np.float32)


def _lengths(batch: Array) -> Array:
    return np.array([[sum(len(item) for item in row)] for row in batch], dtype=np.float32)


rowsum = Model(
    _sums,
    name="rowsum",
    inputs=[Tensor("X", "FP32", (-1,))],
    outputs=[Tensor("Y", "FP32", (1,))],
    batching=Batching(max_batch_size=4),
)

texts = Model(
    _lengths,
    name="texts",
    inputs=[Tensor("T", "BYTES", (-1,))],
    outputs=[Tensor("Y", "FP32", (1,))],
    batching=Batching(max_batch_size=4),
)
