"""The main process's end of the front ends' links (``carpool serve --frontends N``): each
request into its model's one batcher, each answer back, every front end's counts summed.

The main process serves no connection itself. It holds the batchers, and every front end
feeds the same one per model, so batches fill as they do behind a single front end. Its
work per request is what the batcher needs and no more: a future, admission, the answer
posted to the link (frames of many requests each way, :mod:`carpool.server.links`); no
task per request. A request's deadline, priority and cancellation cross with it.

The front ends count their own requests' outcomes (each model's, and the server's own
answers that no model counts). A query for statistics (``/metrics``,
``/v2/models/stats``, gRPC's ``ModelStatistics``) asks every other front end for its counts
first (``FLUSH``), so each front end's requests are counted once, in whichever front end
answers; a front end that ended leaves its last counts behind. Only asyncio and the links.
"""

from __future__ import annotations

import asyncio
import socket
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any, cast

from carpool.batcher import Batcher
from carpool.errors import CarpoolError
from carpool.server.links import (
    CANCEL,
    COUNTS,
    ERROR,
    FLUSH,
    INFER,
    QUERY,
    RESULT,
    SNAPSHOT,
    STATE,
    Link,
    Op,
    pickled_error,
)
from carpool.server.registry import Registry
from carpool.stats import BatcherStats

__all__ = ["Hub"]

# What a front end counted: each model's ({protocol: {status: requests}}, seconds), and the
# server's own answers that no model counts ({protocol: {status: requests}}).
Statuses = dict[str, dict[int, int]]
Counts = tuple[dict[str, tuple[Statuses, float]], Statuses]
_WATCH_S = 0.1  # how often the workers' liveness is looked at, for the front ends' readiness
_FLUSH_TIMEOUT_S = 1.0  # how long a query waits for a front end that does not answer


class _FrontEnd:
    __slots__ = ("counts", "index", "inflight", "link")

    def __init__(self, index: int) -> None:
        self.index = index
        self.link: Link | None = None
        self.inflight: dict[int, Callable[[], None]] = {}  # request id -> its withdrawal
        self.counts: Counts = ({}, {})


class _Query:
    __slots__ = ("asker", "qid", "timer", "waiting")

    def __init__(self, asker: _FrontEnd, qid: int, waiting: set[int]) -> None:
        self.asker = asker
        self.qid = qid
        self.waiting = waiting  # front ends whose counts it waits for
        self.timer: asyncio.TimerHandle | None = None


class _Answer:
    """Where the batcher puts one request's outcome: straight onto its front end's link
    (no asyncio future, no callback a turn later)."""

    __slots__ = ("front_end", "rid")

    def __init__(self, front_end: _FrontEnd, rid: int) -> None:
        self.front_end = front_end
        self.rid = rid

    def set_result(self, value: Any) -> None:
        front_end = self.front_end
        if front_end.inflight.pop(self.rid, None) is not None:
            front_end.link.post_value((RESULT, self.rid), value)  # type: ignore[union-attr]

    def set_exception(self, exc: BaseException) -> None:
        front_end = self.front_end
        front_end.inflight.pop(self.rid, None)
        if front_end.link is not None and not front_end.link.lost:
            front_end.link.post((ERROR, self.rid, pickled_error(exc)))


class Hub:
    """The links to the front ends, over the started batchers of ``registry``."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._front_ends: dict[int, _FrontEnd] = {}
        self._retired: list[Counts] = []  # the last counts of front ends that ended
        self._queries: list[_Query] = []
        self._state: dict[str, int] = {}
        self._batchers: dict[str, Batcher] = {}
        self._watch: asyncio.TimerHandle | None = None

    @property
    def front_ends(self) -> int:
        """Front ends linked now."""
        return len(self._front_ends)

    async def attach(self, index: int, sock: socket.socket, lost: Callable[[int], None]) -> None:
        """Serve front end ``index`` over ``sock``; ``lost(index)`` once its link ends."""
        front_end = _FrontEnd(index)
        link = Link(
            partial(self._ops, front_end),
            partial(self._lost, front_end, lost),
            partial(self._unsendable, front_end),
        )
        front_end.link = link
        await asyncio.get_running_loop().create_unix_connection(lambda: link, sock=sock)
        self._front_ends[index] = front_end
        link.post((STATE, self._workers()))
        if self._watch is None:
            self._watch_workers()

    def close(self) -> None:
        """Close every link (the front ends see the main process gone) and stop watching."""
        if self._watch is not None:
            self._watch.cancel()
        for front_end in list(self._front_ends.values()):
            assert front_end.link is not None
            front_end.link.close()

    # ------------------------------------------------------------- from the front ends

    def _ops(self, front_end: _FrontEnd, ops: list[Op], values: list[Any]) -> None:
        for index, op in enumerate(ops):
            kind = op[0]
            if kind == INFER:
                self._infer(front_end, op, values[index])
            elif kind == CANCEL:
                withdraw = front_end.inflight.pop(op[1], None)
                if withdraw is not None:
                    withdraw()
            elif kind == COUNTS:
                front_end.counts = op[1]
                self._counted(front_end.index)
            elif kind == QUERY:
                self._query(front_end, op[1])

    def _infer(self, front_end: _FrontEnd, op: Op, value: Any) -> None:
        _, rid, name, timeout_ms, priority = op
        answer = _Answer(front_end, rid)
        try:
            batcher = self._batchers.get(name) or self._batcher(name)
            withdraw = batcher.enqueue(value, answer, timeout_ms=timeout_ms, priority=priority)
        except Exception as exc:  # refused at admission: full, closing, overloaded
            answer.set_exception(exc)
            return
        front_end.inflight[rid] = withdraw

    def _unsendable(self, front_end: _FrontEnd, op: Op, exc: Exception) -> None:
        """The outputs of request ``op[1]`` cannot be sent (they do not pickle, or shared
        memory is full): its answer is the error."""
        assert front_end.link is not None
        error = exc
        if not isinstance(exc, CarpoolError):  # it did not pickle: say what did not
            error = TypeError(f"the model's outputs cannot be sent to the front end: {exc}")
        front_end.inflight.pop(op[1], None)
        front_end.link.post((ERROR, op[1], error))

    def _batcher(self, name: str) -> Batcher:
        """Model ``name``'s batcher (the main process's are real ones), remembered; raises
        as the registry does for a model it does not serve."""
        batcher = self._batchers[name] = cast(Batcher, self.registry.get(name).batcher)
        return batcher

    def _lost(self, front_end: _FrontEnd, lost: Callable[[int], None]) -> None:
        withdrawals = list(front_end.inflight.values())
        front_end.inflight.clear()
        for withdraw in withdrawals:  # nobody is left to answer
            withdraw()
        self._retired.append(front_end.counts)
        if self._front_ends.get(front_end.index) is front_end:
            del self._front_ends[front_end.index]
        self._counted(front_end.index)
        lost(front_end.index)

    # ------------------------------------------------------------- statistics

    def _query(self, asker: _FrontEnd, qid: int) -> None:
        others = {index for index, other in self._front_ends.items() if other is not asker}
        query = _Query(asker, qid, others)
        if not others:
            self._reply(query)
            return
        for index in others:
            link = self._front_ends[index].link
            assert link is not None
            link.post((FLUSH,))
        query.timer = asyncio.get_running_loop().call_later(_FLUSH_TIMEOUT_S, self._reply, query)
        self._queries.append(query)

    def _counted(self, index: int) -> None:
        for query in list(self._queries):
            query.waiting.discard(index)
            if not query.waiting:
                self._reply(query)

    def _reply(self, query: _Query) -> None:
        if query in self._queries:
            self._queries.remove(query)
        if query.timer is not None:
            query.timer.cancel()
        link = query.asker.link
        if link is not None and not link.lost:
            link.post((SNAPSHOT, query.qid, self.snapshot()))

    def snapshot(self) -> tuple[dict[str, tuple[Any, Statuses, float]], Statuses]:
        """Every model's batcher statistics, and its requests' outcomes and seconds summed
        over the front ends, live and ended; and the server's own answers, summed too."""
        statuses: defaultdict[str, defaultdict[str, Counter[int]]] = defaultdict(
            lambda: defaultdict(Counter)
        )
        seconds: defaultdict[str, float] = defaultdict(float)
        server: defaultdict[str, Counter[int]] = defaultdict(Counter)
        every = [f.counts for f in self._front_ends.values()] + self._retired
        for models, own in every:
            for name, (by_protocol, spent) in models.items():
                seconds[name] += spent
                for protocol, by_status in by_protocol.items():
                    statuses[name][protocol].update(by_status)
            for protocol, by_status in own.items():
                server[protocol].update(by_status)
        models_now = {
            served.name: (
                _picklable(served.batcher.stats()),
                {protocol: dict(counts) for protocol, counts in statuses[served.name].items()},
                seconds[served.name],
            )
            for served in self.registry
        }
        return models_now, {protocol: dict(counts) for protocol, counts in server.items()}

    # ------------------------------------------------------------- readiness

    def _workers(self) -> dict[str, int]:
        return {served.name: served.batcher.workers_alive for served in self.registry}

    def _watch_workers(self) -> None:
        """Tell the front ends when a model's workers come or go (their readiness)."""
        state = self._workers()
        if state != self._state:
            self._state = state
            for front_end in self._front_ends.values():
                assert front_end.link is not None
                front_end.link.post((STATE, state))
        self._watch = asyncio.get_running_loop().call_later(_WATCH_S, self._watch_workers)


def _picklable(stats: BatcherStats) -> BatcherStats:
    """``stats`` with plain dicts where it holds read-only views (which do not pickle)."""
    return replace(
        stats,
        batch_sizes=dict(stats.batch_sizes),
        dispatch_reasons=dict(stats.dispatch_reasons),
        batch_times=dict(stats.batch_times),
    )
