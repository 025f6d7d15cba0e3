"""A front-end process's models (``--frontends N``): their batchers are the main process's,
reached over the link. A front end runs the whole server (reading, keys, decoding, admission,
encoding, logging) and sends only admitted inputs, with deadline and priority; a cancelled
caller withdraws its request there, a step-wise model's stream its sequence. Its outcomes go
to its shared slot (``tallies``)."""

from __future__ import annotations

import asyncio
import pickle
import socket
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from carpool.engine.stats import (
    LATENCY_BOUNDS,
    BatcherStats,
    Histogram,
    HistogramSnapshot,
    StatsRecorder,
)
from carpool.errors import BatcherClosed
from carpool.loading import LoadFailure
from carpool.model import Model
from carpool.server.frontends.links import (
    CANCEL,
    END,
    ERROR,
    INFER,
    OUTPUT,
    PING,
    PONG,
    QUERY,
    RESULT,
    SNAPSHOT,
    STATE,
    STREAM,
    Link,
    Op,
)
from carpool.server.frontends.tallies import Tally
from carpool.server.lifecycle.registry import Registry, ServedModel, ServerCounts
from carpool.server.statuses import HTTPError, Status
from carpool.steps.model import PrefixCounts
from carpool.stepwise import StepwiseModel

__all__ = ["FrontEndRegistry", "RemoteBatcher", "RemoteStepBatcher", "RemoteStream", "Upstream"]

_QUERY_TIMEOUT_S = 5.0  # a statistics query the main process has not answered: a 503
_GONE = "lost the server's main process"
_LOADS = pickle.loads


class Upstream:
    """A front end's end of its link to the main process. ``on_lost`` runs once the main
    process is gone: nothing is left to serve, so the front end ends."""

    def __init__(self, on_lost: Callable[[], None] = lambda: None) -> None:
        self.link = Link(self._ops, self._lost, self._refused)
        self.on_lost = on_lost
        self.workers: dict[str, int] = {}  # model -> workers alive, as the main process says
        self.pending: dict[int, asyncio.Future[Any]] = {}  # request id -> its answer
        self.streams: dict[int, RemoteStream] = {}  # stream id -> its outputs, until its end
        self._queries: dict[int, asyncio.Future[Any]] = {}
        self._ids = 0
        self._state: asyncio.Future[None] | None = None

    async def connect(self, sock: socket.socket) -> None:
        """Link up over ``sock`` and wait for the main process's first word on the
        workers, so that readiness is known from the start."""
        loop = asyncio.get_running_loop()
        self._state = loop.create_future()
        await loop.create_unix_connection(lambda: self.link, sock=sock)
        await self._state

    def next_id(self) -> int:
        self._ids += 1
        return self._ids

    async def query(
        self,
    ) -> tuple[dict[str, tuple[BatcherStats, dict[str, dict[int, int]], float, Any]], Any]:
        """Every model's statistics and every front end's counts, from the main process:
        the models', and the server's own ({protocol: {status: answers}})."""
        if self.link.lost:
            raise HTTPError(Status.UNAVAILABLE, f"this front end {_GONE}")
        qid = self.next_id()
        answer = self._queries[qid] = asyncio.get_running_loop().create_future()
        self.link.post((QUERY, qid))
        try:
            async with asyncio.timeout(_QUERY_TIMEOUT_S):
                return await answer  # type: ignore[no-any-return]
        except TimeoutError:
            raise HTTPError(
                Status.UNAVAILABLE, "the server's main process did not answer in time"
            ) from None
        finally:
            self._queries.pop(qid, None)

    def _ops(self, ops: list[Op], values: list[Any]) -> None:
        pending = self.pending
        for index, op in enumerate(ops):
            kind = op[0]
            if kind == RESULT:
                answer = pending.pop(op[1], None)
                if answer is not None and not answer.done():
                    answer.set_result(values[index])
            elif kind == OUTPUT:
                self._output(op[1], op[2])
            elif kind == END:
                self._ended(op[1], None)
            elif kind == ERROR:
                self._ended(op[1], op[2])
            elif kind == STATE:
                self.workers = op[1]
                if self._state is not None and not self._state.done():
                    self._state.set_result(None)
            elif kind == SNAPSHOT:
                query = self._queries.get(op[1])
                if query is not None and not query.done():
                    query.set_result(op[2])
            elif kind == PING:  # the main process asks whether this loop still turns
                self.link.post((PONG,))

    def _output(self, sid: int, pickled: bytes) -> None:
        stream = self.streams.get(sid)
        if stream is not None:  # else cancelled here: the main process is told so
            stream.put(_LOADS(pickled))

    def _ended(self, rid: int, error: BaseException | None) -> None:
        """Request ``rid`` failed with ``error``, or stream ``rid`` ended (finished if
        ``error`` is None)."""
        answer = self.pending.pop(rid, None)
        if answer is not None:
            if error is not None and not answer.done():
                answer.set_exception(error)
            return
        stream = self.streams.pop(rid, None)
        if stream is not None:
            stream.end(error)

    def _refused(self, op: Op, exc: Exception) -> None:
        self._ended(op[1], exc)

    def _lost(self) -> None:
        self.workers = {}
        waiting = [*self.pending.values(), *self._queries.values()]
        self.pending.clear()
        for answer in waiting:
            if not answer.done():
                answer.set_exception(BatcherClosed("front end", _GONE))
        streams = list(self.streams.values())
        self.streams.clear()
        for stream in streams:
            stream.end(BatcherClosed("front end", _GONE))
        if self._state is not None and not self._state.done():
            self._state.set_exception(BatcherClosed("front end", _GONE))
        self.on_lost()


class RemoteBatcher:
    """A model's batcher as a front end sees it: the one in the main process."""

    def __init__(self, name: str, upstream: Upstream) -> None:
        self.name = name
        self._upstream = upstream
        self.snapshot: BatcherStats = StatsRecorder().snapshot(0, 0)  # as of the last query

    async def __aenter__(self) -> RemoteBatcher:
        return self

    async def aclose(self, *, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Nothing to close: the main process closes the batcher, after the front ends."""

    async def infer_many(
        self,
        xs: Any,
        *,
        timeout_ms: float | None = None,
        priority: int = 0,
        parameters: Mapping[str, Any] | None = None,
    ) -> Any:
        """``xs``' outputs from the main process's batcher; ``parameters`` are a step-wise
        model's (its ``request`` reads them)."""
        upstream = self._upstream
        link = upstream.link
        if link.lost:
            raise BatcherClosed(self.name, _GONE)
        rid = upstream.next_id()
        answer = upstream.pending[rid] = asyncio.get_running_loop().create_future()
        op = (INFER, rid, self.name, timeout_ms, priority, _plain(parameters))
        link.post_value(op, xs)
        try:
            return await answer
        except asyncio.CancelledError:
            if upstream.pending.pop(rid, None) is not None and not link.withdraw(op):
                link.post((CANCEL, rid))  # it left already: the main process withdraws it
            raise

    def stats(self) -> BatcherStats:
        return self.snapshot

    def learned(self) -> str:
        return "learned in the main process"

    @property
    def workers_alive(self) -> int:
        return self._upstream.workers.get(self.name, 0)


class RemoteStepBatcher(RemoteBatcher):
    """A step-wise model's batcher as a front end sees it: its rows answered whole, or a
    row's steps streamed from the main process; ``histograms`` and ``steps`` show the
    main process's step statistics, as of the last query (as a StepServed's do)."""

    def __init__(self, name: str, upstream: Upstream, max_sequences: int) -> None:
        super().__init__(name, upstream)
        self.histograms = _ShownHistograms()
        self.steps = _ShownSteps(max_sequences)

    def stream(
        self,
        row: Mapping[str, Any],
        parameters: Mapping[str, Any],
        *,
        timeout_ms: float | None = None,
        priority: int = 0,
    ) -> RemoteStream:
        """One row's sequence, run in the main process: its outputs as they come. A row or
        parameter the model refuses is raised by the first iteration, as a ProtocolError."""
        upstream = self._upstream
        sid = upstream.next_id()
        op = (STREAM, sid, self.name, timeout_ms, priority, _plain(parameters))
        stream = RemoteStream(upstream, op)
        if upstream.link.lost:
            stream.end(BatcherClosed(self.name, _GONE))
            return stream
        upstream.streams[sid] = stream
        upstream.link.post_value(op, dict(row))
        return stream


class _ShownHistograms:
    def __init__(self) -> None:
        self.first_output = _Shown()
        self.next_output = _Shown()


class _Shown:
    """A histogram of the main process's, as of the last query."""

    def __init__(self) -> None:
        self.shown = Histogram(LATENCY_BOUNDS).snapshot()

    def snapshot(self) -> HistogramSnapshot:
        return self.shown


class _ShownSteps:
    def __init__(self, max_sequences: int) -> None:
        self.max_sequences = max_sequences
        self.active = 0
        self.prefixes: PrefixCounts | None = None


class RemoteStream:
    """A sequence's outputs, sent by the main process as its steps deliver them; the
    interface of :class:`~carpool.steps.stream.Stream` the server uses. ``cancel()``, or
    leaving ``with stream:``, ends the sequence there (its slot is free at its next step)."""

    def __init__(self, upstream: Upstream, op: Op) -> None:
        self._upstream = upstream
        self._op = op
        self._items: deque[Any] = deque()
        self._ended = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    @property
    def id(self) -> int:
        return int(self._op[1])

    def put(self, output: Any) -> None:
        """One output, from the link."""
        self._items.append(output)
        self._wake()

    def end(self, error: BaseException | None) -> None:
        """The sequence ended: finished (``None``) or failed with ``error``."""
        if not self._ended:
            self._ended = True
            self._error = error
            self._wake()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def cancel(self) -> None:
        if self._ended:
            return
        self.end(None)
        upstream = self._upstream
        if upstream.streams.pop(self.id, None) is not None and not upstream.link.withdraw(self._op):
            upstream.link.post((CANCEL, self.id))  # it left already: the main process cancels it

    def __enter__(self) -> RemoteStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()

    async def __aenter__(self) -> RemoteStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cancel()

    def __aiter__(self) -> RemoteStream:
        return self

    async def __anext__(self) -> Any:
        while not self._items:
            if self._ended:
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            except asyncio.CancelledError:
                self.cancel()
                raise
        return self._items.popleft()

    async def collect(self) -> list[Any]:
        """Every output, once the sequence ends (its error raised if it fails)."""
        return [item async for item in self]


def _plain(parameters: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if parameters is None else dict(parameters)


class _FrontEndModel(ServedModel):
    """A served model whose outcomes this front end counts in ``tally``, for the main
    process to sum; ``statuses`` and ``request_seconds`` hold every front end's, as of the
    last query."""

    def __init__(self, model: Model, upstream: Upstream, tally: Tally) -> None:
        assert model.name is not None  # ServedModel says so if not
        batcher = RemoteBatcher(model.name, upstream)
        if isinstance(model, StepwiseModel):
            batcher = RemoteStepBatcher(model.name, upstream, model.max_sequences)
        super().__init__(model, batcher)
        self._tally = tally

    def record(self, protocol: str, status: int, seconds: float = 0.0) -> None:
        self._tally.record(self.name, protocol, status, seconds)


class _FrontEndServerCounts(ServerCounts):
    """The server's own answers, counted in ``tally``; ``shown`` holds every front end's,
    as of the last query."""

    def __init__(self, tally: Tally) -> None:
        super().__init__()
        self._tally = tally
        self.shown = {}

    def record(self, protocol: str, status: int) -> None:
        self._tally.record(None, protocol, status)


class FrontEndRegistry(Registry):
    """The models of a front-end process: ``models`` less the ones that failed in the main
    process (among ``load_failures``), each behind ``upstream``; their answers counted in
    ``tally``, this front end's slot."""

    local = False

    def __init__(
        self,
        models: Sequence[Model],
        load_failures: Sequence[LoadFailure],
        upstream: Upstream,
        link: socket.socket,
        tally: Tally,
    ) -> None:
        failed = {failure.name for failure in load_failures}
        kept = [model for model in models if model.name not in failed]
        serve = partial(_FrontEndModel, upstream=upstream, tally=tally)
        super().__init__(kept, load_failures, serve=serve)
        self.server_counts = _FrontEndServerCounts(tally)
        self._upstream = upstream
        self._link = link
        self._tally = tally

    async def start(self) -> list[ServedModel]:
        """Link up with the main process, whose batchers are started already."""
        await self._upstream.connect(self._link)
        return list(self)

    async def close(self, started: Sequence[ServedModel], *, timeout: float) -> None:  # noqa: ASYNC109
        """Close the link: its requests are answered (the server drained them first), and
        its shared memory is freed; what it counted is in its slot (they were sent). The
        main process closes the batchers."""
        self._tally.commit()
        self._upstream.link.close()

    async def refresh(self) -> None:
        snapshot, server = await self._upstream.query()
        self.server_counts.shown = server
        for served in self:
            if served.name not in snapshot:
                continue
            stats, statuses, seconds, steps = snapshot[served.name]
            batcher = served.batcher
            assert isinstance(batcher, RemoteBatcher)
            batcher.snapshot = stats
            if steps is not None and isinstance(batcher, RemoteStepBatcher):
                first, following, batcher.steps.active, batcher.steps.prefixes = steps
                batcher.histograms.first_output.shown = first
                batcher.histograms.next_output.shown = following
            served.statuses = defaultdict(Counter, {p: Counter(c) for p, c in statuses.items()})
            served.request_seconds = seconds
