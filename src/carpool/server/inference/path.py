"""The inference path: one request's whole life, for every protocol. A front end hands
:meth:`Inference.infer` one :class:`~carpool.server.inference.call.Call` and gets the encoded
answer back; it is never called back. The path looks the model up once, checks readiness before
reading, then reads, decodes (inline or in a thread), admits, batches or answers from the
response cache (docs/architecture.md), encodes, and records the outcome once."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from functools import partial
from typing import Any, TypeVar

import numpy as np

from carpool.errors import BatcherClosed, DeadlineExceeded
from carpool.server.inference.admission import (
    DECODE_OFFLOAD_BYTES,
    Admissions,
    AdmittedRequest,
    reaches,
    respond,
    scheduling,
)
from carpool.server.inference.cache import (
    REPLAY_OVERHEAD,
    Entry,
    Replayed,
    ResponseCache,
    replay_key,
    request_key,
)
from carpool.server.inference.call import (
    NOT_WITHDRAWN,
    Answer,
    Call,
    GoneSignal,
    Replay,
    Withdrawal,
)
from carpool.server.inference.outcomes import Recorder, error_status
from carpool.server.inference.sharing import Flights
from carpool.server.lifecycle.registry import Registry, ServedModel
from carpool.server.messages import InferRequest, Parameters, ProtocolError
from carpool.server.statuses import HTTPError, Status
from carpool.stepwise import StepwiseModel

__all__ = [
    "NOT_WITHDRAWN",
    "Answer",
    "Call",
    "ClientGone",
    "GoneSignal",
    "Inference",
    "Replay",
    "Withdrawal",
]

R = TypeVar("R")
T = TypeVar("T")
A = TypeVar("A")
_ENDED = object()  # a merged stream's end


class ClientGone(HTTPError):
    """The client went away before its answer (counted as a 499): nobody is left to answer,
    and its request was withdrawn from the queue if it was still there."""

    def __init__(self) -> None:
        super().__init__(Status.CLIENT_CLOSED, "the client went away before its answer")


class Inference:
    """The one inference path over the models of ``registry`` (see the module docstring);
    ``admissions`` admits its requests (by default, a pool of its own); ``recorder`` counts
    every answer of the server, this path's and its front ends' alike."""

    def __init__(self, registry: Registry, admissions: Admissions | None = None) -> None:
        self.registry = registry
        self.admissions = admissions if admissions is not None else Admissions()
        self.recorder = Recorder(registry)
        self.flights: Flights[tuple[Entry, float]] = Flights()  # cached models' computations

    async def infer(self, call: Call[R, T]) -> T:
        """``call``'s encoded answer (see the module docstring). Raises what the request
        ended in, already counted: :class:`ClientGone`, a cancellation (counted as
        ``call.withdrawal.cancel_counts_as`` says), or any exception
        :func:`~carpool.server.inference.outcomes.error_status` classifies. Counted under
        the model once it is known; before (an unknown or unavailable model,
        :class:`~carpool.server.failures.ModelNotFound`,
        :class:`~carpool.server.failures.ModelUnavailable`, a body that cannot be read or
        names no model), the server's. Whatever it returns or raises is counted, once."""
        return await self._through(call, partial(self._encoded, call=call))

    async def stream(self, call: Call[R, T], emit: Callable[[T], Awaitable[None]]) -> None:
        """``call``'s answer step by step: each step's outputs encoded and handed to
        ``emit`` as they come, for a step-wise model (a whole answer, for any other). Raises
        and counts as :meth:`infer` does; an error after the first ``emit`` is the front
        end's to send as its protocol does (an SSE error event, a final gRPC response)."""

        async def answer(served: ServedModel, read: R) -> None:
            if isinstance(served.model, StepwiseModel):
                await self._steps(served, call, read, emit)
            else:
                await emit(await self._encoded(served, call=call, read=read))

        await self._through(call, answer)

    async def _through(
        self, call: Call[R, T], answer: Callable[[ServedModel, R], Awaitable[A]]
    ) -> A:
        """``answer(served, read)`` for ``call``, its outcome counted once (see :meth:`infer`)."""
        served: ServedModel | None = None
        expires = _expiry(call.withdrawal)
        try:
            if call.model is not None:
                served = self._enter(call.model, call.version)
            started = time.perf_counter()
            if not self.registry.ready:
                raise BatcherClosed(call.model or call.protocol, "is stopping")
            read = await call.read()
            if served is None:
                assert call.named is not None, "a call names its model, or says how to read it"
                served = self._enter(call.named(read), None)
                started = time.perf_counter()
            answered = await answer(served, read)
        except asyncio.CancelledError:
            if call.withdrawal.cancel_counts_as is not None:
                status = _outcome(call.withdrawal.cancel_counts_as, expires)
                self.recorder.record(call.protocol, status, served)
            raise
        except Exception as exc:
            self.recorder.record(call.protocol, _outcome(error_status(exc).status, expires), served)
            raise
        finally:
            if served is not None:
                served.leave()
        self.recorder.record(call.protocol, Status.OK, served, time.perf_counter() - started)
        return answered

    async def _steps(
        self, served: ServedModel, call: Call[R, T], read: R, emit: Callable[[T], Awaitable[None]]
    ) -> None:
        """Each row's sequence (one, unless ``call.row_parameters`` lets a request carry
        several), run side by side: each output as response tensors, encoded with its row,
        emitted as it comes. The batcher is a :class:`~carpool.stepwise.StepServed` (or a
        front end's link to one)."""
        request = await self._decoded(served, call, read)
        admitted = await self.admissions.admit(served.model, request)
        each = call.row_parameters
        if admitted.rows != 1 and each is None:
            raise ProtocolError(
                f"a streamed request carries one sequence: got {admitted.rows} rows "
                "(send one request per sequence)",
                field="inputs",
            )
        model = served.model
        assert isinstance(model, StepwiseModel)
        assert model.response is not None
        steps: Any = served.batcher
        streams: list[Any] = []

        def cancel() -> None:
            for stream in streams:
                stream.cancel()

        try:
            for i in range(admitted.rows):
                row = {name: rows[i] for name, rows in admitted.value.items()}
                parameters = (
                    request.parameters if each is None else each(read, request.parameters, i)
                )
                streams.append(
                    steps.stream(
                        row, parameters, timeout_ms=admitted.timeout_ms, priority=admitted.priority
                    )
                )
            async with contextlib.aclosing(_merged(streams)) as merged:
                async for index, output in _unless(merged, call.withdrawal, cancel):
                    result = {k: np.expand_dims(v, 0) for k, v in model.response(output).items()}
                    outputs = respond(served.model, admitted, result)
                    answer = Answer(served, request, admitted, outputs, index)
                    await emit(call.encode(answer, read))
        finally:
            cancel()

    def _enter(self, name: str, version: str | None) -> ServedModel:
        """The model that serves ``name`` (``version``), this request now on its way through
        it (a reload waits for it). Raises :class:`ModelNotFound`, :class:`ModelUnavailable`."""
        served = self.registry.get(name, version)
        served.enter()
        return served

    async def _decoded(self, served: ServedModel, call: Call[R, T], read: R) -> InferRequest:
        """``read`` decoded for ``served``'s model: inline, or in a thread if it is large."""
        return await self.admissions.decode(call.size(read), call.decode, served.model, read)

    async def _encoded(self, served: ServedModel, read: R, *, call: Call[R, T]) -> T:
        cache = self.registry.cache
        if cache is not None and served.model.response_cache:
            return await self._from_cache(cache, served, call, read)
        request = await self._decoded(served, call, read)
        admitted = await self.admissions.admit(served.model, request)
        outputs = await _batched(served, admitted, call.withdrawal, request.parameters)
        answer = Answer(served, request, admitted, respond(served.model, admitted, outputs))
        return call.encode(answer, read)

    async def _from_cache(
        self, cache: ResponseCache, served: ServedModel, call: Call[R, T], read: R
    ) -> T:
        """``call``'s answer through ``cache``: replayed as it was sent the last time (with
        ``call.replay``), else decoded, answered by :meth:`_cached` and encoded, and kept
        encoded if the cache answered it."""
        replay = call.replay
        if replay is not None:
            parts = replay.parts(read)
            started = time.perf_counter()
            large = sum(len(part or b"") for part in parts) >= DECODE_OFFLOAD_BYTES
            replay_at = await self._key(replay_key, served, parts, large)
            replayed = cache.replayed(replay_at)
            if replayed is not None:
                served.cache_counts.hit(time.perf_counter() - started)
                kept: T = replayed.encoded
                return kept
        request = await self._decoded(served, call, read)
        answer, entry = await self._cached(cache, served, request, call.withdrawal)
        encoded = call.encode(answer, read)
        if replay is not None and entry is not None:  # seen before: kept encoded
            held = Replayed(served.name, encoded, entry)
            self._keep(cache, served, replay_at, held, REPLAY_OVERHEAD + replay.size(encoded))
        return encoded

    def _keep(
        self,
        cache: ResponseCache,
        served: ServedModel,
        key: bytes,
        held: Entry | Replayed,
        nbytes: int,
    ) -> None:
        """``held`` in ``cache`` under ``key``, unless ``served`` no longer serves (replaced
        or unloaded while this request ran: its answers were dropped then, and one kept now
        would outlive it unused)."""
        if self.registry.find(served.name) is served:
            cache.put(key, held, nbytes)

    async def _key(
        self, hashed: Callable[[str, int, Any], bytes], served: ServedModel, of: Any, large: bool
    ) -> bytes:
        """``hashed(name, generation, of)`` for ``served``: in a thread if ``large`` (hashing
        takes ~1 ms a MiB: not on the loop)."""
        if large:
            return await self.admissions.run(hashed, served.name, served.generation, of)
        return hashed(served.name, served.generation, of)

    async def _cached(
        self, cache: ResponseCache, served: ServedModel, request: InferRequest, w: Withdrawal
    ) -> tuple[Answer, bytes | None]:
        """``request``'s answer from ``cache``, from the identical request's computation in
        flight, or computed and stored (see docs/architecture.md); counted in
        ``served.cache_counts`` (a hit's seconds: its lookup's; a miss's: lookup and store).
        With it, its key if it was a hit, else None."""
        started = time.perf_counter()
        _, timeout_ms = scheduling(served.model, request)  # admission's 400s, even for a hit
        key = await self._key(request_key, served, request, reaches(request, DECODE_OFFLOAD_BYTES))
        entry = cache.get(key)
        if entry is not None:
            served.cache_counts.hit(time.perf_counter() - started)
        else:
            looked_up = time.perf_counter() - started
            compute = partial(self._compute, cache, served, request, key)
            (entry, stored), started_it = await _waited(
                self.flights.share(key, compute), w, timeout_ms
            )
            if started_it:
                served.cache_counts.miss(looked_up + stored)
                return Answer(served, request, entry.admitted, list(entry.outputs)), None
            served.cache_counts.hit(looked_up)
        return Answer(served, request, entry.admitted, list(entry.outputs)), key

    async def _compute(
        self,
        cache: ResponseCache,
        served: ServedModel,
        request: InferRequest,
        key: bytes,
    ) -> tuple[Entry, float]:
        """The shared computation of ``request``'s answer, stored under ``key``: the entry
        and the seconds storing it took. Under the model's queue timeout and the starter's
        priority, no caller's own limits: those bound each caller's wait (:func:`_waited`)."""
        model = served.model
        admitted = await self.admissions.admit(model, request)
        outputs = respond(
            model,
            admitted,
            await served.batcher.infer_many(
                admitted.value,
                timeout_ms=model.batching.default_timeout_ms,
                priority=admitted.priority,
            ),
        )
        started = time.perf_counter()
        keep = model.count_tokens is not None  # OpenAI's usage is counted from the inputs
        entry, nbytes = Entry.copied(
            served.name, admitted, outputs, keep_inputs=keep, limit=cache.max_bytes
        )
        self._keep(cache, served, key, entry, nbytes)
        return entry, time.perf_counter() - started


# A client's going this near its call's deadline (or past it) is the deadline's: a grpc
# client cancels at its own deadline, which the server's trails by the request's transit
# (2-5 ms measured on a loaded 2-core box).
_DEADLINE_SLACK_S = 0.05


def _expiry(withdrawal: Withdrawal) -> float | None:
    """When (``time.monotonic()``) a client's going starts to count as its deadline's."""
    if withdrawal.deadline_s is None:
        return None
    return time.monotonic() + withdrawal.deadline_s - _DEADLINE_SLACK_S


def _outcome(status: int, expires: float | None) -> int:
    """``status``, but a client's going (499) at or past its call's deadline is the
    deadline's (504): grpc cancels the call, and refuses its writes, once it passes."""
    if status == Status.CLIENT_CLOSED and expires is not None and time.monotonic() >= expires:
        return Status.GATEWAY_TIMEOUT
    return status


async def _batched(
    served: ServedModel,
    admitted: AdmittedRequest,
    withdrawal: Withdrawal,
    parameters: Parameters,
) -> Any:
    """``admitted``'s rows through the model's batcher: their outputs. Withdrawn (the
    batcher drops it if still queued) when the caller is cancelled, when the client goes
    (:class:`ClientGone`), or when the caller's deadline passes (a 504's kind)."""
    timeout_ms = admitted.timeout_ms
    deadline_ms = None
    if withdrawal.deadline_s is not None:
        deadline_ms = max(withdrawal.deadline_s * 1000.0, 1e-3)
        if timeout_ms is None or deadline_ms < timeout_ms:
            timeout_ms = deadline_ms  # the caller's deadline shortens the queue timeout
    if isinstance(served.model, StepwiseModel):  # each row's steps, answered whole
        steps: Any = served.batcher
        work = steps.infer_many(
            admitted.value, timeout_ms=timeout_ms, priority=admitted.priority, parameters=parameters
        )
    else:
        work = served.batcher.infer_many(
            admitted.value, timeout_ms=timeout_ms, priority=admitted.priority
        )
    try:
        if withdrawal.client_gone is None:
            return await work
        return await _unless_gone(work, withdrawal.client_gone)
    except DeadlineExceeded as exc:
        if deadline_ms is None or timeout_ms is not deadline_ms:
            raise  # the queue timeout's 503
        raise HTTPError(Status.GATEWAY_TIMEOUT, f"the call's deadline passed: {exc}") from None


async def _waited(work: Awaitable[T], withdrawal: Withdrawal, timeout_ms: float | None) -> T:
    """``work`` (a wait for a shared computation), within this request's own limits: until
    its client goes (:class:`ClientGone`), its ``timeout`` parameter's ``timeout_ms`` pass
    (as the queue timeout's 503: :class:`~carpool.errors.DeadlineExceeded`), or its call's
    deadline (a 504's kind). Either bounds the whole wait: the computation is shared, so no
    queue is this request's alone."""
    deadline_ms = None
    if withdrawal.deadline_s is not None:
        deadline_ms = max(withdrawal.deadline_s * 1000.0, 1e-3)
    if withdrawal.client_gone is not None:
        work = _unless_gone(work, withdrawal.client_gone)
    limits = [ms for ms in (timeout_ms, deadline_ms) if ms is not None]
    if not limits:  # no timer to set (one costs the wait a third more)
        return await work
    bound_ms = min(limits)
    try:
        async with asyncio.timeout(bound_ms / 1000.0) as bound:
            return await work
    except TimeoutError:
        if not bound.expired():
            raise  # the computation's own: the model's queue timeout
        if bound_ms == deadline_ms:
            raise HTTPError(
                Status.GATEWAY_TIMEOUT, "the call's deadline passed while its answer was computed"
            ) from None
        assert timeout_ms is not None
        raise DeadlineExceeded(timeout_ms=timeout_ms, stage="queued") from None


async def _unless_gone(work: Awaitable[T], client_gone: GoneSignal) -> T:
    """``work``'s result, awaited in the caller's own task; if the client goes first, that
    task is cancelled (so is ``work``, which withdraws the request) and :class:`ClientGone`
    raised instead. Another cancellation of the caller passes through as it came."""
    with _watched(client_gone):
        return await work


async def _unless(
    outputs: AsyncIterator[A], withdrawal: Withdrawal, cancel: Callable[[], None]
) -> AsyncIterator[A]:
    """``outputs`` until the client goes (:class:`ClientGone`, after ``cancel()``, which
    cancels its sequences: their slots are free at the next step)."""
    if withdrawal.client_gone is None:
        async for output in outputs:
            yield output
        return
    with _watched(withdrawal.client_gone, cancel):
        async for output in outputs:
            yield output


async def _merged(streams: list[Any]) -> AsyncGenerator[tuple[int, Any], None]:
    """Each stream's outputs with its index, as they come; the first error raised."""
    if len(streams) == 1:  # no task to interleave one
        async for output in streams[0]:
            yield 0, output
        return
    arrived: asyncio.Queue[tuple[int, Any, BaseException | None]] = asyncio.Queue()

    async def pump(index: int, stream: Any) -> None:
        try:
            async for output in stream:
                arrived.put_nowait((index, output, None))
        except Exception as exc:
            arrived.put_nowait((index, None, exc))
        else:
            arrived.put_nowait((index, _ENDED, None))

    pumps = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        left = len(streams)
        while left:
            index, output, error = await arrived.get()
            if error is not None:
                raise error
            if output is _ENDED:
                left -= 1
            else:
                yield index, output
    finally:
        for task in pumps:
            task.cancel()


@contextlib.contextmanager
def _watched(client_gone: GoneSignal, first: Callable[[], None] = lambda: None) -> Iterator[None]:
    """While inside: if the client goes, ``first()``, then the caller's task cancelled, and
    that cancellation raised as :class:`ClientGone`; any other passes through as it came."""
    task = asyncio.current_task()
    assert task is not None
    went = False

    def gone() -> None:
        nonlocal went
        if not went:
            went = True
            first()
            task.cancel()

    stop = client_gone(gone)
    try:
        yield
    except asyncio.CancelledError:
        if went and task.uncancel() == 0:
            raise ClientGone from None
        raise
    finally:
        stop()
