"""A front-end process's models (``--frontends N``): their batchers are the main process's,
reached over the link. A front end runs the whole server (reading, keys, decoding, admission,
encoding, logging) and sends only admitted inputs, with deadline and priority; a cancelled
caller withdraws its request there. Its outcomes go to its shared slot (``tallies``)."""

from __future__ import annotations

import asyncio
import socket
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from carpool.engine.stats import BatcherStats, StatsRecorder
from carpool.errors import BatcherClosed
from carpool.loading import LoadFailure
from carpool.model import Model
from carpool.server.frontends.links import (
    CANCEL,
    ERROR,
    INFER,
    PING,
    PONG,
    QUERY,
    RESULT,
    SNAPSHOT,
    STATE,
    Link,
    Op,
)
from carpool.server.frontends.tallies import Tally
from carpool.server.lifecycle.registry import Registry, ServedModel, ServerCounts
from carpool.server.statuses import HTTPError, Status

__all__ = ["FrontEndRegistry", "RemoteBatcher", "Upstream"]

_QUERY_TIMEOUT_S = 5.0  # a statistics query the main process has not answered: a 503
_GONE = "lost the server's main process"


class Upstream:
    """A front end's end of its link to the main process. ``on_lost`` runs once the main
    process is gone: nothing is left to serve, so the front end ends."""

    def __init__(self, on_lost: Callable[[], None] = lambda: None) -> None:
        self.link = Link(self._ops, self._lost, self._refused)
        self.on_lost = on_lost
        self.workers: dict[str, int] = {}  # model -> workers alive, as the main process says
        self.pending: dict[int, asyncio.Future[Any]] = {}  # request id -> its answer
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
    ) -> tuple[dict[str, tuple[BatcherStats, dict[str, dict[int, int]], float]], Any]:
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
            elif kind == ERROR:
                answer = pending.pop(op[1], None)
                if answer is not None and not answer.done():
                    answer.set_exception(op[2])
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

    def _refused(self, op: Op, exc: Exception) -> None:
        answer = self.pending.pop(op[1], None)
        if answer is not None and not answer.done():
            answer.set_exception(exc)

    def _lost(self) -> None:
        self.workers = {}
        waiting = [*self.pending.values(), *self._queries.values()]
        self.pending.clear()
        for answer in waiting:
            if not answer.done():
                answer.set_exception(BatcherClosed("front end", _GONE))
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
        self, xs: Any, *, timeout_ms: float | None = None, priority: int = 0
    ) -> Any:
        upstream = self._upstream
        link = upstream.link
        if link.lost:
            raise BatcherClosed(self.name, _GONE)
        rid = upstream.next_id()
        answer = upstream.pending[rid] = asyncio.get_running_loop().create_future()
        op = (INFER, rid, self.name, timeout_ms, priority)
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


class _FrontEndModel(ServedModel):
    """A served model whose outcomes this front end counts in ``tally``, for the main
    process to sum; ``statuses`` and ``request_seconds`` hold every front end's, as of the
    last query."""

    def __init__(self, model: Model, upstream: Upstream, tally: Tally) -> None:
        assert model.name is not None  # ServedModel says so if not
        super().__init__(model, RemoteBatcher(model.name, upstream))
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
            stats, statuses, seconds = snapshot[served.name]
            assert isinstance(served.batcher, RemoteBatcher)
            served.batcher.snapshot = stats
            served.statuses = defaultdict(Counter, {p: Counter(c) for p, c in statuses.items()})
            served.request_seconds = seconds
