"""Models the server tests serve, as ``carpool serve models:NAME`` targets (cwd = this folder).

Every model's output depends only on its own input row, so a test can compute what each
request must get back no matter how requests were batched together.

Gates make timing deterministic: a gated model first appends its batch size to
``$CARPOOL_TEST_GATES/<name>.started`` (so a test can see that a batch is running), then
blocks while ``$CARPOOL_TEST_GATES/<name>.closed`` exists. A test closes the gate, sends a
request that then holds the model's only worker, queues more requests behind it, and opens
the gate when it has seen what it needs: no sleep ever decides an outcome.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from carpool import Batching, Model, Tensor

__all__ = [
    "add_one",
    "deliberate",
    "exits",
    "expand",
    "fails_in_worker",
    "flaky",
    "gated",
    "identity",
    "lengths",
    "not_numbers",
    "pair",
    "rowsum",
    "troublemaker",
    "upper",
    "wrong_dtype",
    "wrong_rows",
    "wrong_shape",
]

Array = np.ndarray[Any, Any]
GATES_ENV = "CARPOOL_TEST_GATES"
GATE_LIMIT_S = 60.0  # a gate left closed by a failed test must not hang the server forever
NEGATIVE = "negative input is not allowed"
EXIT_MARKER = 13  # the row value that makes ``exits`` raise SystemExit(3)


def _gate(name: str, rows: int) -> None:
    folder = os.environ.get(GATES_ENV)
    if not folder:
        return
    gates = Path(folder)
    with open(gates / f"{name}.started", "a") as log:
        log.write(f"{rows}\n")
    closed = gates / f"{name}.closed"
    deadline = time.monotonic() + GATE_LIMIT_S
    while closed.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"gate {closed} stayed closed for {GATE_LIMIT_S:g}s")
        time.sleep(0.002)


def add_one(batch: Array) -> Array:
    """A plain function with no declared signature: any numeric rows, plus one."""
    return batch + 1


def identity(batch: Array) -> Array:
    """A plain function returning its batch: round-trips every datatype."""
    return batch


def gated(batch: Array) -> Array:
    """``identity`` behind the ``gated`` gate."""
    _gate("gated", len(batch))
    return batch


def flaky(batch: Array) -> Array:
    """``add_one`` behind the ``flaky`` gate that raises ValueError when any row is negative.

    The message does not depend on the batch, so every failing request reads the same one.
    """
    _gate("flaky", len(batch))
    if (batch < 0).any():
        raise ValueError(NEGATIVE)
    return batch + 1


def exits(batch: Array) -> Array:
    """``add_one``, whose call raises ``SystemExit(3)`` when any row is ``EXIT_MARKER``."""
    if (batch == EXIT_MARKER).any():
        raise SystemExit(3)
    return batch + 1


def wrong_rows(batch: Array) -> Array:
    """Returns one row more than it was given: a broken model."""
    return np.concatenate([batch, batch[:1]])


wrong_shape = Model(
    lambda batch: batch[:, :3],
    name="wrong_shape",
    inputs=[Tensor("INPUT0", "FP32", (4,))],
    outputs=[Tensor("OUTPUT0", "FP32", (4,))],
)  # declares rows of 4, returns rows of 3: a broken model


def _pair(batch: dict[str, Array]) -> dict[str, Array]:
    return {"SUM": batch["INPUT0"] + batch["INPUT1"], "DOUBLED": batch["INPUT1"] * 2}


pair = Model(
    _pair,
    name="pair",
    inputs=[Tensor("INPUT0", "FP32", (4,)), Tensor("INPUT1", "INT64", (4,))],
    outputs=[Tensor("SUM", "FP32", (4,)), Tensor("DOUBLED", "INT64", (4,))],
    batching=Batching(max_batch_size=16),
)


def _upper(batch: Array) -> Array:
    flat = [bytes(item).upper() for item in batch.reshape(-1)]
    return np.array(flat, dtype=object).reshape(batch.shape)


upper = Model(
    _upper,
    name="upper",
    inputs=[Tensor("TEXT", "BYTES", (-1,))],
    outputs=[Tensor("UPPER", "BYTES", (-1,))],
)


def _lengths(batch: Array) -> Array:
    # Per text: its UTF-8 bytes and its words (split on spaces), as floats.
    texts = [bytes(item) for item in batch.reshape(-1)]
    return np.array([[len(t), len(t.split())] for t in texts], dtype=np.float32)


lengths = Model(
    _lengths,
    name="lengths",
    inputs=[Tensor("TEXT", "BYTES", (1,))],
    outputs=[Tensor("COUNTS", "FP32", (2,))],
)  # text in, one vector out, no tokenizer: may opt in to OpenAI's embeddings route


def _deliberate(batch: Array) -> Array:
    time.sleep(0.02)  # every batch takes 20 ms, and the cost model learns it at start
    return batch * 2


deliberate = Model(
    _deliberate,
    name="deliberate",
    inputs=[Tensor("INPUT0", "FP32", (2,))],
    outputs=[Tensor("OUTPUT0", "FP32", (2,))],
    batching=Batching(max_batch_size=4, policy="adaptive", latency_slo_ms=100.0),
)  # adaptive, warmed up at start (its inputs are declared in full)


wrong_dtype = Model(
    lambda batch: batch.astype(np.float64) * 2,
    name="wrong_dtype",
    inputs=[Tensor("INPUT0", "FP32", (1,))],
    outputs=[Tensor("OUTPUT0", "FP32", (1,))],
)  # declares FP32, returns float64: the server casts a declared output


def _not_numbers(batch: Array) -> Array:
    # Each row's value doubled, but a negative row's as a string: an object array.
    _gate("not_numbers", len(batch))
    rows = [[v * 2] if v >= 0 else ["not a number"] for v in batch[:, 0].tolist()]
    return np.array(rows, dtype=object)


not_numbers = Model(
    _not_numbers,
    name="not_numbers",
    inputs=[Tensor("INPUT0", "FP32", (1,))],
    outputs=[Tensor("OUTPUT0", "FP32", (1,))],
)  # declares FP32, returns objects: a broken model for some rows


EXPAND = 2_000_000  # values per row of expand's output: megabytes of JSON


expand = Model(
    lambda batch: np.repeat(batch, EXPAND, axis=1),
    name="expand",
    inputs=[Tensor("INPUT0", "FP32", (1,))],
    outputs=[Tensor("OUTPUT0", "FP32", (EXPAND,))],
)  # a small request, a large response


# -- for process workers (--runner process) -------------------------------------------------

POISON = -1.0  # a row whose first value is this exits its worker process (os._exit(1))
HANG = -2.0  # a row whose first value is this hangs its worker process
SLOW = -3.0  # a batch holding a row whose first value is this sleeps SLOW_S first
SLOW_S = 0.3


def _troublemaker(batch: Array) -> Array:
    first = batch[:, 0]
    if (first == POISON).any():
        os._exit(1)
    if (first == HANG).any():
        time.sleep(3600)
    time.sleep(SLOW_S if (first == SLOW).any() else 0.002)  # a model call takes a while
    return batch * 2


troublemaker = Model(
    _troublemaker,
    inputs=(Tensor("INPUT0", "FP32", (4,)),),
    outputs=(Tensor("OUTPUT0", "FP32", (4,)),),
    batching=Batching(max_batch_size=8),
)


def _broken_recipe() -> Model:
    raise RuntimeError("weights file /nowhere/model.bin is missing")


# Loads here, but a worker process cannot load it: its recipe fails.
fails_in_worker = Model(
    add_one,
    inputs=(Tensor("INPUT0", "FP32", (4,)),),
    outputs=(Tensor("OUTPUT0", "FP32", (4,)),),
    recipe=_broken_recipe,
)


def _sums(batch: Array) -> Array:
    return batch.sum(axis=1, keepdims=True, dtype=np.float32)


rowsum = Model(
    _sums,
    name="rowsum",
    inputs=[Tensor("X", "FP32", (-1,))],
    outputs=[Tensor("SUM", "FP32", (1,))],
)  # rows of any length in, one number out: a large request costs only its decoding
