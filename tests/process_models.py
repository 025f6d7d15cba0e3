"""Models for tests/runners/test_processes.py, importable by the worker processes it spawns.

Each misbehaves in one way on purpose: dies, hangs, fails to load, holds the GIL. They are
module-level so that a spec pickles by reference; rows are numpy float arrays whose first
column steers the misbehaviour (a poisoned row, a row that hangs).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import time
from typing import Any

import numpy as np

from carpool.backends.demo import DemoMLP

POISON = -1.0  # a row whose first value is this kills the worker (os._exit(1))
HANG = -2.0  # a row whose first value is this hangs the worker
SLOW = -3.0  # a batch whose first value is this sleeps SLOW_S first, holding nothing
SEGFAULT = -4.0  # a row whose first value is this crashes the worker (SIGSEGV)
SLOW_S = 0.5


def echo(batch: Any) -> Any:
    """The batch back, unchanged (transport cost only); the strings ``"raise-value"`` and
    ``"raise-unpicklable"`` raise instead."""
    if isinstance(batch, str) and batch == "raise-value":
        raise ValueError("bad batch")
    if isinstance(batch, str) and batch == "raise-unpicklable":
        raise Unpicklable(1, 2)
    return batch


def double(batch: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return batch * 2


async def async_double(batch: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    await asyncio.sleep(0)
    return batch * 2


def mlp() -> DemoMLP:
    """A factory: the demo MLP with its fixed weights, built once in the worker."""
    return DemoMLP()


def pid_and_double(batch: np.ndarray[Any, Any]) -> dict[str, np.ndarray[Any, Any]]:
    """``2x`` and the worker's pid per row; a batch starting with SLOW sleeps first."""
    if batch.size and batch.flat[0] == SLOW:
        time.sleep(SLOW_S)
    pid = np.full(len(batch), os.getpid(), dtype=np.int64)
    return {"y": batch * 2, "pid": pid}


def troublemaker(batch: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Doubles rows; exits the process on a POISON row, segfaults on a SEGFAULT row, hangs
    on a HANG row, raises ValueError on a NaN row."""
    first = batch[:, 0]
    if (first == POISON).any():
        os._exit(1)
    if (first == SEGFAULT).any():
        ctypes.string_at(0)  # reads address 0: SIGSEGV, as a broken native library would
    if (first == HANG).any():
        time.sleep(3600)
    if np.isnan(first).any():
        raise ValueError("NaN in the batch")
    return batch * 2


def gil_spin(batch: np.ndarray[Any, Any]) -> dict[str, Any]:
    """Holds the GIL for about ``batch[0, 0]`` seconds of pure Python, and reports when it
    started and ended (``time.time()``: comparable across processes) and its pid."""
    start = time.time()
    end = start + float(batch[0, 0])
    n = 0
    while time.time() < end:
        n += 1
    return {
        "start": np.full(len(batch), start),
        "end": np.full(len(batch), time.time()),
        "pid": np.full(len(batch), os.getpid()),
    }


def not_a_model() -> Any:
    """A factory that gives something that is not a model."""
    return 42


def loads_until(marker: str) -> Any:
    """A factory whose model loads until the file ``marker`` exists (a replica restarted
    after that cannot load it)."""
    if os.path.exists(marker):
        raise RuntimeError(f"the model is gone ({marker} exists)")
    return pid_and_double


def broken_factory() -> Any:
    """A factory that cannot load its model."""
    raise RuntimeError("weights file /nowhere/model.bin is missing")


class Unpicklable(Exception):
    """An exception that pickles but cannot be rebuilt (its __init__ needs two args)."""

    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"unpicklable {a} {b}")


def node_and_double(batch: np.ndarray[Any, Any]) -> dict[str, np.ndarray[Any, Any]]:
    """``2x``, and the Ray node each row ran on (for runner="ray" placement)."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    return {"y": batch * 2, "node": np.array([node] * len(batch), dtype=object)}
