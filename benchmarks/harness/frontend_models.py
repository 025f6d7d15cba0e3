"""Models as cheap as a model can be, so a request's CPU is the front end's: ``identity``
(FP32 512 in, the same out) and ``embed`` (a text in, 512 floats out, on /v1/embeddings;
``vectors``, ``DIM``: the JSON reference's). From the repository's root: ``carpool serve
benchmarks.harness.frontend_models:identity benchmarks.harness.frontend_models:embed``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks.harness.frontend_refs import DIM, vectors
from carpool import Batching, Model, Tensor

MAX_BATCH = 64  # every closed-loop caller of the 64-client step fits one batch


def _identity(batch: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return batch


identity = Model(
    _identity,
    name="identity",
    inputs=[Tensor("INPUT0", "FP32", (DIM,))],
    outputs=[Tensor("OUTPUT0", "FP32", (DIM,))],
    batching=Batching(max_batch_size=MAX_BATCH),
)

embed = Model(
    vectors,
    name="embed",
    inputs=[Tensor("TEXT", "BYTES", (1,))],
    outputs=[Tensor("EMBEDDING", "FP32", (DIM,))],
    batching=Batching(max_batch_size=MAX_BATCH),
    openai=True,
    count_tokens=lambda inputs: 0,  # no tokenizer: usage reports 0, as documented
)
