"""Between the wire and the batcher: check a request against the model, shape the answer.
Everything a client can get wrong is refused here, before anything is queued, so a bad request
never reaches a batch others share. :class:`Admissions` runs a large request's ``preprocess``
in threads, so the loop goes on answering. Imports nothing that does I/O."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from carpool.datatypes import DATATYPES, datatype_of
from carpool.errors import CollationError
from carpool.model import Model, Tensor
from carpool.server.failures import ModelOutputError
from carpool.server.messages import (
    InferInput,
    InferRequest,
    OutputTensor,
    ProtocolError,
    wants_binary,
)

__all__ = [
    "ADMISSION_THREADS",
    "DECODE_OFFLOAD_BYTES",
    "OFFLOAD_BYTES",
    "AdmittedRequest",
    "Admissions",
    "ModelOutputError",
    "admit",
    "reaches",
    "respond",
    "scheduling",
]

T = TypeVar("T")
# Triton's reserved parameter names this server understands or refuses.
_SEQUENCE = ("sequence_id", "sequence_start", "sequence_end")
# From this many bytes of inputs, a request for a model with a preprocess is admitted in a
# thread. Measured (2-core x86, minilm's tokenizer): tokenizing costs about 0.25 us a byte,
# so 1 ms here; one hop to a thread and back costs 25 us of CPU under uvloop, 45 us under
# asyncio: under 5% of what it takes off the loop, and smaller requests are not worth it.
OFFLOAD_BYTES = 4096
# From this many bytes, a request's body (JSON text, a gRPC message) is decoded in a thread.
DECODE_OFFLOAD_BYTES = 1 << 20
# Threads that admit large requests, per process: a tokenizer parallelizes on its own (minilm's
# uses every core), so a few suffice; more requests wait their turn, holding no thread.
ADMISSION_THREADS = min(4, os.cpu_count() or 1)


@dataclass(frozen=True, slots=True)
class AdmittedRequest:
    """A request checked against its model: what the batcher gets, and how to answer it.

    (Not :class:`carpool.policies.base.Admission`, which is what an adaptive policy weighs when it
    decides whether a request can still make its deadline.)
    """

    value: dict[str, np.ndarray[Any, Any]]  # input name -> k rows
    rows: int
    outputs: tuple[tuple[str, bool], ...]  # (output name, binary?) in response order
    priority: int
    timeout_ms: float | None


def _matches(shape: tuple[int, ...], spec: Tensor) -> bool:
    want = spec.shape
    if len(shape) != len(want):
        return False
    for index, dim in enumerate(want):  # noqa: SIM110 (a loop: 3x all() with a generator)
        if dim != -1 and dim != shape[index]:
            return False
    return True


def _dims(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _check_inputs(model: Model, request: InferRequest) -> dict[str, np.ndarray[Any, Any]]:
    specs = model.input_specs
    inputs = request.inputs
    if len(specs) == 1 == len(inputs) and specs[0].name == inputs[0].name:  # the common case
        return {specs[0].name: _input_value(model, inputs[0], specs[0])}
    by_name = {t.name: t for t in specs}
    _check_names(model, by_name, [i.name for i in inputs])
    return {tensor.name: _input_value(model, tensor, by_name[tensor.name]) for tensor in inputs}


def _check_names(model: Model, specs: Mapping[str, Tensor], got: list[str]) -> None:
    missing = [n for n in specs if n not in got]
    unknown = [n for n in got if n not in specs]
    if unknown:
        raise ProtocolError(
            f"unexpected inference input(s) {unknown} for model '{model.name}'; "
            f"expected {list(specs)}",
            field="inputs",
        )
    if missing:
        raise ProtocolError(
            f"expected {len(specs)} inputs but got {len(got)} inputs for model "
            f"'{model.name}'. Got input(s) {got}, but missing required input(s) {missing}",
            field="inputs",
        )


def _input_value(model: Model, tensor: InferInput, spec: Tensor) -> np.ndarray[Any, Any]:
    # The input as the batcher takes it: rows along the first axis, a batch of 1 added for
    # a model that does not batch.
    name = tensor.name
    if model.declared and tensor.datatype != spec.datatype:
        raise ProtocolError(
            f"inference input '{name}' data-type is '{tensor.datatype}', but model "
            f"'{model.name}' expects '{spec.datatype}'",
            field=name,
        )
    if not model.batching.batched:
        if model.declared and not _matches(tensor.shape, spec):
            raise ProtocolError(
                f"unexpected shape for input '{name}' for model '{model.name}'. "
                f"Expected {_dims(spec.shape)}, got {_dims(tensor.shape)} (the model "
                "does not batch: send exactly its shape)",
                field=name,
            )
        return tensor.data.reshape((1, *tensor.shape))
    if not tensor.shape:
        raise ProtocolError(
            f"input '{name}' has shape [], but model '{model.name}' batches along "
            "the first dimension: send shape [rows, ...]",
            field=name,
        )
    if model.declared and not _matches(tensor.shape[1:], spec):
        raise ProtocolError(
            f"unexpected shape for input '{name}' for model '{model.name}'. "
            f"Expected [-1,{_dims(spec.shape)[1:]}, got {_dims(tensor.shape)}",
            field=name,
        )
    return tensor.data.reshape(tensor.shape)


def _preprocess(model: Model, value: dict[str, Any], rows: int) -> dict[str, Any]:
    """The model's own per-request step (tokenizing, say); what it refuses is a 400."""
    assert model.preprocess is not None
    try:
        result = dict(model.preprocess(value))
    except (ValueError, TypeError, UnicodeError) as exc:
        raise ProtocolError(
            f"model '{model.name}' cannot use this request's inputs: {exc}", field="inputs"
        ) from None
    for name, array in result.items():
        got = len(array) if hasattr(array, "__len__") else None
        if got != rows:
            raise ModelOutputError(
                f"model '{model.name}': preprocess returned {got} rows for '{name}' from a "
                f"request of {rows}; it must keep one row per input row"
            )
    return result


def _rows(request: InferRequest) -> int:
    counts = {i.name: i.shape[0] for i in request.inputs}
    if len(set(counts.values())) > 1:
        raise ProtocolError(
            f"inputs disagree on the batch size (first dimension): {counts}", field="inputs"
        )
    rows = next(iter(counts.values()))
    if rows < 1:
        raise ProtocolError("the batch dimension must be at least 1, got 0", field="inputs")
    return rows


def _requested(model: Model, request: InferRequest) -> tuple[tuple[str, bool], ...]:
    names = [t.name for t in model.output_specs]
    if request.outputs is None:
        return tuple((name, wants_binary(request, None)) for name in names)
    chosen = []
    for output in request.outputs:
        if output.name not in names:
            raise ProtocolError(
                f"unexpected inference output '{output.name}' for model '{model.name}'; "
                f"it has {names}",
                field=f"outputs.{output.name}",
            )
        chosen.append((output.name, wants_binary(request, output)))
    return tuple(chosen)


def _int_parameter(request: InferRequest, name: str) -> int | None:
    value = request.parameters.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ProtocolError(
            f"parameter '{name}' must be a non-negative integer, got {value!r}",
            field=f"parameters.{name}",
        )
    return value


def admit(model: Model, request: InferRequest) -> AdmittedRequest:
    """Check ``request`` against ``model``; raises :class:`ProtocolError` (a 400)."""
    parameters = request.parameters
    for name in _SEQUENCE if parameters else ():
        if name in parameters:
            raise ProtocolError(
                f"parameter '{name}': model '{model.name}' is stateless; sequence batching "
                "is not supported",
                field=f"parameters.{name}",
            )
    value = _check_inputs(model, request)
    rows = _rows(request) if model.batching.batched else 1
    if rows > model.batching.rows_per_request:
        cap = model.batching.rows_per_request
        raise ProtocolError(
            f"inference request batch-size must be <= {cap} for '{model.name}': it holds "
            f"{rows} rows; send fewer, or raise max_rows_per_request (--max-rows-per-request)",
            field="inputs",
        )
    if model.preprocess is not None:
        value = _preprocess(model, value, rows)
    if model.padding is not None:
        try:
            model.padding.check(value)
        except CollationError as exc:
            raise ProtocolError(str(exc), field=exc.field or "inputs") from None
    outputs = _requested(model, request)
    return AdmittedRequest(
        value, rows, outputs, _priority(model, request), _timeout_ms(model, request)
    )


def reaches(request: InferRequest, limit: int) -> bool:
    """Whether ``request``'s inputs hold at least ``limit`` bytes (a BYTES element counts its
    length), counted no further than ``limit``: what deciding costs stays small."""
    total = 0
    for tensor in request.inputs:
        data = tensor.data
        if data.dtype != object:
            total += data.nbytes
        elif data.size >= limit:  # each element costs a preprocess something
            return True
        else:
            for item in data.flat:
                total += len(item) if isinstance(item, bytes | str) else 1
                if total >= limit:
                    return True
        if total >= limit:
            return True
    return False


class Admissions:
    """:func:`admit`, run where it does not hold the event loop up.

    A request for a model with a ``preprocess`` and at least ``offload_bytes`` of inputs is
    admitted in one of ``threads`` threads (started with the first one); any other inline,
    on the loop. At most ``threads`` admissions are handed to the pool at once: the others
    wait their turn on the loop, in arrival order, holding only the request they already
    hold, and requests in flight are bounded already (``--limit-concurrency``,
    ``--grpc-max-concurrent-rpcs``, a stream's bound). What :func:`admit` raises is raised
    to the caller as it is, so a refusal is the same 400 either way.
    """

    def __init__(
        self, threads: int = ADMISSION_THREADS, offload_bytes: int = OFFLOAD_BYTES
    ) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.threads = threads
        self.offload_bytes = offload_bytes
        self.offloaded = 0  # steps handed to the threads so far
        self._pool: ThreadPoolExecutor | None = None
        self._room = asyncio.Semaphore(threads)  # a thread free, or soon free

    async def admit(self, model: Model, request: InferRequest) -> AdmittedRequest:
        """:func:`admit`'s result for ``request``, from a thread if it is large."""
        if model.preprocess is None or not reaches(request, self.offload_bytes):
            return admit(model, request)
        return await self.run(admit, model, request)

    def close(self) -> None:
        """Let the threads end once their steps are done (at shutdown: an idle thread left
        behind reads as a model call that never returned)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)

    async def decode(self, nbytes: int, step: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``step(*args, **kwargs)``, decoding ``nbytes`` of a request: inline below
        :data:`DECODE_OFFLOAD_BYTES`, else in one of the threads (~10 ms a MiB that the loop
        spends answering others meanwhile)."""
        if nbytes < DECODE_OFFLOAD_BYTES:
            return step(*args, **kwargs)
        return await self.run(step, *args, **kwargs)

    async def run(self, step: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``step(*args, **kwargs)`` in one of the threads, in its turn: any per-request step that
        costs the loop as much (decoding a large body, say)."""
        await self._room.acquire()
        loop = asyncio.get_running_loop()
        try:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="carpool-admit")
            job = self._pool.submit(step, *args, **kwargs)
        except BaseException:
            self._room.release()
            raise
        self.offloaded += 1
        # The room is given back when the thread is done (not when a cancelled caller
        # stops waiting): the pool never holds more than ``threads`` jobs.
        job.add_done_callback(lambda _: _call_soon(loop, self._room.release))
        return await asyncio.wrap_future(job, loop=loop)


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Any) -> None:
    try:
        loop.call_soon_threadsafe(callback)
    except RuntimeError:  # the loop has closed: nobody is left to wait for the room
        pass


def _priority(model: Model, request: InferRequest) -> int:
    if not request.parameters:
        return model.batching.default_priority_level
    priority = _int_parameter(request, "priority") or 0
    levels = model.batching.priority_levels
    if levels and priority > levels:
        raise ProtocolError(
            f"parameter 'priority' must be in [0, {levels}] for model '{model.name}', "
            f"got {priority}",
            field="parameters.priority",
        )
    return priority or model.batching.default_priority_level


def scheduling(model: Model, request: InferRequest) -> tuple[int, float | None]:
    """``request``'s priority for ``model``, and the timeout in ms it sets itself (None: it
    sets none); :class:`ProtocolError` for either out of range. What :func:`admit` checks of
    them, for a request answered without admission (from the response cache)."""
    return _priority(model, request), _requested_timeout_ms(request)


def _requested_timeout_ms(request: InferRequest) -> float | None:
    timeout_us = request.parameters and _int_parameter(request, "timeout")  # us, 0 = none
    return timeout_us / 1000.0 if timeout_us else None


def _timeout_ms(model: Model, request: InferRequest) -> float | None:
    # The request's own timeout may shorten the model's default, never extend it.
    timeout_ms = model.batching.default_timeout_ms
    requested_ms = _requested_timeout_ms(request)
    if requested_ms is not None:
        timeout_ms = requested_ms if timeout_ms is None else min(timeout_ms, requested_ms)
    return timeout_ms


def respond(
    model: Model, admitted: AdmittedRequest, result: Mapping[str, Any]
) -> list[tuple[OutputTensor, bool]]:
    """Response tensors for the requested outputs; :class:`ModelOutputError` if one is
    missing or unlike the model's declaration."""
    declared = {t.name: t for t in model.output_specs}
    tensors = []
    for name, binary in admitted.outputs:
        if name not in result:
            raise ModelOutputError(
                f"model '{model.name}' returned outputs {sorted(result)}, without '{name}'"
            )
        tensors.append((_output_tensor(model, declared[name], result[name]), binary))
    return tensors


def _output_tensor(model: Model, spec: Tensor, value: Any) -> OutputTensor:
    name = spec.name
    array = np.asarray(value)
    if not model.batching.batched:
        array = array[0]  # the batch of one the batcher added
        if model.outputs is not None and not _matches(tuple(array.shape), spec):
            raise ModelOutputError(
                f"model '{model.name}' returned output '{name}' with shape "
                f"{_dims(tuple(array.shape))}, but declares {_dims(spec.shape)}"
            )
    elif model.outputs is not None and (
        array.ndim == 0 or not _matches(tuple(array.shape[1:]), spec)
    ):
        raise ModelOutputError(
            f"model '{model.name}' returned output '{name}' with shape "
            f"{_dims(tuple(array.shape))}, but declares rows of {_dims(spec.shape)}"
        )
    if model.outputs is not None and spec.datatype != "BYTES":
        try:  # a wider or narrower number is cast; a non-number is the model's mistake
            array = array.astype(DATATYPES[spec.datatype], copy=False)  # BF16 travels as FP32
        except (TypeError, ValueError) as exc:
            raise ModelOutputError(
                f"model '{model.name}' returned output '{name}' of {array.dtype} that is not "
                f"{spec.datatype}: {exc}"
            ) from exc
        datatype = spec.datatype
    else:
        datatype = datatype_of(array)
    return OutputTensor(name, datatype, tuple(array.shape), array)
