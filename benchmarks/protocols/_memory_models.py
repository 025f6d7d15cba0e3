"""``body_memory``'s models: one number per row out, so what a request costs the server is
its body's decoding. ``rowsum``: an FP32 row of any length, its sum. ``texts``: a BYTES row
of any length, its total length in bytes. From the repository's root:
``carpool serve benchmarks.protocols._memory_models:rowsum ...:texts``.
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
