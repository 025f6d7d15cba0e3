"""``--sweep-batching``: one load step per ``max_batch_size`` x ``max_wait_ms`` cell, each on a
fresh batcher of an in-process model, so cells differ only in batching. The caller says what a
step is and how it is shown."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from carpool.bench.report.data import Step
from carpool.bench.report.present import SweepResult, best
from carpool.bench.targets.base import BenchError
from carpool.bench.targets.local_target import LocalTarget
from carpool.errors import ConfigError
from carpool.loading import with_batching
from carpool.model import Model

__all__ = ["Cell", "grid", "summary", "sweep"]


@dataclass(frozen=True, slots=True)
class Cell:
    """One batching setting of the grid, as a model of its own."""

    max_batch_size: int
    max_wait_ms: float
    model: Model


def grid(
    model: Model,
    sizes: Sequence[int],
    waits: Sequence[float],
    extra: dict[str, Any] | None = None,
) -> list[Cell]:
    """Every (size, wait) setting merged into ``model``'s batching, checked before any run:
    a setting the batcher would refuse is a :class:`BenchError` naming it."""
    cells = []
    for size in sizes:
        for wait in waits:
            overrides = {**(extra or {}), "max_batch_size": size, "max_wait_ms": wait}
            try:
                cells.append(Cell(size, wait, with_batching(model, overrides)))
            except ConfigError as exc:
                message = f"batching max_batch_size={size}, max_wait_ms={wait:g}: {exc}"
                raise BenchError(message) from None
    return cells


async def sweep(
    cells: Sequence[Cell],
    text: str,
    run_cell: Callable[[LocalTarget, Cell, list[SweepResult]], Awaitable[Step]],
) -> list[SweepResult]:
    """Run each cell's step on a batcher of its own, in grid order; ``run_cell`` also gets
    the results so far (for a live table)."""
    results: list[SweepResult] = []
    for cell in cells:
        async with LocalTarget.serving(cell.model, text) as target:
            step = await run_cell(target, cell, results)
        results.append(SweepResult(cell.max_batch_size, cell.max_wait_ms, step))
    return results


def summary(results: Sequence[SweepResult], p99_budget_ms: float | None) -> str:
    """The line that names the best setting: most throughput, p99 within the budget."""
    budget = p99_budget_ms if p99_budget_ms is not None else math.inf
    chosen = best(results, budget)
    if chosen is None:
        return f"best: none; no setting kept p99 within {budget:g} ms"
    step = chosen.step
    within = f" with p99 <= {budget:g} ms" if p99_budget_ms is not None else ""
    p99 = f", p99 {step.latency.p99:.2f} ms" if step.latency is not None else ""
    return (
        f"best{within}: --max-batch-size {chosen.max_batch_size} --max-wait-ms "
        f"{chosen.max_wait_ms:g} ({step.throughput_rps:,.1f} req/s{p99})"
    )
