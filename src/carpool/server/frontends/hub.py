"""The main process's end of the front ends' links (``--frontends N``): each request into its
model's one batcher and its answer back, with no task per request (a step-wise model's: one per
sequence). Statistics come from the front ends' shared tallies, so they never wait on a front
end; one silent for :data:`SILENT_S` (heartbeats every :data:`HEARTBEAT_S`) is killed and
replaced. How the front ends fit together: docs/architecture.md."""

from __future__ import annotations

import asyncio
import logging
import pickle
import socket
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any, cast

from carpool.engine.batcher import Batcher
from carpool.engine.stats import BatcherStats
from carpool.errors import BatcherClosed, CarpoolError
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
    pickled_error,
)
from carpool.server.frontends.tallies import Statuses, Tallies
from carpool.server.lifecycle.registry import Registry
from carpool.stepwise import StepServed

__all__ = ["HEARTBEAT_S", "SILENT_S", "Hub"]

log = logging.getLogger("carpool.server")
_WATCH_S = 0.1  # how often the workers' liveness is looked at, for the front ends' readiness
HEARTBEAT_S = 1.0  # how often each front end is asked whether its loop still turns
SILENT_S = 5.0  # a front end not heard from for this long is lost: killed and replaced
_clock = time.monotonic
_DUMPS = pickle.dumps
_PROTOCOL = pickle.HIGHEST_PROTOCOL


class _FrontEnd:
    __slots__ = ("heard", "index", "inflight", "link", "streams")

    def __init__(self, index: int) -> None:
        self.index = index
        self.link: Link | None = None
        self.inflight: dict[int, Callable[[], object]] = {}  # request id -> its withdrawal
        self.streams: dict[int, tuple[asyncio.Task[None], str]] = {}  # id -> (task, model)
        # When it last answered a heartbeat (monotonic); a new one has SILENT_S more, to start.
        self.heard = _clock() + SILENT_S


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
    """The links to the front ends, over the started batchers of ``registry``; the front
    ends count their answers in ``tallies``."""

    def __init__(self, registry: Registry, tallies: Tallies) -> None:
        self.registry = registry
        self.tallies = tallies
        self._front_ends: dict[int, _FrontEnd] = {}
        self._state: dict[str, int] = {}
        self._batchers: dict[str, Batcher | StepServed] = {}
        self._watch: asyncio.TimerHandle | None = None
        self._beat: asyncio.TimerHandle | None = None
        self._beat_at = 0.0  # when the last heartbeat went (monotonic)

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
        if self._beat is None:
            self._heartbeat()

    def close(self) -> None:
        """Close every link (the front ends see the main process gone) and stop watching."""
        if self._watch is not None:
            self._watch.cancel()
        if self._beat is not None:
            self._beat.cancel()
        for front_end in list(self._front_ends.values()):
            assert front_end.link is not None
            front_end.link.close()

    # ------------------------------------------------------------- from the front ends

    def _ops(self, front_end: _FrontEnd, ops: list[Op], values: list[Any]) -> None:
        for index, op in enumerate(ops):
            kind = op[0]
            if kind == INFER:
                self._infer(front_end, op, values[index])
            elif kind == STREAM:
                self._stream(front_end, op, values[index])
            elif kind == CANCEL:
                withdraw = front_end.inflight.pop(op[1], None)
                if withdraw is not None:
                    withdraw()
            elif kind == PONG:
                front_end.heard = _clock()
            elif kind == QUERY:
                assert front_end.link is not None
                front_end.link.post((SNAPSHOT, op[1], self.snapshot()))

    def _infer(self, front_end: _FrontEnd, op: Op, value: Any) -> None:
        _, rid, name, timeout_ms, priority, parameters = op
        answer = _Answer(front_end, rid)
        try:
            batcher = self._batchers.get(name) or self._batcher(name)
            if isinstance(batcher, StepServed):
                whole = batcher.infer_many(
                    value, timeout_ms=timeout_ms, priority=priority, parameters=parameters
                )
                task = asyncio.get_running_loop().create_task(_answered(whole, answer))
                front_end.inflight[rid] = task.cancel
                return
            withdraw = batcher.enqueue(value, answer, timeout_ms=timeout_ms, priority=priority)
        except Exception as exc:  # refused at admission: full, closing, overloaded
            answer.set_exception(exc)
            return
        front_end.inflight[rid] = withdraw

    def _stream(self, front_end: _FrontEnd, op: Op, row: Any) -> None:
        """A step-wise model's sequence for ``row``: each output sent as its step delivers
        it, then the end or the error; cancelled with the front end's CANCEL."""
        _, sid, name, timeout_ms, priority, parameters = op
        link = front_end.link
        assert link is not None
        try:
            batcher = self._batchers.get(name) or self._batcher(name)
            if not isinstance(batcher, StepServed):
                raise TypeError(f"model {name!r} is not step-wise: it has no stream")
            stream = batcher.stream(row, parameters, timeout_ms=timeout_ms, priority=priority)
        except Exception as exc:  # refused: its row, a full queue, closing
            link.post((ERROR, sid, pickled_error(exc)))
            return
        task = asyncio.get_running_loop().create_task(_forwarded(stream, sid, link))
        front_end.inflight[sid] = task.cancel
        front_end.streams[sid] = (task, name)
        task.add_done_callback(partial(_forgotten, front_end, sid))

    def end_streams(self) -> None:
        """End every stream with BatcherClosed (the drain's deadline passed): each front end
        sends its error and completes its answer, rather than being cut off."""
        for front_end in self._front_ends.values():
            link = front_end.link
            assert link is not None
            for sid, (task, name) in list(front_end.streams.items()):
                task.cancel()
                link.post((ERROR, sid, BatcherClosed(name, "is stopping")))

    def _unsendable(self, front_end: _FrontEnd, op: Op, exc: Exception) -> None:
        """The outputs of request ``op[1]`` cannot be sent (they do not pickle, or shared
        memory is full): its answer is the error."""
        assert front_end.link is not None
        error = exc
        if not isinstance(exc, CarpoolError):  # it did not pickle: say what did not
            error = TypeError(f"the model's outputs cannot be sent to the front end: {exc}")
        front_end.inflight.pop(op[1], None)
        front_end.link.post((ERROR, op[1], error))

    def _batcher(self, name: str) -> Batcher | StepServed:
        """Model ``name``'s batcher (the main process's are real ones, or a step-wise
        model's StepServed), remembered; raises as the registry does for a model it does
        not serve."""
        batcher = cast(Batcher | StepServed, self.registry.get(name).batcher)
        self._batchers[name] = batcher
        return batcher

    def _lost(self, front_end: _FrontEnd, lost: Callable[[int], None]) -> None:
        withdrawals = list(front_end.inflight.values())
        front_end.inflight.clear()
        for withdraw in withdrawals:  # nobody is left to answer
            withdraw()
        if self._front_ends.get(front_end.index) is front_end:
            del self._front_ends[front_end.index]
        lost(front_end.index)

    # ------------------------------------------------------------- liveness

    def _heartbeat(self) -> None:
        """Declare lost each front end silent for :data:`SILENT_S`, and ping the others."""
        now = _clock()
        on_time = now - self._beat_at < 2 * HEARTBEAT_S  # else this loop stalled: the
        self._beat_at = now  # answers may be waiting unread, so nobody is judged
        for front_end in list(self._front_ends.values()):
            link = front_end.link
            assert link is not None
            if on_time and now - front_end.heard > SILENT_S:
                log.warning(
                    "front end #%d answered no heartbeat for %gs: it is lost",
                    front_end.index,
                    SILENT_S,
                )
                link.close()  # its requests withdrawn; the main process kills it
            else:
                link.post((PING,))
        self._beat = asyncio.get_running_loop().call_later(HEARTBEAT_S, self._heartbeat)

    # ------------------------------------------------------------- statistics

    def snapshot(self) -> tuple[dict[str, tuple[Any, Statuses, float, Any]], Statuses]:
        """Every model's batcher statistics, its requests' outcomes and seconds summed over
        the front ends, live and ended, and a step-wise model's step statistics (else None);
        and the server's own answers, summed too."""
        counted, server = self.tallies.totals()
        models_now = {
            served.name: (
                _picklable(served.batcher.stats()),
                *counted.get(served.name, ({}, 0.0)),
                _steps(served.batcher),
            )
            for served in self.registry
        }
        return models_now, server

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


def _forgotten(front_end: _FrontEnd, sid: int, _: object) -> None:
    front_end.inflight.pop(sid, None)
    front_end.streams.pop(sid, None)


async def _answered(whole: Any, answer: _Answer) -> None:
    """A step-wise model's rows answered whole (``whole``), into ``answer``."""
    try:
        outputs = await whole
    except Exception as exc:
        answer.set_exception(exc)
    else:
        answer.set_result(outputs)


async def _forwarded(stream: Any, sid: int, link: Link) -> None:
    """Each output of ``stream`` onto ``link`` as it comes (pickled here, so that one that
    does not pickle ends its stream alone), then its end or its error."""
    try:
        with stream:
            async for output in stream:
                link.post((OUTPUT, sid, _DUMPS(output, _PROTOCOL)))
    except asyncio.CancelledError:
        return  # the front end cancelled it, or is gone: nobody waits for its end
    except Exception as exc:
        if not link.lost:
            link.post((ERROR, sid, pickled_error(exc)))
        return
    if not link.lost:
        link.post((END, sid))


def _steps(batcher: Any) -> tuple[Any, Any, int, Any] | None:
    """A step-wise model's step statistics, as a front end's metrics show them."""
    if not isinstance(batcher, StepServed):
        return None
    first, following = batcher.histograms.first_output, batcher.histograms.next_output
    return first.snapshot(), following.snapshot(), batcher.steps.active, batcher.steps.prefixes


def _picklable(stats: BatcherStats) -> BatcherStats:
    """``stats`` with plain dicts where it holds read-only views (which do not pickle)."""
    return replace(
        stats,
        batch_sizes=dict(stats.batch_sizes),
        dispatch_reasons=dict(stats.dispatch_reasons),
        batch_times=dict(stats.batch_times),
    )
