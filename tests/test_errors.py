"""The error tree: each error is also the builtin it resembles, carries data, names a remedy."""

from __future__ import annotations

import copy
import importlib
import pickle
import pkgutil
from types import ModuleType

import pytest

import carpool
from carpool.errors import (
    BatcherClosed,
    BatchSizeMismatch,
    BatchTimeout,
    BlockingCallOnLoop,
    CarpoolError,
    CollationError,
    ConfigError,
    ConfigTypeError,
    DeadlineExceeded,
    ModelExit,
    Overloaded,
    QueueFull,
    SharedMemoryFull,
    WorkerDied,
    WorkerPoolClosed,
    WorkerStartError,
    call_model,
    describe_exit,
)


def examples() -> list[CarpoolError]:
    return [
        QueueFull(max_queue_size=64, queued=63, rows=2),
        DeadlineExceeded(timeout_ms=250.0, stage="queued"),
        BatcherClosed("embed"),
        CollationError("bad rows", field="input['ids']"),
        BatchSizeMismatch(expected=8, actual=7),
        Overloaded(predicted_ms=80.0, budget_ms=50.0, queued=120, rows=1),
        ConfigError("port must be in 1..65535, got 0"),
        ConfigTypeError("workers must be an int, got float"),
        BlockingCallOnLoop(function="Model.embed"),
    ]


@pytest.mark.parametrize(
    ("cls", "builtin"),
    [
        (QueueFull, RuntimeError),
        (DeadlineExceeded, TimeoutError),
        (BatcherClosed, RuntimeError),
        (CollationError, TypeError),
        (BatchSizeMismatch, ValueError),
        (ConfigError, ValueError),
        (BlockingCallOnLoop, RuntimeError),
    ],
)
def test_each_error_is_a_carpool_error_and_its_builtin(
    cls: type[CarpoolError], builtin: type[Exception]
) -> None:
    assert issubclass(cls, CarpoolError)
    assert issubclass(cls, builtin)
    assert cls.__mro__[1:3] == (CarpoolError, builtin)


def test_a_config_type_error_is_a_config_error_and_a_type_error() -> None:
    assert ConfigTypeError.__mro__[1:5] == (ConfigError, CarpoolError, ValueError, TypeError)


def test_carpool_error_is_an_exception_and_not_a_builtin_subkind() -> None:
    assert CarpoolError.__mro__ == (CarpoolError, Exception, BaseException, object)


def test_builtin_except_clauses_catch_carpool_errors() -> None:
    with pytest.raises(TimeoutError):
        raise DeadlineExceeded(timeout_ms=10, stage="queued")
    with pytest.raises(ValueError, match="for a batch of 4 rows"):
        raise BatchSizeMismatch(expected=4, actual=5)
    with pytest.raises(TypeError, match=r"^input: nope$"):
        raise CollationError("nope")


def test_errors_are_re_exported_from_carpool() -> None:
    assert carpool.QueueFull is QueueFull
    assert carpool.DeadlineExceeded is DeadlineExceeded
    assert carpool.BatcherClosed is BatcherClosed
    assert carpool.CollationError is CollationError
    assert carpool.BatchSizeMismatch is BatchSizeMismatch
    assert carpool.CarpoolError is CarpoolError


def test_queue_full() -> None:
    error = QueueFull(max_queue_size=64, queued=63, rows=2)
    assert (error.max_queue_size, error.queued, error.rows) == (64, 63, 2)
    assert str(error) == (
        "Exceeds maximum queue size: 63 rows queued, 2 more would pass max_queue_size=64. "
        "Retry later, add workers, or raise max_queue_size."
    )


def test_queue_full_takes_keywords_only() -> None:
    with pytest.raises(TypeError):
        QueueFull(64, 63, 2)  # type: ignore[call-arg]


def test_deadline_exceeded_while_queued() -> None:
    error = DeadlineExceeded(timeout_ms=250.0, stage="queued")
    assert (error.timeout_ms, error.stage) == (250.0, "queued")
    assert str(error) == (
        "Request timeout expired: timeout_ms=250 passed while queued. "
        "Raise timeout_ms, lower max_wait_ms, or add workers."
    )


def test_deadline_exceeded_while_running() -> None:
    error = DeadlineExceeded(timeout_ms=12.5, stage="running")
    assert error.stage == "running"
    assert str(error) == (
        "Request timeout expired: timeout_ms=12.5 passed while its batch was running. "
        "Raise timeout_ms, lower max_wait_ms, or add workers."
    )


def test_batcher_closed() -> None:
    error = BatcherClosed("embed")
    assert error.name == "embed"
    assert str(error) == (
        "Batcher 'embed' is closed and accepts no new requests. "
        "Use it inside 'async with Batcher(...)' or 'with Batcher(...)'."
    )


def test_batcher_closed_with_a_reason() -> None:
    error = BatcherClosed("embed", reason="was never started")
    assert str(error).startswith("Batcher 'embed' was never started and accepts no new requests.")


def test_collation_error_names_its_field() -> None:
    error = CollationError("cannot stack str with int", field="input['ids']")
    assert error.field == "input['ids']"
    assert str(error) == "input['ids']: cannot stack str with int"
    assert CollationError("x").field == "input"


def test_batch_size_mismatch() -> None:
    error = BatchSizeMismatch(expected=8, actual=7)
    assert (error.expected, error.actual, error.field) == (8, 7, "output")
    assert str(error) == (
        "model_fn returned 7 rows in output for a batch of 8 rows; "
        "it must return exactly one output row per input row, along axis 0."
    )
    named = BatchSizeMismatch(expected=2, actual=3, field="output['logits']")
    assert named.field == "output['logits']"
    assert "3 rows in output['logits'] for a batch of 2 rows" in str(named)


def test_tritons_wording_is_kept() -> None:
    assert str(QueueFull(max_queue_size=1, queued=1, rows=1)).startswith(
        "Exceeds maximum queue size"
    )
    for stage in ("queued", "running"):
        assert str(DeadlineExceeded(timeout_ms=1, stage=stage)).startswith(
            "Request timeout expired"
        )


@pytest.mark.parametrize(
    ("error", "remedy"),
    [
        (QueueFull(max_queue_size=2, queued=2, rows=1), "raise max_queue_size"),
        (DeadlineExceeded(timeout_ms=5, stage="queued"), "Raise timeout_ms"),
        (BatcherClosed("m"), "Use it inside 'async with Batcher(...)'"),
        (BatchSizeMismatch(expected=1, actual=2), "exactly one output row per input row"),
        (Overloaded(predicted_ms=80, budget_ms=50, queued=9, rows=1), "Retry later"),
        (BlockingCallOnLoop(function="f"), "'await asyncio.to_thread(f, item)'"),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else "",
)
def test_every_message_names_a_remedy(error: CarpoolError, remedy: str) -> None:
    assert remedy in str(error)


def test_the_base_class_docstring_draws_the_tree() -> None:
    import carpool.errors as errors

    doc = errors.CarpoolError.__doc__ or ""
    for line in (
        "QueueFull (RuntimeError)",
        "DeadlineExceeded (TimeoutError)",
        "BatcherClosed (RuntimeError)",
        "CollationError (TypeError)",
        "BatchSizeMismatch (ValueError)",
        "ConfigError (ValueError)",
        "ConfigTypeError (TypeError)",
        "BlockingCallOnLoop (RuntimeError)",
        "Overloaded",
        "WorkerDied (RuntimeError)",
        "BatchTimeout (TimeoutError)",
        "WorkerStartError (RuntimeError)",
        "WorkerPoolClosed",
        "SharedMemoryFull (RuntimeError)",
        "ModelExit (RuntimeError)",
    ):
        assert line in doc
    every = [*examples(), *worker_examples(), ModelExit(error=SystemExit(3))]
    assert set(errors.__all__) == {type(e).__name__ for e in every} | {"CarpoolError"}


def every_module() -> list[ModuleType]:
    """Every module of the carpool package, its subpackages' too (``__main__`` aside: it runs)."""
    found = pkgutil.walk_packages(carpool.__path__, prefix="carpool.")
    names = [info.name for info in found if not info.name.endswith("__main__")]
    return [importlib.import_module(name) for name in names]


def test_every_public_exception_is_a_carpool_error() -> None:
    """What carpool defines and names without an underscore, callers may meet and catch:
    ``except CarpoolError`` must catch it. A signal that never leaves its package is private."""
    public = [
        (module.__name__, name, cls)
        for module in every_module()
        for name, cls in vars(module).items()
        if isinstance(cls, type)
        and issubclass(cls, BaseException)
        and cls.__module__ == module.__name__
        and not name.startswith("_")
    ]
    assert len(public) >= 20  # the walk found the tree, errors.py's and the server's
    strays = [
        f"{module}.{name}" for module, name, cls in public if not issubclass(cls, CarpoolError)
    ]
    assert strays == []


def test_the_tree_draws_every_carpool_error_in_the_package() -> None:
    import carpool.errors as errors

    every_module()

    def subclasses(cls: type) -> set[type]:
        direct = set(cls.__subclasses__())
        return direct.union(*(subclasses(sub) for sub in direct))

    found = {cls for cls in subclasses(CarpoolError) if cls.__module__.startswith("carpool.")}
    assert {cls.__name__ for cls in found} >= {"ConfigError", "ModelNotFound"}
    for cls in found:
        assert f"── {cls.__name__}" in (errors.CarpoolError.__doc__ or ""), cls


@pytest.mark.parametrize("error", examples(), ids=lambda e: type(e).__name__)
def test_errors_survive_pickle_and_copy(error: CarpoolError) -> None:
    # Errors cross process boundaries (process pools, multiprocessing workers, test runners)
    # and are copied by some frameworks; they must come back with their data and message.
    for clone in (pickle.loads(pickle.dumps(error)), copy.copy(error)):
        assert type(clone) is type(error)
        assert str(clone) == str(error)
        assert vars(clone) == vars(error)


def test_overloaded_is_a_queue_full_with_its_prediction() -> None:
    error = Overloaded(predicted_ms=81.4, budget_ms=50.0, queued=120, rows=2)
    assert isinstance(error, QueueFull)
    assert (error.predicted_ms, error.budget_ms, error.queued, error.rows) == (81.4, 50.0, 120, 2)
    assert str(error) == (
        "Overloaded: 120 rows queued ahead; this request would finish in about 81 ms, past "
        "its 50 ms latency objective. Retry later, relax the objective, or add workers."
    )


def worker_examples() -> list[CarpoolError]:
    return [
        WorkerDied(worker="demo#1", exitcode=-9),
        WorkerDied(worker="demo#0", exitcode=1, retried=True),
        BatchTimeout(timeout_ms=2000, worker="demo#1"),
        BatchTimeout(timeout_ms=250.5, worker="demo", stage="waiting"),
        WorkerStartError(worker="demo#0", reason="ImportError: no module named 'x'"),
        WorkerPoolClosed("demo"),
        SharedMemoryFull(needed=1 << 22, free=4096),
    ]


@pytest.mark.parametrize("error", worker_examples(), ids=lambda e: f"{type(e).__name__}")
def test_worker_errors_survive_pickle_and_copy(error: CarpoolError) -> None:
    for clone in (pickle.loads(pickle.dumps(error)), copy.copy(error)):
        assert type(clone) is type(error)
        assert str(clone) == str(error)
        assert vars(clone) == vars(error)


def test_exit_codes_and_signals_are_told_apart() -> None:
    assert describe_exit(-9) == "signal 9"
    assert describe_exit(1) == "exit code 1"
    assert describe_exit(0) == "exit code 0"


def test_worker_error_messages() -> None:
    assert str(WorkerDied(worker="demo#1", exitcode=-9)) == (
        "model worker died (signal 9) while running the batch (worker demo#1); it is being "
        "restarted. Check the server log for why."
    )
    assert str(WorkerDied(worker="demo#0", exitcode=1, retried=True)) == (
        "model worker died (exit code 1) while running the batch after one retry on another "
        "worker (worker demo#0); it is being restarted. Check the server log for why."
    )
    assert str(BatchTimeout(timeout_ms=2000, worker="demo#1")) == (
        "model batch ran past batch_timeout_ms=2000 on worker demo#1; the worker was killed "
        "and replaced. Raise batch_timeout_ms if the model is just slow."
    )
    assert str(BatchTimeout(timeout_ms=300, worker="demo", stage="waiting")) == (
        "no model worker of demo was alive to run the batch within batch_timeout_ms=300; "
        "its workers are restarting."
    )
    assert str(WorkerStartError(worker="demo#0", reason="OSError: no GPU")) == (
        "model worker demo#0 could not load its model: OSError: no GPU"
    )
    assert str(WorkerPoolClosed("demo")) == (
        "model worker pool 'demo' is closed and runs no more batches."
    )


def test_each_worker_error_is_also_the_builtin_it_resembles() -> None:
    assert isinstance(WorkerDied(worker="w", exitcode=1), RuntimeError)
    assert isinstance(BatchTimeout(timeout_ms=1, worker="w"), TimeoutError)
    assert isinstance(WorkerStartError(worker="w", reason="r"), RuntimeError)
    closed = WorkerPoolClosed("demo", "was closed while the batch ran")
    assert isinstance(closed, BatcherClosed)
    assert isinstance(closed, RuntimeError)
    assert (closed.name, closed.reason) == ("demo", "was closed while the batch ran")


def test_a_model_exit_holds_what_the_model_raised_and_survives_pickle() -> None:
    error = ModelExit(error=SystemExit(3))
    assert isinstance(error, RuntimeError)
    assert str(error) == (
        "the model raised SystemExit(3) while computing a batch; carpool turned it into this "
        "error so that one batch cannot stop the process. Raise an Exception instead."
    )
    assert str(ModelExit(error=KeyboardInterrupt())).startswith(
        "the model raised KeyboardInterrupt while"
    )
    clone = pickle.loads(pickle.dumps(error))  # from a replica process
    assert type(clone) is ModelExit
    assert str(clone) == str(error)
    assert type(clone.error) is SystemExit
    assert clone.error.args == (3,)


def test_call_model_turns_only_a_base_exception_into_a_model_exit() -> None:
    def model(raised: BaseException) -> None:
        raise raised

    assert call_model(lambda batch: batch + 1, 1) == 2
    with pytest.raises(ValueError, match="bad row"):
        call_model(model, ValueError("bad row"))
    exit_ = SystemExit(3)
    with pytest.raises(ModelExit) as caught:
        call_model(model, exit_)
    assert caught.value.error is exit_
    assert caught.value.__cause__ is exit_
