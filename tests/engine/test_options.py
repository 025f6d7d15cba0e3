"""Options checked at the door: the record a batcher is built from, the helpers' messages,
and the policy a ``policy=`` names."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from carpool import Batcher, Batching
from carpool.engine.options import (
    DEFAULTS,
    BatcherOptions,
    check_bool,
    check_int,
    check_ms,
    make_policy,
)
from carpool.errors import ConfigError, ConfigTypeError
from carpool.policies.adaptive import AdaptivePolicy
from carpool.policies.base import (
    Dispatch,
    DispatchReason,
    EagerPolicy,
    FixedPolicy,
    Policy,
    QueueView,
)


def test_check_int_names_the_option_type_then_range() -> None:
    assert check_int("workers", 3, 1) == 3
    with pytest.raises(TypeError, match=r"^workers must be an int, got float$"):
        check_int("workers", 1.0, 1)
    with pytest.raises(TypeError, match=r"^workers must be an int, got bool$"):
        check_int("workers", True, 1)
    with pytest.raises(ValueError, match=r"^workers must be >= 1, got 0$"):
        check_int("workers", 0, 1)


def test_check_ms_takes_finite_milliseconds_as_float() -> None:
    assert check_ms("max_wait_ms", 5, positive=False) == 5.0
    assert isinstance(check_ms("max_wait_ms", 0, positive=False), float)
    with pytest.raises(ValueError, match=r"^timeout_ms must be finite and > 0, got 0$"):
        check_ms("timeout_ms", 0, positive=True)
    with pytest.raises(ValueError, match=r"^max_wait_ms must be finite and >= 0, got inf$"):
        check_ms("max_wait_ms", math.inf, positive=False)
    with pytest.raises(TypeError, match=r"^timeout_ms must be a number of milliseconds, got str$"):
        check_ms("timeout_ms", "5", positive=True)


def test_check_bool_refuses_truthy_values() -> None:
    assert check_bool("isolate_errors", False) is False
    with pytest.raises(TypeError, match=r"^isolate_errors must be a bool, got int$"):
        check_bool("isolate_errors", 1)


def test_latency_slo_ms_needs_the_adaptive_policy() -> None:
    with pytest.raises(ValueError, match="latency_slo_ms is the objective of policy='adaptive'"):
        make_policy("eager", latency_slo_ms=50)
    adaptive = make_policy("adaptive", latency_slo_ms=50)
    assert isinstance(adaptive, AdaptivePolicy)
    assert adaptive.latency_slo == 0.05


def test_make_policy_by_name() -> None:
    assert type(make_policy("eager")) is EagerPolicy
    assert type(make_policy("fixed")) is FixedPolicy


def test_make_policy_gives_a_fresh_object_each_time() -> None:
    assert make_policy("fixed") is not make_policy("fixed")


def test_make_policy_passes_a_policy_object_through() -> None:
    policy = FixedPolicy()
    assert make_policy(policy) is policy


def test_make_policy_accepts_any_object_with_decide() -> None:
    class Always:
        def decide(self, view: QueueView, now: float) -> Dispatch:
            return Dispatch(1, DispatchReason.WORKER_IDLE)

    custom = Always()
    assert make_policy(custom) is custom
    assert isinstance(custom, Policy)


@pytest.mark.parametrize("name", ["Eager", "FIXED", "greedy", "", " eager"])
def test_make_policy_unknown_name_lists_the_known_ones(name: str) -> None:
    with pytest.raises(ValueError, match="policy must be one of") as info:
        make_policy(name)
    message = str(info.value)
    assert message == (
        f"policy must be one of 'eager', 'fixed', 'adaptive' or a Policy object, got {name!r}"
    )
    assert info.value.__cause__ is None
    assert info.value.__suppress_context__


@pytest.mark.parametrize(
    ("value", "kind"),
    [(None, "NoneType"), (3, "int"), (object(), "object"), (["eager"], "list")],
)
def test_make_policy_rejects_objects_without_decide(value: object, kind: str) -> None:
    with pytest.raises(TypeError) as info:
        make_policy(value)  # type: ignore[arg-type]
    assert str(info.value) == (
        f"policy must be a name or an object with decide(view, now), got {kind}"
    )


@pytest.mark.parametrize("cls", [EagerPolicy, FixedPolicy])
def test_make_policy_rejects_a_policy_class_instead_of_an_instance(cls: type) -> None:
    # A class has a `decide` attribute, but calling it as cls.decide(view, now) fails later,
    # far from the mistake; it must be refused at the door like any other non-policy.
    with pytest.raises(TypeError, match="policy must be a name or an object with decide"):
        make_policy(cls)  # type: ignore[arg-type]


# ----------------------------------------------------------------------- the record


def test_the_record_holds_the_batchers_defaults_and_is_frozen() -> None:
    options = BatcherOptions()
    assert options == DEFAULTS
    assert (options.max_batch_size, options.max_wait_ms, options.policy) == (32, 5.0, "eager")
    assert (options.runner, options.retry, dict(options.runner_options)) == ("thread", True, {})
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.max_batch_size = 8  # type: ignore[misc]


def test_the_record_normalises_once_as_it_is_built() -> None:
    given = {"address": "auto", "num_cpus": 2}
    options = BatcherOptions(
        max_wait_ms=2, runner="ray", batch_timeout_ms=100, runner_options=given
    )
    assert isinstance(options.max_wait_ms, float)
    assert isinstance(options.batch_timeout_ms, float)
    given["num_gpus"] = 1  # the record keeps its own, read-only copy
    assert dict(options.runner_options) == {"address": "auto", "num_cpus": 2}
    with pytest.raises(TypeError):
        options.runner_options["num_cpus"] = 4  # type: ignore[index]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"max_batch_size": 0}, ConfigError, "max_batch_size must be >= 1, got 0"),
        ({"workers": 1.0}, ConfigTypeError, "workers must be an int, got float"),
        ({"name": 3}, ConfigTypeError, "name must be a str, got int"),
        ({"runner": "gpu"}, ConfigError, "runner must be one of thread, process, ray; got 'gpu'"),
        (
            {"runner_options": {"num_cpus": 1}},
            ConfigError,
            "runner 'thread' takes no option ['num_cpus']; it takes: none",
        ),
        (
            {"runner": "ray", "runner_options": ["address"]},
            ConfigTypeError,
            "runner_options must be a mapping or None, got list",
        ),
        ({"policy": "adaptive", "latency_slo_ms": "5"}, ConfigTypeError, "latency_slo_ms must"),
    ],
)
def test_every_bad_option_is_a_config_error_naming_it(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as info:
        BatcherOptions(**kwargs)
    assert str(info.value).startswith(message)
    assert isinstance(info.value, ConfigError)
    assert isinstance(info.value, ValueError)


def test_the_record_keeps_the_policy_as_given_and_builds_it_on_demand() -> None:
    by_name = BatcherOptions(policy="adaptive", latency_slo_ms=50)
    assert by_name.policy == "adaptive"
    first, second = by_name.new_policy(), by_name.new_policy()
    assert isinstance(first, AdaptivePolicy)
    assert first is not second  # each batcher learns its own cost curve
    mine = FixedPolicy()
    assert BatcherOptions(policy=mine).new_policy() is mine


def test_the_batcher_is_built_from_its_record() -> None:
    batcher = Batcher(lambda b: b, max_batch_size=4, runner_options=None)
    assert batcher.options == BatcherOptions(max_batch_size=4, name="<lambda>")
    assert batcher.max_batch_size == batcher.options.max_batch_size == 4


def test_batching_is_checked_by_the_same_record() -> None:
    with pytest.raises(ConfigError, match=r"^runner must be one of thread, process, ray"):
        Batching(runner="gpu")
    with pytest.raises(ConfigTypeError, match=r"^isolate_errors must be a bool, got int$"):
        Batching(isolate_errors=1)  # type: ignore[arg-type]
    assert Batching(max_batch_size=0).options().max_batch_size == 1  # batching off: one row


def test_the_batcher_keeps_no_copy_of_its_options() -> None:
    batcher = Batcher(abs, max_batch_size=4, runner="process", batch_timeout_ms=50)
    names = {f.name for f in dataclasses.fields(BatcherOptions)} - {"policy"}
    assert names.isdisjoint(vars(batcher))  # each option it shows is read from its record
    assert batcher.policy is not batcher.options.policy  # but the policy it runs is its own
    for name in ("name", "max_batch_size", "max_wait_ms", "max_queue_size", "workers"):
        assert getattr(batcher, name) == getattr(batcher.options, name)
    shown = ("isolate_errors", "runner", "batch_timeout_ms", "retry", "runner_options")
    assert [getattr(batcher, n) for n in shown] == [getattr(batcher.options, n) for n in shown]
    assert (batcher.runner, batcher.batch_timeout_ms) == ("process", 50.0)
    with pytest.raises(AttributeError, match=r"^Batcher.max_batch_size is read-only"):
        batcher.max_batch_size = 8  # type: ignore[assignment]
    assert batcher.max_batch_size == 4


def test_a_flagged_option_states_its_help_beside_its_default() -> None:
    flagged = {f.name: f for f in dataclasses.fields(BatcherOptions) if "help" in f.metadata}
    assert set(flagged) == {
        "max_batch_size",
        "max_wait_ms",
        "policy",
        "max_queue_size",
        "workers",
        "latency_slo_ms",
        "runner",
        "batch_timeout_ms",
        "max_batch_tokens",
    }
    for name, spec in flagged.items():
        assert spec.default == getattr(DEFAULTS, name)
        assert isinstance(spec.metadata["help"], str), name
        assert spec.metadata["help"], name
        # "shown" says only what a None default means; any other default is shown as it is
        assert spec.metadata["shown"] is None or spec.default is None, name
