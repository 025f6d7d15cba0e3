"""Every error carpool raises on purpose; stdlib only. Each is also the builtin it resembles, so
``except TimeoutError`` keeps working in code that does not know carpool; the tree is drawn in
:class:`CarpoolError`'s docstring. A model's own exceptions are not wrapped: its callers get
them, with a note naming the batch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = [
    "BatchSizeMismatch",
    "BatchTimeout",
    "BatcherClosed",
    "BlockingCallOnLoop",
    "CarpoolError",
    "CollationError",
    "ConfigError",
    "ConfigTypeError",
    "DeadlineExceeded",
    "ModelExit",
    "Overloaded",
    "QueueFull",
    "SharedMemoryFull",
    "WorkerDied",
    "WorkerPoolClosed",
    "WorkerStartError",
]


class CarpoolError(Exception):
    """Base class of every error carpool raises itself. The tree, with the builtin each
    one also is (the four ``Worker*`` errors and ``BatchTimeout`` come from the runners
    of replicas outside the batcher's threads, ``carpool.runners``)::

        CarpoolError
        │   defined here, raised by the library:
        ├── QueueFull (RuntimeError)          refused at the door: max_queue_size rows already wait
        │   └── Overloaded                    refused at the door: it would finish past its deadline
        ├── DeadlineExceeded (TimeoutError)   the request's timeout_ms passed before its result
        ├── BatcherClosed (RuntimeError)      the batcher stopped accepting requests
        │   └── WorkerPoolClosed              the replicas (processes, Ray actors) were closed
        ├── CollationError (TypeError)        rows that cannot be stacked, or an unsplittable output
        ├── BatchSizeMismatch (ValueError)    the model returned more or fewer rows than it got
        ├── BlockingCallOnLoop (RuntimeError) a sync @carpool.batch function called on a loop thread
        ├── ConfigError (ValueError)          an option, target, flag or config file that cannot
        │   │                                 be used: names the option, what it must be, its value
        │   └── ConfigTypeError (TypeError)   an option of the wrong type (a float for an int)
        ├── WorkerDied (RuntimeError)         a replica died running the batch (twice)
        ├── BatchTimeout (TimeoutError)       the batch ran past batch_timeout_ms on a replica
        ├── WorkerStartError (RuntimeError)   no replica (process, Ray actor) could load the model
        ├── SharedMemoryFull (RuntimeError)   /dev/shm has no room for a batch's arena
        ├── ModelExit (RuntimeError)          the model raised SystemExit, KeyboardInterrupt or
        │                                     another BaseException that is not an Exception
        │
        │   raised by step-wise models and engines, defined with their code:
        ├── StepInputError (ValueError)       stepwise: a request row or parameter a
        │                                     step-wise model refuses: a 400 naming it
        ├── SequencesFull (RuntimeError)      backends.smollm2.llama_engine: every
        │                                     sequence slot of the llama context is taken
        ├── LlamaDecodeError (RuntimeError)   backends.smollm2.llama_engine: llama_decode
        │                                     failed for the whole step
        │
        │   raised by the server and bench, defined with their code:
        ├── ProtocolError (ValueError)        server.messages: a request the v2 protocol
        │   │                                 cannot accept, or a response it cannot carry
        │   └── OpenAIError                   server.openai.codec: a /v1 request OpenAI's API
        │                                     refuses, with its param and code
        ├── ModelNotFound (LookupError)       server.failures: no model (or version) by
        │                                     that name: a 404
        ├── ModelUnavailable                  server.failures: the model failed to load at
        │                                     start: a 400
        ├── ModelOutputError (RuntimeError)   server.failures: outputs that do not match
        │                                     the model's declared signature: a 500
        ├── LoadFailed                        server.failures: a model that could not be
        │                                     loaded or unloaded on request: a 400
        ├── ControlUnavailable                server.failures: load and unload are off
        │                                     (no explicit model control, or stopping): a 503
        ├── HTTPError                         server.statuses: an answer other than 200,
        │   │                                 with its status and headers
        │   └── ClientGone                    server.inference.path: the client left before
        │                                     its answer (a 499, withdrawn if still queued)
        ├── BenchError (ValueError)           bench.targets.base: a bench target, flag or file
        │                                     that cannot be used
        └── ReportError (ValueError)          bench.report.data: a file that is not a carpool
                                              bench report
    """

    def _fields(self) -> dict[str, Any]:
        return {}

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only constructors: rebuild from the fields, so errors survive pickling
        # (process pools) and copying with their data and message intact.
        return (_rebuild, (type(self), self._fields()))


def _rebuild(cls: type[CarpoolError], fields: dict[str, Any]) -> CarpoolError:
    return cls(**fields)


class QueueFull(CarpoolError, RuntimeError):
    """The queue already holds ``max_queue_size`` rows; nothing of the request was queued.

    Triton's wording (``Exceeds maximum queue size``) is kept because operators grep for it.
    """

    def __init__(self, *, max_queue_size: int, queued: int, rows: int) -> None:
        self.max_queue_size = max_queue_size
        self.queued = queued
        self.rows = rows
        if rows > max_queue_size:
            remedy = "Split the request or raise max_queue_size"
        else:
            remedy = "Retry later, add workers, or raise max_queue_size"
        super().__init__(
            f"Exceeds maximum queue size: {queued} rows queued, {rows} more would pass "
            f"max_queue_size={max_queue_size}. {remedy}."
        )

    def _fields(self) -> dict[str, Any]:
        return {"max_queue_size": self.max_queue_size, "queued": self.queued, "rows": self.rows}


class Overloaded(QueueFull):
    """Refused on arrival: the work queued ahead of the request, plus its own batch, is
    predicted to finish after its deadline, so it would only be served late. A ``QueueFull``
    (the same 503 and ``Retry-After``), counted apart from queue-full rejections."""

    def __init__(self, *, predicted_ms: float, budget_ms: float, queued: int, rows: int) -> None:
        self.predicted_ms = predicted_ms
        self.budget_ms = budget_ms
        self.queued = queued
        self.rows = rows
        self.max_queue_size = 0
        RuntimeError.__init__(
            self,
            f"Overloaded: {queued} rows queued ahead; this request would finish in about "
            f"{predicted_ms:.0f} ms, past its {budget_ms:.0f} ms latency objective. Retry "
            "later, relax the objective, or add workers.",
        )

    def _fields(self) -> dict[str, Any]:
        return {
            "predicted_ms": self.predicted_ms,
            "budget_ms": self.budget_ms,
            "queued": self.queued,
            "rows": self.rows,
        }


class DeadlineExceeded(CarpoolError, TimeoutError):
    """The request's ``timeout_ms`` passed before it had a result.

    ``stage`` says where it was: ``"queued"`` (it never reached the model) or ``"running"``
    (its batch was still executing; the result is discarded).
    """

    def __init__(self, *, timeout_ms: float, stage: str) -> None:
        self.timeout_ms = timeout_ms
        self.stage = stage
        where = "while queued" if stage == "queued" else "while its batch was running"
        super().__init__(
            f"Request timeout expired: timeout_ms={timeout_ms:g} passed {where}. "
            "Raise timeout_ms, lower max_wait_ms, or add workers."
        )

    def _fields(self) -> dict[str, Any]:
        return {"timeout_ms": self.timeout_ms, "stage": self.stage}


class BatcherClosed(CarpoolError, RuntimeError):
    """The batcher is closing or closed, or was never started, and takes no new requests."""

    def __init__(self, name: str, reason: str = "is closed") -> None:
        self.name = name
        self.reason = reason
        super().__init__(
            f"Batcher {name!r} {reason} and accepts no new requests. "
            "Use it inside 'async with Batcher(...)' or 'with Batcher(...)'."
        )

    def _fields(self) -> dict[str, Any]:
        return {"name": self.name, "reason": self.reason}


class CollationError(CarpoolError, TypeError):
    """Rows could not be stacked into a batch, or the model's output could not be split.

    ``field`` names the part of the request that failed (``"input"``, ``"input['ids']"``,
    ``"output"``), so a server can report it to the client.
    """

    def __init__(self, message: str, *, field: str = "input") -> None:
        self.field = field
        self.detail = message
        super().__init__(f"{field}: {message}")

    def _fields(self) -> dict[str, Any]:
        return {"message": self.detail, "field": self.field}


class BatchSizeMismatch(CarpoolError, ValueError):
    """``model_fn`` returned a different number of rows than the batch it was given."""

    def __init__(self, *, expected: int, actual: int, field: str = "output") -> None:
        self.expected = expected
        self.actual = actual
        self.field = field
        super().__init__(
            f"model_fn returned {actual} rows in {field} for a batch of {expected} rows; "
            "it must return exactly one output row per input row, along axis 0."
        )

    def _fields(self) -> dict[str, Any]:
        return {"expected": self.expected, "actual": self.actual, "field": self.field}


class BlockingCallOnLoop(CarpoolError, RuntimeError):
    """A synchronous ``@carpool.batch`` function was called on an event loop's thread.

    Waiting there for its result would block the loop until the batch ran: every other
    caller on that loop would wait behind it, one at a time, never sharing a batch.
    """

    def __init__(self, *, function: str) -> None:
        self.function = function
        name = function.rpartition(".")[2]
        super().__init__(
            f"{function}() is a synchronous @carpool.batch function called on the thread of a "
            "running event loop: it would block the loop until its batch ran, so callers on "
            "this loop would run one at a time, never sharing a batch. Make the function "
            "'async def' and await it, or call it from a thread: "
            f"'await asyncio.to_thread({name}, item)'."
        )

    def _fields(self) -> dict[str, Any]:
        return {"function": self.function}


class ConfigError(CarpoolError, ValueError):
    """An option (a batcher's or a request's), target, flag or config file that cannot be
    used; the message names it, says what it must be and what it got."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)

    def _fields(self) -> dict[str, Any]:
        return {"message": self.message}


class ConfigTypeError(ConfigError, TypeError):
    """An option of the wrong type (``max_batch_size=2.0``): a :class:`ConfigError`, and a
    ``TypeError`` as Python's own argument checks would raise."""


def describe_exit(exitcode: int) -> str:
    """``signal 9`` for a process killed by a signal (``multiprocessing``'s negative
    exit codes), ``exit code 1`` otherwise."""
    return f"signal {-exitcode}" if exitcode < 0 else f"exit code {exitcode}"


class WorkerDied(CarpoolError, RuntimeError):
    """The replica running the batch died: its process killed, crashed or exited
    (``os._exit``), or its Ray actor lost.

    ``worker`` is the replica's name (``demo#1``), ``exitcode`` its process's exit code
    (negative: the signal that killed it), ``retried`` whether the batch had already been
    retried once on another replica (so two died on it), ``cause`` what happened when no
    exit code says it (a Ray actor whose node was lost).
    """

    def __init__(
        self, *, worker: str, exitcode: int, retried: bool = False, cause: str | None = None
    ) -> None:
        self.worker = worker
        self.exitcode = exitcode
        self.retried = retried
        self.cause = cause
        again = " after one retry on another worker" if retried else ""
        how = cause if cause is not None else describe_exit(exitcode)
        super().__init__(
            f"model worker died ({how}) while running the batch{again} "
            f"(worker {worker}); it is being restarted. Check the server log for why."
        )

    def _fields(self) -> dict[str, Any]:
        return {
            "worker": self.worker,
            "exitcode": self.exitcode,
            "retried": self.retried,
            "cause": self.cause,
        }


class BatchTimeout(CarpoolError, TimeoutError):
    """The batch did not finish within ``batch_timeout_ms``.

    ``stage`` says where: ``"running"`` (its replica ran past the limit and was killed and
    replaced) or ``"waiting"`` (no replica was alive to take it within the limit).
    """

    def __init__(self, *, timeout_ms: float, worker: str, stage: str = "running") -> None:
        self.timeout_ms = timeout_ms
        self.worker = worker
        self.stage = stage
        if stage == "running":
            message = (
                f"model batch ran past batch_timeout_ms={timeout_ms:g} on worker {worker}; "
                "the worker was killed and replaced. Raise batch_timeout_ms if the model "
                "is just slow."
            )
        else:
            message = (
                f"no model worker of {worker} was alive to run the batch within "
                f"batch_timeout_ms={timeout_ms:g}; its workers are restarting."
            )
        super().__init__(message)

    def _fields(self) -> dict[str, Any]:
        return {"timeout_ms": self.timeout_ms, "worker": self.worker, "stage": self.stage}


class WorkerStartError(CarpoolError, RuntimeError):
    """A replica (a child process or a Ray actor) could not load (or warm up) its model,
    nor could any other, or Ray could not be reached; ``reason`` is the error reported,
    e.g. ``"ModuleNotFoundError: No module named 'mymodel'"``."""

    def __init__(self, *, worker: str, reason: str) -> None:
        self.worker = worker
        self.reason = reason
        super().__init__(f"model worker {worker} could not load its model: {reason}")

    def _fields(self) -> dict[str, Any]:
        return {"worker": self.worker, "reason": self.reason}


class WorkerPoolClosed(BatcherClosed):
    """A runner's replicas (child processes or Ray actors) were closed, or never started,
    and run no more batches; a :class:`carpool.errors.BatcherClosed`, so it is answered
    the same way."""

    def __init__(self, name: str, reason: str = "is closed") -> None:
        self.name = name
        self.reason = reason
        RuntimeError.__init__(
            self, f"model worker pool {name!r} {reason} and runs no more batches."
        )


class SharedMemoryFull(CarpoolError, RuntimeError):
    """Shared memory (``/dev/shm``) has no room for a batch's arena: the batch is refused
    (a 503), where writing past a full tmpfs would kill the process with SIGBUS.

    ``needed`` is the segment's size in bytes, ``free`` what the filesystem had left.
    """

    def __init__(self, *, needed: int, free: int) -> None:
        self.needed = needed
        self.free = free
        super().__init__(
            f"shared memory (/dev/shm) has no room for a {needed}-byte batch arena "
            f"({free} bytes free): give the server a larger /dev/shm (in Kubernetes, an "
            "emptyDir of medium Memory mounted there, as deploy/ does), or send smaller batches"
        )

    def _fields(self) -> dict[str, Any]:
        return {"needed": self.needed, "free": self.free}


class ModelExit(CarpoolError, RuntimeError):
    """The model raised a ``BaseException`` that is not an ``Exception`` (``SystemExit``,
    ``KeyboardInterrupt``, ``GeneratorExit``) while computing a batch; ``error`` is what it
    raised. Raised in a worker thread or child process, it would have stopped the batcher,
    or the whole server, for one batch: it fails only the rows whose model call raised it.
    """

    def __init__(self, *, error: BaseException) -> None:
        self.error = error
        name = type(error).__name__
        raised = f"{name}({error.args[0]!r})" if len(error.args) == 1 else name
        super().__init__(
            f"the model raised {raised} while computing a batch; carpool turned it into this "
            "error so that one batch cannot stop the process. Raise an Exception instead."
        )

    def _fields(self) -> dict[str, Any]:
        return {"error": self.error}


def call_model(model_fn: Callable[[Any], Any], batch: Any) -> Any:
    """``model_fn(batch)`` in a worker thread, a replica's process or a Ray actor, where
    whatever the model raises is the model's: a ``SystemExit`` or ``KeyboardInterrupt``
    becomes a :class:`ModelExit`, an ``Exception`` that fails (and bisects) only its rows,
    where it would otherwise stop the loop that awaits the thread (or end the replica, and
    the retry's too). Signals interrupt only the main thread, and a replica's process
    ignores SIGINT, so a real Ctrl-C is never caught here."""
    try:
        return model_fn(batch)
    except Exception:
        raise
    except BaseException as exc:  # the model's: see the docstring
        raise ModelExit(error=exc) from exc
