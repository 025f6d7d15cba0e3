"""The inference path: one request's life between its decoder and its encoder, for every
protocol. A front end hands :meth:`Inference.infer` its decode and encode steps and how the
request may be withdrawn; the path does readiness, decode, admit, batch (or the response
cache), respond, encode, and records the outcome under its model. Free of ASGI and grpc, so
front ends in other processes use it too. With the cache: docs/architecture.md."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeVar

from carpool.errors import BatcherClosed, DeadlineExceeded
from carpool.model import Model
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
from carpool.server.inference.outcomes import error_status
from carpool.server.inference.sharing import Flights
from carpool.server.lifecycle.registry import ModelNotFound, ModelUnavailable, Registry, ServedModel
from carpool.server.messages import InferRequest, OutputTensor
from carpool.server.statuses import HTTPError, Status

__all__ = ["Answer", "ClientGone", "GoneSignal", "Inference", "Replay", "Withdrawal"]

T = TypeVar("T")

# Called with what to run when the client goes (at most once); returns what stops watching.
GoneSignal = Callable[[Callable[[], None]], Callable[[], None]]


class ClientGone(HTTPError):
    """The client went away before its answer (counted as a 499): nobody is left to answer,
    and its request was withdrawn from the queue if it was still there."""

    def __init__(self) -> None:
        super().__init__(Status.CLIENT_CLOSED, "the client went away before its answer")


@dataclass(frozen=True, slots=True)
class Withdrawal:
    """How a request may be withdrawn before its answer; every field may be left out.

    ``client_gone``: a :data:`GoneSignal`, told what to run when the client goes (REST: its
    connection is lost); the request is then withdrawn and :class:`ClientGone` raised. A
    callback, not an awaitable: watching costs no task of its own.
    ``deadline_s``: the seconds the caller still waits (a gRPC call's deadline); it
    shortens the queue timeout, and its expiry is a 504's kind (gRPC's
    ``DEADLINE_EXCEEDED``), while the model's own queue timeout stays a 503.
    ``cancel_counts_as``: the status a cancellation of the caller's task is counted as
    (gRPC: a call the client cancelled, 499); None (REST, whose requests the server cancels
    only at the drain timeout and answers itself) counts nothing.
    """

    client_gone: GoneSignal | None = None
    deadline_s: float | None = None
    cancel_counts_as: int | None = None


NOT_WITHDRAWN = Withdrawal()


@dataclass(frozen=True, slots=True)
class Replay(Generic[T]):
    """How a front end lets the response cache answer a request repeated byte for byte
    with the answer it encoded the last time (see docs/architecture.md, the response cache).

    ``received()`` reads the request (after the readiness check, as ``decode`` would) and
    returns its parts as they came: every byte its encoded answer depends on, but the
    model (REST: the header-length and content-type headers, None if not sent, and the
    body); ``decode`` then decodes those bytes, not the client's again. ``size(encoded)``:
    the bytes an encoded answer holds, which the cache counts.
    """

    received: Callable[[], Awaitable[tuple[bytes | None, ...]]]
    size: Callable[[T], int]


@dataclass(frozen=True, slots=True, eq=False)
class Answer:
    """What a request's ``encode`` step gets: the request as decoded, as admitted, and its
    response tensors, each with whether to send it binary, in the order asked for.

    From the response cache, ``admitted`` is the identical request's that computed it, its
    ``value`` (the admitted inputs) kept only for a model that counts tokens, else empty.
    """

    served: ServedModel
    request: InferRequest
    admitted: AdmittedRequest
    outputs: list[tuple[OutputTensor, bool]]


class Inference:
    """The one inference path over the models of ``registry`` (see the module docstring);
    ``admissions`` admits its requests (by default, a pool of its own)."""

    def __init__(self, registry: Registry, admissions: Admissions | None = None) -> None:
        self.registry = registry
        self.admissions = admissions if admissions is not None else Admissions()
        self.server_counts = registry.server_counts  # the answers no model counts
        self.flights: Flights[tuple[Entry, float]] = Flights()  # cached models' computations

    async def infer(
        self,
        name: str,
        version: str | None,
        *,
        protocol: str,
        decode: Callable[[Model], Awaitable[InferRequest]],
        encode: Callable[[Answer], T],
        withdrawal: Withdrawal = NOT_WITHDRAWN,
        replay: Replay[T] | None = None,
    ) -> T:
        """One request to model ``name`` (``version``, or None for the served one), which
        came by ``protocol`` (a label in ``/metrics``): its encoded answer.

        ``decode`` reads the request for the model (after the readiness check, so a server
        that is stopping reads no body); ``encode`` turns the :class:`Answer` into what the
        front end sends; with ``replay``, a cached model's answers are also kept encoded
        (:class:`Replay`). Raises what the request ended in, already counted under its model:
        :class:`ClientGone`, a cancellation, or any exception
        :func:`~carpool.server.inference.outcomes.error_status` classifies; an unknown or
        unavailable
        model (:class:`~carpool.server.lifecycle.registry.ModelNotFound`,
        :class:`~carpool.server.lifecycle.registry.ModelUnavailable`) has no model to count it
        under,
        and is counted the server's (``registry.server_counts``).
        Whatever it returns or raises is counted, once.
        """
        try:
            served = self.registry.get(name, version)
        except (ModelNotFound, ModelUnavailable) as exc:
            self.server_counts.record(protocol, error_status(exc).status)
            raise
        served.enter()  # on its way through this version (a reload waits for it)
        started = time.perf_counter()
        try:
            encoded = await self._encoded(served, decode, encode, withdrawal, replay)
        except asyncio.CancelledError:
            if withdrawal.cancel_counts_as is not None:
                served.record(protocol, withdrawal.cancel_counts_as)
            raise
        except Exception as exc:
            served.record(protocol, error_status(exc).status)
            raise
        finally:
            served.leave()
        served.record(protocol, Status.OK, time.perf_counter() - started)
        return encoded

    async def _encoded(
        self,
        served: ServedModel,
        decode: Callable[[Model], Awaitable[InferRequest]],
        encode: Callable[[Answer], T],
        withdrawal: Withdrawal,
        replay: Replay[T] | None,
    ) -> T:
        if not self.registry.ready:
            raise BatcherClosed(served.name, "is stopping")
        cache = self.registry.cache
        if cache is None or not served.model.response_cache:
            request = await decode(served.model)
            admitted = await self.admissions.admit(served.model, request)
            outputs = await _batched(served, admitted, withdrawal)
            return encode(
                Answer(served, request, admitted, respond(served.model, admitted, outputs))
            )
        if replay is None:
            request = await decode(served.model)
            answer, _ = await self._cached(cache, served, request, withdrawal)
            return encode(answer)
        received = await replay.received()
        started = time.perf_counter()
        large = sum(len(part or b"") for part in received) >= DECODE_OFFLOAD_BYTES
        key = await self._key(replay_key, served, received, large)
        replayed = cache.replayed(key)
        if replayed is not None:
            served.cache_counts.hit(time.perf_counter() - started)
            encoded: T = replayed.encoded
            return encoded
        request = await decode(served.model)
        answer, entry = await self._cached(cache, served, request, withdrawal)
        encoded = encode(answer)
        if entry is not None:  # seen before: kept encoded (a request seen once is not)
            replayed = Replayed(served.name, encoded, entry)
            self._keep(cache, served, key, replayed, REPLAY_OVERHEAD + replay.size(encoded))
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


async def _batched(served: ServedModel, admitted: AdmittedRequest, withdrawal: Withdrawal) -> Any:
    """``admitted``'s rows through the model's batcher: their outputs. Withdrawn (the
    batcher drops it if still queued) when the caller is cancelled, when the client goes
    (:class:`ClientGone`), or when the caller's deadline passes (a 504's kind)."""
    timeout_ms = admitted.timeout_ms
    deadline_ms = None
    if withdrawal.deadline_s is not None:
        deadline_ms = max(withdrawal.deadline_s * 1000.0, 1e-3)
        if timeout_ms is None or deadline_ms < timeout_ms:
            timeout_ms = deadline_ms  # the caller's deadline shortens the queue timeout
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
    task = asyncio.current_task()
    assert task is not None
    went = False

    def gone() -> None:
        nonlocal went
        if not went:
            went = True
            task.cancel()

    stop = client_gone(gone)
    try:
        return await work
    except asyncio.CancelledError:
        if went and task.uncancel() == 0:
            raise ClientGone from None
        raise
    finally:
        stop()
