"""A batcher's options as one frozen record, checked once as it is built, and the checks other
options (``timeout_ms``, ``priority``, a model's ``Batching``) use. Type first, then range,
naming the option, what it must be and what it got: a wrong type is a
:class:`~carpool.errors.ConfigTypeError`, anything else a :class:`~carpool.errors.ConfigError`."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, Never, NoReturn, Protocol, Self, TypeVar, cast, overload

from carpool.errors import ConfigError, ConfigTypeError
from carpool.policies.adaptive import AdaptivePolicy
from carpool.policies.base import EagerPolicy, FixedPolicy, Policy
from carpool.runners import RUNNER_OPTIONS, RUNNERS

__all__ = [
    "DEFAULTS",
    "BatcherOptions",
    "OptionView",
    "check_bool",
    "check_int",
    "check_ms",
    "check_sizes",
    "make_policy",
    "option",
]

T = TypeVar("T")


def check_int(name: str, value: object, minimum: int, *, note: str = "") -> int:
    """``value`` if it is an int (not a bool) ``>= minimum``; ``note`` says why the bound."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigTypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        why = f" ({note})" if note else ""
        raise ConfigError(f"{name} must be >= {minimum}{why}, got {value}")
    return value


def check_ms(name: str, value: object, *, positive: bool) -> float:
    """``value`` as float milliseconds: finite, ``>= 0`` (``> 0`` if ``positive``)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ConfigTypeError(
            f"{name} must be a number of milliseconds, got {type(value).__name__}"
        )
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        raise ConfigError(f"{name} must be finite and {bound}, got {value}")
    return float(value)


def check_bool(name: str, value: object) -> bool:
    """``value`` if it is True or False (not merely truthy)."""
    if not isinstance(value, bool):
        raise ConfigTypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def check_sizes(name: str, value: object) -> tuple[int, ...]:
    """``value`` as a tuple of ascending, distinct ints ``>= 1`` (batch sizes)."""
    sizes = tuple(value) if isinstance(value, list | tuple) else (value,)
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes) or list(
        sizes
    ) != sorted(set(sizes)):
        raise ConfigError(f"{name} must be ascending ints >= 1, got {list(sizes)}")
    return sizes


_BY_NAME: dict[str, type[FixedPolicy] | type[EagerPolicy]] = {
    "eager": EagerPolicy,
    "fixed": FixedPolicy,
}
_POLICY_NAMES = ", ".join(repr(n) for n in [*_BY_NAME, "adaptive"])


def _check_policy(policy: object, latency_slo_ms: object) -> None:
    """A policy name (``"adaptive"`` with ``latency_slo_ms``, the others without) or an
    object with ``decide(view, now)``; builds nothing."""
    if latency_slo_ms is not None and policy != "adaptive":
        raise ConfigError(
            "latency_slo_ms is the objective of policy='adaptive'; set that policy, or "
            "drop latency_slo_ms"
        )
    if policy == "adaptive":
        if latency_slo_ms is None:
            raise ConfigError(
                "policy 'adaptive' needs a latency objective: set latency_slo_ms "
                "(e.g. 50 for 50 ms)"
            )
        check_ms("latency_slo_ms", latency_slo_ms, positive=True)
    elif isinstance(policy, str):
        if policy not in _BY_NAME:
            raise ConfigError(
                f"policy must be one of {_POLICY_NAMES} or a Policy object, got {policy!r}"
            ) from None
    elif isinstance(policy, type) or not isinstance(policy, Policy):
        kind = f"the class {policy.__name__}" if isinstance(policy, type) else type(policy).__name__
        raise ConfigTypeError(
            f"policy must be a name or an object with decide(view, now), got {kind}"
        )


def _new_policy(policy: str | Policy, latency_slo_ms: float | None) -> Policy:
    """The policy object of a checked ``policy``: a fresh one for a name, else itself."""
    if policy == "adaptive":
        assert latency_slo_ms is not None  # _check_policy refused it without one
        return AdaptivePolicy(latency_slo_ms)
    if isinstance(policy, str):
        return _BY_NAME[policy]()
    return policy


def make_policy(policy: str | Policy, *, latency_slo_ms: float | None = None) -> Policy:
    """A policy object from its name (``"eager"``, ``"fixed"``, ``"adaptive"``, which needs
    ``latency_slo_ms``) or a user's own object."""
    _check_policy(policy, latency_slo_ms)
    return _new_policy(policy, latency_slo_ms)


def _check_runner(runner: object, batch_timeout_ms: float | None) -> None:
    """A runner by name, and ``batch_timeout_ms`` only where it can act."""
    if runner not in RUNNERS:
        raise ConfigError(f"runner must be one of {', '.join(RUNNERS)}; got {runner!r}")
    if batch_timeout_ms is not None and runner == "thread":
        raise ConfigError(
            "batch_timeout_ms needs runner='process' (or 'ray'): a model call in a thread "
            "cannot be stopped, a process can be killed and replaced"
        )


def _check_runner_options(runner: str, options: object) -> Mapping[str, Any]:
    """``options`` (None: none), read-only, if ``runner`` takes each of them."""
    if options is None:
        return _NO_OPTIONS
    if not isinstance(options, Mapping):
        kind = type(options).__name__
        raise ConfigTypeError(f"runner_options must be a mapping or None, got {kind}")
    takes = RUNNER_OPTIONS[runner]
    unknown = set(options) - takes
    if unknown:
        known = ", ".join(sorted(takes)) or "none"
        raise ConfigError(f"runner {runner!r} takes no option {sorted(unknown)}; it takes: {known}")
    return MappingProxyType(dict(options))


_NO_OPTIONS: Mapping[str, Any] = MappingProxyType({})


def option(default: Any, *, help: str, shown: str | None = None, flag: str | None = None) -> Any:
    """A settings record's field that ``carpool serve`` takes as a flag: ``help`` is the
    flag's help, and ``shown`` what that help gives as the default when not the default
    itself (a ``None`` default shows nothing without it); ``flag``, the flag's name when not
    the field's (``--drain-timeout`` for ``drain_timeout_s``)."""
    return field(default=default, metadata={"help": help, "shown": shown, "flag": flag})


@dataclass(frozen=True, slots=True, kw_only=True)
class BatcherOptions:
    """Everything a :class:`~carpool.Batcher` is configured with but its model, collator and
    warm-up row; checked once, here, and read by the batcher, its scheduler and its runner.

    The one record of each option's name, type, default, check and help: ``Batcher``,
    :class:`~carpool.Batching`, ``@carpool.batch`` and ``carpool serve``'s flags take theirs
    from it. ``runner_options`` is kept read-only; ``None`` is taken for no options. The
    policy is kept as given (a name or an object): :meth:`new_policy` builds the one a
    batcher uses.
    """

    # Triton and TorchServe examples start here; fits most GPUs
    max_batch_size: int = option(32, help="rows per model call at most")
    # TF Serving's and Ray's order of magnitude; eager never waits
    max_wait_ms: float = option(5.0, help="longest deliberate wait for a batch")
    # never waits; serves few callers best (benchmarks/engine/few_clients.py)
    policy: str | Policy = option(  # noqa: RUF009 - option() returns a dataclasses.field()
        "eager", help="batching policy: eager, fixed or adaptive"
    )
    # rows; None: bounded only by memory
    max_queue_size: int | None = option(
        None, help="rows allowed to wait; then 503", shown="no limit"
    )
    # one model replica; more overlap GIL-releasing models
    workers: int = option(
        1,
        help="batches run at once per model: threads, processes (--runner process) or Ray "
        "actors (--runner ray)",
    )
    isolate_errors: bool = True  # a failing row fails its own caller, not its batch
    name: str = "model"  # in errors, logs and stats; Batcher gives its model's __name__
    # the objective of policy="adaptive", and only its
    latency_slo_ms: float | None = option(
        None,
        help="latency objective of --policy adaptive: it batches for it, and answers 503 at "
        "once to requests predicted to miss it",
    )
    # or "process" (child processes), "ray" (actors): carpool.runners
    runner: str = option(
        "thread",
        help="where each model runs: thread (in this process), process (each worker a child "
        "process, restarted if it crashes; a GIL-bound model gets a core each), or ray "
        "(each worker a Ray actor, anywhere in a cluster)",
    )
    # process and ray runners: kill and replace past it
    batch_timeout_ms: float | None = option(
        None,
        help="with --runner process or ray: a batch running longer fails with 504, and its "
        "worker is killed and replaced",
        shown="none",
    )
    retry: bool = True  # process and ray runners: a batch whose worker died runs once more
    # ray: address, num_cpus, ...; given as a mapping or None, kept as a read-only mapping
    runner_options: Mapping[str, Any] = field(default_factory=lambda: _NO_OPTIONS, hash=False)
    # None: rows alone bound a batch (carpool.collation.tokens)
    max_batch_tokens: int | None = option(
        None,
        help="the most tokens one batch may compute (each model that pads or counts tokens: "
        "rows x padded length); a request alone over it runs alone",
        shown="none: rows only",
    )
    token_count: Callable[[Any], int] | None = field(default=None, hash=False)  # a request's

    def __post_init__(self) -> None:
        # In the order of Batcher's signature, so the first bad option is the one reported.
        check_int("max_batch_size", self.max_batch_size, 1)
        self._set("max_wait_ms", check_ms("max_wait_ms", self.max_wait_ms, positive=False))
        if self.max_queue_size is not None:
            check_int("max_queue_size", self.max_queue_size, 1)
        check_int("workers", self.workers, 1)
        check_bool("isolate_errors", self.isolate_errors)
        if not isinstance(self.name, str):
            raise ConfigTypeError(f"name must be a str, got {type(self.name).__name__}")
        if self.batch_timeout_ms is not None:
            timeout = check_ms("batch_timeout_ms", self.batch_timeout_ms, positive=True)
            self._set("batch_timeout_ms", timeout)
        _check_runner(self.runner, self.batch_timeout_ms)
        check_bool("retry", self.retry)
        options = _check_runner_options(self.runner, self.runner_options)
        self._set("runner_options", options)
        _check_policy(self.policy, self.latency_slo_ms)
        if self.latency_slo_ms is not None:
            self._set("latency_slo_ms", float(self.latency_slo_ms))
        if self.max_batch_tokens is not None:
            check_int("max_batch_tokens", self.max_batch_tokens, 1)
        if self.token_count is not None and not callable(self.token_count):
            raise ConfigTypeError(
                f"token_count must be callable (a request's value -> its tokens), got "
                f"{type(self.token_count).__name__}"
            )

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)  # frozen: normalised once, while built

    def new_policy(self) -> Policy:
        """The policy a batcher runs: a fresh object for a name, the given object else."""
        return _new_policy(self.policy, self.latency_slo_ms)


# The defaults, named once: Batcher, Batching, @batch and the flags take theirs from here.
DEFAULTS = BatcherOptions()


class _Configured(Protocol):
    options: BatcherOptions


class OptionView(Generic[T]):
    """A read-only attribute of an object built from a :class:`BatcherOptions` (its
    ``options``): the field of the same name, so the object keeps no copy that could drift."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._field = name
        self._name = f"{owner.__name__}.{name}"

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> Self: ...
    @overload
    def __get__(self, instance: _Configured, owner: type | None = None) -> T: ...
    def __get__(self, instance: _Configured | None, owner: type | None = None) -> T | Self:
        if instance is None:
            return self
        return cast(T, getattr(instance.options, self._field))

    def __set__(self, instance: _Configured, value: Never) -> NoReturn:
        raise AttributeError(f"{self._name} is read-only: it reads the options it was built with")
