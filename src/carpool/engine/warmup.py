"""What the batcher learns about its model: warm-up batches before the first request, every model
call's duration (:class:`ModelTimes`), and the cost model a policy fits from them. Schedules
nothing."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from carpool.collation.collate import Collator
from carpool.engine.stats import StatsRecorder
from carpool.policies.base import Policy, PolicyHooks

__all__ = ["ModelTimes", "learned", "warm_up"]

log = logging.getLogger("carpool")


async def warm_up(
    call: Callable[[Any], Awaitable[Any]],
    example: Any,
    *,
    collator: Collator,
    max_batch_size: int,
    hooks: PolicyHooks,
    name: str,
    learned: Callable[[], str],
) -> None:
    """Batches of ``example`` rows at sizes 1 .. max_batch_size through ``call`` (the model,
    in its worker): once for the model's own warm-up (caches, lazy setup, kernels); then,
    for a policy that observes, twice timed. None of it counts in stats.

    If the model fails on the example, a warning says so and the first requests warm it
    instead; ``learned()`` is logged once a cost model is fitted.
    """
    try:
        await _run(call, example, collator, max_batch_size, hooks)
    except Exception as exc:  # the model's own error on the example
        log.warning(
            "batcher %r: warm-up failed (%s: %s); the first requests warm it instead",
            name,
            type(exc).__name__,
            exc,
        )
        return
    if hooks.observe is None:
        return
    log.info("batcher %r: %s", name, learned())
    cost, slo, key = hooks.cost, hooks.latency_slo, collator.key(example)
    one = cost.predict(1, key) if cost is not None else None
    if slo is not None and one is not None and one > slo:
        log.warning(
            "batcher %r: the latency objective (%g ms) is below the time of one batch "
            "(%.1f ms): every request will be refused as overloaded",
            name,
            slo * 1000,
            one * 1000,
        )


async def _run(
    call: Callable[[Any], Awaitable[Any]],
    example: Any,
    collator: Collator,
    max_batch_size: int,
    hooks: PolicyHooks,
) -> None:
    most = max_batch_size
    sizes = sorted({1, max(1, most // 4), max(1, most // 2), most})
    observe = hooks.observe
    key = collator.key(example)
    for i, rows in enumerate(sizes * (3 if observe is not None else 1)):
        batch = collator.stack([example] * rows)
        started = time.perf_counter()
        await call(batch)
        if observe is not None and i >= len(sizes):
            observe(rows, time.perf_counter() - started, key)


def learned(policy: Policy, hooks: PolicyHooks, refused: int) -> str:
    """One line on what ``policy`` learned (its cost curve), or that it learns nothing;
    ``refused``: requests it refused as overloaded."""
    cost = hooks.cost
    curve = cost.curve() if cost is not None else None
    if curve is None:
        return f"policy {policy} has no cost model" if cost is None else "nothing yet"
    slo = f", objective {hooks.latency_slo * 1000:g} ms" if hooks.latency_slo is not None else ""
    return f"policy {policy}{slo}: {curve}; {refused} refused as overloaded"


class ModelTimes:
    """Takes each model call that returned, from the worker that made it: its batch's
    ``size`` (the rows dispatched), its own ``rows`` (fewer when some were withdrawn or the
    batch is bisected), its collation ``key``, and the seconds to ``stack`` its rows, of the
    model itself, and to ``split`` its output. Into the stats, and the rows and model
    seconds to a policy that observes (with how well it had predicted)."""

    def __init__(self, stats: StatsRecorder, hooks: PolicyHooks) -> None:
        self._stats = stats
        self._observe = hooks.observe
        self._cost = hooks.cost

    def __call__(
        self, size: int, rows: int, key: Any, stack: float, seconds: float, split: float
    ) -> None:
        self._stats.model_call(size, seconds, stack=stack, split=split)
        if self._observe is not None:
            predicted = self._cost.predict(rows, key) if self._cost is not None else None
            if predicted:
                self._stats.prediction_ratios.append(seconds / predicted)
            self._observe(rows, seconds, key)
