"""The step-wise batcher: callers open streams; a lane per replica runs the steps that
sequences join and leave (iteration-level scheduling, as Orca does for LLMs, for any
:class:`~carpool.steps.model.StepModel`)."""

from __future__ import annotations

import functools
import inspect
import itertools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Generic, Self, TypeVar

from carpool.engine.options import check_int, check_ms
from carpool.errors import BatcherClosed, ConfigError, Overloaded
from carpool.runners import RUNNER_OPTIONS, RUNNERS, make_replicas
from carpool.steps.lane import Lane
from carpool.steps.model import PrefixCounts, StepModel
from carpool.steps.replica import StepReplica, StepReport, Tick
from carpool.steps.slots import Slots
from carpool.steps.stats import StepObserver, StepSnapshot, StepStats
from carpool.steps.stream import StepSequence, Stream, Wakeups

__all__ = ["StepBatcher"]

log = logging.getLogger("carpool")

In = TypeVar("In")
Out = TypeVar("Out")
ModelSpec = StepModel[Any, Any, Any] | Callable[[], StepModel[Any, Any, Any]]
MIN_STEPS_TO_PREDICT = 8  # the adaptive policy refuses nothing before it has seen this many


class StepBatcher(Generic[In, Out]):
    """Serves a step-wise model: each caller's input becomes a sequence whose outputs stream
    back as the steps it shares with others produce them.

    ``model`` is a StepModel, or a zero-argument factory of one (needed for ``workers`` > 1
    and for the ``process`` and ``ray`` runners, where each replica builds its own).
    ``max_sequences`` bounds the sequences aboard each replica; ``step_tokens`` bounds a
    step's tokens (one per stepping sequence, the rest on starts, so a long prompt is
    started over several steps); ``max_queue_size`` bounds those waiting for a slot.
    ``policy="adaptive"`` refuses at once (:class:`~carpool.errors.Overloaded`) a sequence
    whose first output it predicts past its ``timeout_ms``. ``prefix_cache_bytes`` (0: off)
    is split evenly over the replicas, each model offered its share once as it is built
    (``StepModel.reuse_prefixes``).
    """

    def __init__(
        self,
        model: ModelSpec,
        *,
        max_sequences: int = 16,
        step_tokens: int | None = None,
        workers: int = 1,
        runner: str = "thread",
        runner_options: Mapping[str, Any] | None = None,
        max_queue_size: int | None = 1024,
        policy: str = "eager",
        step_timeout_ms: float | None = None,
        name: str = "steps",
        observer: StepObserver | None = None,
        prefix_cache_bytes: int = 0,
    ) -> None:
        check_int("prefix_cache_bytes", prefix_cache_bytes, 0, note="0: off")
        _check_options(
            model,
            max_sequences,
            step_tokens,
            workers,
            runner,
            runner_options,
            max_queue_size,
            policy,
            step_timeout_ms,
        )
        self.max_sequences = max_sequences
        self.step_tokens = step_tokens
        self.workers = workers
        self.name = name
        self.policy = policy
        self.prefix_cache_bytes = prefix_cache_bytes
        self._build: Callable[[], StepModel[Any, Any, Any]] = (
            functools.partial(_same, model) if isinstance(model, StepModel) else model
        )
        self._runner = runner
        self._runner_options = dict(runner_options or {})
        self._step_timeout_ms = step_timeout_ms
        self._stats = StepStats(observer)
        self._slots = Slots(name, workers, self.max_sequences, max_queue_size)
        self._ids = itertools.count(1)
        self._lanes: list[Lane] = []
        self._closers: list[Callable[[], None]] = []
        self._slots.closed = "is not started"

    # ---- life ------------------------------------------------------------------------

    def start(self) -> Self:
        """Load a model on each replica and start its lane; raise if any cannot load."""
        if self._lanes:
            return self
        try:
            calls = [self._replica(index) for index in range(self.workers)]
            self._ask_reuse(calls)
        except BaseException:
            self._close_replicas()
            raise
        for index, call in enumerate(calls):
            lane = Lane(
                index,
                self._slots,
                call,
                step_tokens=self.step_tokens,
                stats=self._stats,
                name=self.name,
            )
            self._lanes.append(lane)
        self._slots.closed = None
        for lane in self._lanes:
            lane.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Take no new sequences; fail those waiting; let those aboard finish for up to
        ``timeout`` seconds, then end the rest with :class:`~carpool.errors.BatcherClosed`."""
        wakeups = Wakeups()
        for seq in self._slots.close("is closed"):
            seq.end(_closed(self.name), wakeups)
        wakeups.send()
        cut_at = time.monotonic() + timeout
        for lane in self._lanes:
            lane.stop(cut_at)
        for lane in self._lanes:
            lane.join()
        self._lanes.clear()
        self._close_replicas()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self.start()

    async def __aexit__(self, *exc: object) -> None:
        import asyncio

        await asyncio.to_thread(self.close)

    # ---- calls -----------------------------------------------------------------------

    def stream(
        self, value: In, *, priority: int = 0, timeout_ms: float | None = None
    ) -> Stream[Out]:
        """Open a sequence for ``value``: its outputs, as they come. Thread-safe, never blocks.

        Raises :class:`~carpool.errors.QueueFull` when ``max_queue_size`` wait already,
        :class:`~carpool.errors.Overloaded` (adaptive policy) when its first output would
        come after ``timeout_ms``, :class:`~carpool.errors.BatcherClosed` once closed."""
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ConfigError(f"priority must be an int, got {type(priority).__name__}")
        if timeout_ms is not None:
            check_ms("timeout_ms", timeout_ms, positive=True)
        seq = StepSequence(next(self._ids), value, priority, timeout_ms, time.monotonic())
        if self.policy == "adaptive" and timeout_ms is not None:
            self._refuse_late(timeout_ms)
        seq.on_cancel = self._withdraw
        self._slots.admit(seq)
        self._stats.submitted += 1
        return Stream(seq)

    async def generate(
        self, value: In, *, priority: int = 0, timeout_ms: float | None = None
    ) -> list[Out]:
        """Every output of ``value``'s sequence, once it ends."""
        with self.stream(value, priority=priority, timeout_ms=timeout_ms) as stream:
            return await stream.collect()

    def stats(self) -> StepSnapshot:
        return self._stats.snapshot()

    @property
    def prefixes(self) -> PrefixCounts | None:
        """Prompt-state reuse summed over the replicas; None when none reuses."""
        return self._stats.prefixes()

    def cost_line(self) -> tuple[float, float]:
        """What a step costs, as learnt: (fixed seconds, seconds per sequence)."""
        return self._stats.cost.line()

    @property
    def active(self) -> int:
        """Sequences aboard a replica or routed to one."""
        return self._slots.active()

    @property
    def waiting(self) -> int:
        return self._slots.waiting

    # ---- inside ----------------------------------------------------------------------

    def _refuse_late(self, timeout_ms: float) -> None:
        cost = self._stats.cost
        if cost.steps_seen < MIN_STEPS_TO_PREDICT:
            return
        slots = self._slots
        predicted = cost.first_output_seconds(slots.waiting, slots.free_slots(), slots.active())
        if predicted * 1000 > timeout_ms:
            self._stats.refused += 1
            raise Overloaded(
                predicted_ms=min(predicted * 1000, 1e12),
                budget_ms=timeout_ms,
                queued=slots.waiting,
                rows=1,
            )

    def _withdraw(self, seq: StepSequence) -> None:
        if self._slots.withdraw(seq):
            self._stats.cancelled += 1
            wakeups = Wakeups()
            seq.end(None, wakeups)
            wakeups.send()

    def _ask_reuse(self, calls: list[Callable[[Tick], StepReport]]) -> None:
        """With a prefix budget, an empty tick on each replica: its report says whether its
        model reuses prompt state (its counts, from 0), else the log says it works without."""
        if self.prefix_cache_bytes // self.workers == 0:
            return
        counts = [call(Tick()).prefixes for call in calls]
        for index, given in enumerate(counts):
            if given is not None:
                self._stats.observe_prefixes(index, given)
        if any(given is None for given in counts):
            log.info(
                "model %s cannot reuse prompt state (StepModel.reuse_prefixes): it works "
                "without it",
                self.name,
            )

    def _replica(self, index: int) -> Callable[[Tick], StepReport]:
        """Lane ``index``'s way to run a tick: its own model in this process, or one replica
        (a child process or a Ray actor) that keeps the states."""
        share = self.prefix_cache_bytes // self.workers
        if self._runner == "thread":
            model = self._build()
            if not isinstance(model, StepModel):
                raise ConfigError(f"the model factory gave {type(model).__name__}, not a StepModel")
            replica = StepReplica(model, share)
            self._closers.append(replica.close)
            return replica
        replicas = make_replicas(
            self._runner,
            functools.partial(_remote_replica, self._build, share),
            workers=1,
            name=f"{self.name}_{index}",
            batch_timeout_ms=self._step_timeout_ms,
            retry=False,  # a lost replica lost its states: its sequences fail, never replay
            warmup=None,
            options=self._runner_options,
        )
        replicas.start()
        self._closers.append(replicas.close)
        return replicas.call

    def _close_replicas(self) -> None:
        closers, self._closers = self._closers, []
        for close in closers:
            close()


def _check_options(
    model: object,
    max_sequences: int,
    step_tokens: int | None,
    workers: int,
    runner: str,
    runner_options: Mapping[str, Any] | None,
    max_queue_size: int | None,
    policy: str,
    step_timeout_ms: float | None,
) -> None:
    """Refuse, naming the option, what a StepBatcher cannot run with."""
    check_int("max_sequences", max_sequences, 1)
    if step_tokens is not None:
        check_int("step_tokens", step_tokens, 1)
        if step_tokens < max_sequences:
            raise ConfigError(
                f"step_tokens must be >= max_sequences ({max_sequences}): every active "
                f"sequence spends a token each step, got {step_tokens}"
            )
    check_int("workers", workers, 1)
    if max_queue_size is not None:
        check_int("max_queue_size", max_queue_size, 1)
    if runner not in RUNNERS:
        raise ConfigError(f"runner must be one of {', '.join(RUNNERS)}, got {runner!r}")
    unknown = set(runner_options or {}) - RUNNER_OPTIONS[runner]
    if unknown:
        raise ConfigError(f"runner {runner!r} takes no option {sorted(unknown)[0]!r}")
    if policy not in ("eager", "adaptive"):
        raise ConfigError(f"policy must be 'eager' or 'adaptive', got {policy!r}")
    if step_timeout_ms is not None:
        check_ms("step_timeout_ms", step_timeout_ms, positive=True)
    factory = _is_factory(model)
    if not factory and not isinstance(model, StepModel):
        raise ConfigError(
            f"model must be a StepModel or a zero-argument factory of one, got "
            f"{type(model).__name__}"
        )
    if not factory and (workers > 1 or runner != "thread"):
        raise ConfigError(
            "workers > 1 and the process and ray runners build a model per replica: pass "
            "a zero-argument factory (the StepModel class, or functools.partial) instead "
            "of an instance"
        )


def _remote_replica(
    spec: Callable[[], StepModel[Any, Any, Any]], prefix_budget: int
) -> StepReplica:
    """What a child process or actor builds once: its own model, holding its own states
    (and its share of the prefix budget)."""
    return StepReplica(spec(), prefix_budget)


def _same(model: StepModel[Any, Any, Any]) -> StepModel[Any, Any, Any]:
    return model


def _is_factory(model: object) -> bool:
    if isinstance(model, StepModel) or not callable(model):
        return False
    try:
        inspect.signature(model).bind()
    except (TypeError, ValueError):
        return False
    return True


def _closed(name: str) -> BaseException:
    return BatcherClosed(name, "closed before a slot was free")
