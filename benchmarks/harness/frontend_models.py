"""``frontend_cpu.py``'s models (not a benchmark itself): as cheap as a model can be, so that
the CPU a request costs ``carpool serve`` is its front end's, not the model's.

* ``identity``: one FP32 input of 512, one FP32 output of 512, its input returned.
* ``embed``: one text in, a 512-float vector out (its UTF-8 length added to 0..511), opted
  in to OpenAI's ``/v1/embeddings``; no tokenizer, 0 tokens counted.

Served as ``carpool serve _frontend_models:identity _frontend_models:embed`` with
``benchmarks/`` on ``PYTHONPATH``. ``vectors`` and ``DIM`` are the JSON reference's
(``frontend_refs.py``), which computes the same answer without carpool.
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
