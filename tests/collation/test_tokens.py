"""Token budgets (carpool.collation.tokens): what fits in a batch being formed, counted two ways."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np
import pytest

from carpool import Batcher, Model, Padding
from carpool.collation.tokens import Meter
from conftest import Gate, settle


@dataclass
class Req:
    rows: int
    length: int = 0
    tokens: int = 0


def test_padded_rows_cost_the_longest_rows_length() -> None:
    meter = Meter(100)
    assert meter.room(Req(4, length=10, tokens=30), 4) == 4
    meter.add(Req(4, length=10, tokens=30), 4)
    assert (meter.rows, meter.computed, meter.real) == (4, 40, 30)
    # A longer row makes every row cost its length: 4 + k rows of 20 within 100 -> k = 1.
    assert meter.room(Req(3, length=20, tokens=45), 3) == 1
    meter.add(Req(3, length=20, tokens=45), 1)
    assert (meter.rows, meter.computed, meter.real) == (5, 100, 45)  # 30 + 45 / 3
    assert meter.room(Req(1, length=1, tokens=1), 1) == 0


def test_unpadded_rows_cost_their_own_tokens_and_a_split_its_share() -> None:
    meter = Meter(100)
    meter.add(Req(1, tokens=60), 1)
    assert meter.room(Req(4, tokens=80), 4) == 2  # 20 a row: 40 left
    meter.add(Req(4, tokens=80), 2)
    assert (meter.rows, meter.computed, meter.real) == (3, 100, 100)
    assert meter.room(Req(1, tokens=0), 1) == 1  # costs nothing


@pytest.mark.parametrize("request_", [Req(1, tokens=500), Req(1, length=500), Req(3, length=90)])
def test_a_request_alone_over_the_budget_gets_one_row_in_an_empty_batch(request_: Req) -> None:
    meter = Meter(80)
    assert meter.room(request_, request_.rows) == 1
    meter.add(request_, 1)
    assert meter.room(request_, request_.rows) == 0


def test_without_a_limit_only_rows_bound_and_tokens_are_still_counted() -> None:
    meter = Meter(None)
    assert meter.room(Req(8, length=1000, tokens=900), 8) == 8
    meter.add(Req(8, length=1000, tokens=900), 8)
    assert (meter.computed, meter.real, meter.full) == (8000, 900, False)


# A Batcher under a budget, on a real loop (conftest's Gate holds the model's one worker).


async def test_batches_never_exceed_the_budget_and_one_too_large_runs_alone() -> None:
    gate = Gate()
    count = lambda value: int(value[0])  # noqa: E731  # each row says its tokens
    async with Batcher(gate, max_batch_size=8, max_batch_tokens=100, token_count=count) as b:
        first = asyncio.ensure_future(b.infer(np.array([1])))
        await gate.entered.wait()
        sizes = [40, 50, 30, 500, 20, 60, 10]
        rest = [asyncio.ensure_future(b.infer(np.array([n]))) for n in sizes]
        await settle()
        gate.open()
        assert (await first).tolist() == [1]
        assert [(await r).tolist() for r in rest] == [[n] for n in sizes]
        stats = b.stats()
    assert gate.columns() == [[1], [40, 50], [30], [500], [20, 60, 10]]
    assert stats.batch_sizes == {1: 3, 2: 1, 3: 1}  # the rows each batch really ran
    assert (stats.tokens_computed, stats.tokens_real) == (711, 711)


async def test_a_fixed_policy_dispatches_a_batch_the_budget_filled_without_waiting() -> None:
    gate = Gate()
    gate.open()
    count = lambda value: int(value[0])  # noqa: E731
    async with Batcher(
        gate, max_batch_size=8, max_wait_ms=60_000, policy="fixed",
        max_batch_tokens=100, token_count=count,
    ) as b:  # fmt: skip
        calls = [asyncio.ensure_future(b.infer(np.array([n]))) for n in (60, 30, 20)]
        await settle()
        done = [call for call in calls if call.done()]
        assert [d.result().tolist() for d in done] == [[60], [30]]  # full: 60 + 30 + 20 > 100
        for call in calls:
            call.cancel()
    assert gate.columns()[0] == [60, 30]


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({"max_batch_tokens": 0, "token_count": len}, ValueError, "max_batch_tokens must be >= 1"),
        (
            {"max_batch_tokens": 1.5, "token_count": len},
            TypeError,
            "max_batch_tokens must be an int",
        ),
        ({"max_batch_tokens": True, "token_count": len}, TypeError, "must be an int, got bool"),
        ({"max_batch_tokens": 10}, ValueError, "needs a way to count a request's tokens"),
        ({"token_count": 3}, TypeError, "token_count must be callable"),
    ],
)
def test_budget_settings_are_checked_at_the_door(
    options: dict[str, object], error: type[Exception], words: str
) -> None:

    with pytest.raises(error, match=words):
        Batcher(lambda batch: batch, **options)  # type: ignore[arg-type]


async def test_a_padded_model_forms_batches_by_length_from_a_deep_queue() -> None:
    gate = Gate(lambda batch: {"n": batch["ids"].sum(axis=1, keepdims=True)})
    model = Model(gate, name="ids", padding=Padding(inputs={"ids": 0}))
    async with model.batcher(max_batch_size=2) as b:
        first = asyncio.ensure_future(b.infer_many({"ids": np.ones((1, 3), np.int64)}))
        await gate.entered.wait()
        lengths = [10, 90, 12, 88]
        calls = [
            asyncio.ensure_future(b.infer_many({"ids": np.ones((1, n), np.int64)})) for n in lengths
        ]
        await settle()
        gate.open()
        await first
        assert [(await c)["n"].tolist() for c in calls] == [[[n]] for n in lengths]
        stats = b.stats()
    assert [batch["ids"].shape for batch in gate.batches] == [(1, 3), (2, 12), (2, 90)]
    assert (stats.tokens_computed, stats.tokens_real) == (3 + 24 + 180, 3 + 200)
