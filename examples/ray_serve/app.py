"""A Ray Serve deployment that batches with ``@carpool.batch`` instead of ``@serve.batch``.

    serve run examples.ray_serve.app:app      # or: python examples/ray_serve/app.py

Each replica keeps one carpool batcher: concurrent requests to the replica share model
calls, with carpool's policies, deadlines, priorities and per-request error isolation.
Ray Serve routes each request to a replica first and batching happens there, so set
``max_ongoing_requests`` to at least ``max_batch_size``: a replica that admits fewer requests
at a time can never fill a batch. (For one batcher in front of every replica, so that
batches stay full as replicas are added, use ``carpool serve --runner ray`` instead:
docs/ray.md.)
"""

from __future__ import annotations

from typing import Any

import numpy as np
from ray import serve

import carpool

MAX_BATCH_SIZE = 32
WEIGHTS = np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32)


@serve.deployment(num_replicas=2, max_ongoing_requests=2 * MAX_BATCH_SIZE)
class Scorer:
    """16 floats in, 4 scores out, computed a batch at a time."""

    @carpool.batch(max_batch_size=MAX_BATCH_SIZE, max_wait_ms=5.0)
    async def score(self, rows: list[np.ndarray[Any, Any]]) -> list[np.ndarray[Any, Any]]:
        batch = np.stack(rows)  # one model call for every request that met here
        return list(batch @ WEIGHTS)

    async def __call__(self, row: list[float]) -> list[float]:
        scores = await self.score(np.asarray(row, dtype=np.float32))
        return [float(s) for s in scores]

    async def batching(self) -> dict[str, float]:
        """What batching did in this replica (its batcher runs on the replica's loop)."""
        stats = self.score.batcher_stats()  # type: ignore[attr-defined]
        if stats is None:
            return {"requests": 0, "batches": 0}
        return {"requests": stats.completed, "batches": stats.batches}


app = Scorer.bind()

if __name__ == "__main__":
    handle = serve.run(app)
    print(handle.remote([1.0] * 16).result())
