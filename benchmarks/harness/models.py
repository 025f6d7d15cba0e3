"""Model functions shared by the benchmarks (not a benchmark itself): ``sleep_model``, a
GPU-like cost (``2 ms + 50 us/row`` in ``time.sleep``, the GIL released), and ``MLP``, a
numpy float32 MLP 512 -> 2048 -> 2048 -> 512 with ReLU and fixed-seed weights, on one BLAS
thread (``benchmarks/__init__.py`` pins it).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from carpool.backends.demo import DemoMLP

IN_DIM = 512
SLEEP_FIXED_S = 0.002
SLEEP_PER_ROW_S = 0.00005


def sleep_cost_s(rows: int) -> float:
    return SLEEP_FIXED_S + SLEEP_PER_ROW_S * rows


def sleep_model(batch: Any) -> Any:
    """Sleep 2 ms + 50 us per row, return the batch (one output row per input row)."""
    time.sleep(SLEEP_FIXED_S + SLEEP_PER_ROW_S * len(batch))
    return batch


def MLP(dims: tuple[int, ...] = (512, 2048, 2048, 512), seed: int = 0) -> DemoMLP:
    """float32 MLP 512->2048->2048->512, ReLU between layers; deterministic weights."""
    return DemoMLP(dims, seed)


def make_rows(n: int, dim: int = IN_DIM, seed: int = 1) -> list[np.ndarray]:
    """n independent float32 rows of shape (dim,)."""
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((n, dim)).astype(np.float32)
    return [row.copy() for row in data]


def blas_info() -> str:
    try:
        from threadpoolctl import threadpool_info

        infos = threadpool_info()
        return ",".join(f"{i.get('internal_api')}:{i.get('num_threads')}t" for i in infos) or "none"
    except Exception:
        return "threadpoolctl not installed"
