"""gRPC inference calls held back while more arrive, then let go together (:class:`Bursts`).
grpc.aio accepts one call per completion-queue round trip, so calls sent together would reach
the batcher 0.1-0.3 ms apart, each a batch of one. Held until calls stop coming
(``quiet_s``), ``max_burst`` wait or the first waited ``max_hold_s``; a lone call goes at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from types import TracebackType

__all__ = ["MAX_BURST", "MAX_HOLD_S", "QUIET_S", "Bursts"]

# A burst ends when no call came for this long: several times the 0.1-0.3 ms grpc.aio takes
# per call on a busy core, and the 1 ms resolution of uvloop's (and epoll's) timers.
QUIET_S = 0.001
# No call is held longer than this, however steadily calls keep coming: the latency a
# burst may add, a little more than grpc.aio takes to accept 32 calls (carpool's default
# batch) on a busy core.
MAX_HOLD_S = 0.008
# uvloop rounds a timer to whole milliseconds: a shorter one would fire at once, again and
# again, while a burst gathers.
_TICK_S = 0.001
# A burst this large goes at once: carpool serve's default max_batch_size (32) twice over.
MAX_BURST = 64


class Bursts:
    """Where inference calls wait for their burst; one per gRPC server, on its loop.

    ``max_burst`` (calls, >= 1), ``quiet_s`` and ``max_hold_s`` (seconds, >= 0) bound how
    long a call is held (see the module docstring). Each call enters :meth:`slot` for its
    whole life, so that a call alone is known to be alone."""

    def __init__(
        self,
        *,
        max_burst: int = MAX_BURST,
        quiet_s: float = QUIET_S,
        max_hold_s: float = MAX_HOLD_S,
    ) -> None:
        if max_burst < 1:
            raise ValueError(f"max_burst must be >= 1, got {max_burst}")
        if quiet_s < 0 or max_hold_s < 0:
            raise ValueError(f"quiet_s and max_hold_s must be >= 0, got {quiet_s}, {max_hold_s}")
        self._max_burst = max_burst
        self._quiet_s = quiet_s
        self._max_hold_s = max_hold_s
        self.in_flight = 0  # calls inside a slot
        self._held: list[asyncio.Future[None]] = []  # the burst being gathered
        self._timer: asyncio.TimerHandle | None = None  # ends it
        self._first = self._last = 0.0  # monotonic: its first and last arrivals

    def slot(self, *, may_wait: bool, withdrawn: Callable[[], None] | None = None) -> _Slot:
        """``async with bursts.slot(may_wait=...):`` a call's life; entering it waits for
        the call's burst when ``may_wait`` and other calls are in flight. ``withdrawn`` is
        called if the call is cancelled while it waits (so it can still be counted)."""
        return _Slot(self, may_wait, withdrawn)

    def _join(self) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        waiter = loop.create_future()
        self._held.append(waiter)
        self._last = now
        if len(self._held) >= self._max_burst:
            self._release()
        elif self._timer is None:
            self._first = now
            self._timer = loop.call_later(min(self._quiet_s, self._max_hold_s), self._due)
        return waiter

    def _due(self) -> None:
        self._timer = None
        now = time.monotonic()
        quiet_left = self._last + self._quiet_s - now
        hold_left = self._first + self._max_hold_s - now
        if quiet_left > 0 and hold_left > 0:  # calls still coming: look again then
            left = max(min(quiet_left, hold_left), _TICK_S)  # never a timer spinning at 0
            self._timer = asyncio.get_running_loop().call_later(left, self._due)
        else:
            self._release()

    def _release(self) -> None:
        """Let the burst go: its held calls resume in the next loop turn, together."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        held, self._held = self._held, []
        for waiter in held:
            if not waiter.done():  # a cancelled call's
                waiter.set_result(None)


class _Slot:
    """One call's place in :class:`Bursts` (an async context manager)."""

    __slots__ = ("_bursts", "_may_wait", "_withdrawn")

    def __init__(
        self, bursts: Bursts, may_wait: bool, withdrawn: Callable[[], None] | None
    ) -> None:
        self._bursts = bursts
        self._may_wait = may_wait
        self._withdrawn = withdrawn

    async def __aenter__(self) -> None:
        bursts = self._bursts
        bursts.in_flight += 1
        if self._may_wait and bursts.in_flight > 1:
            try:
                await bursts._join()
            except BaseException as exc:
                bursts.in_flight -= 1
                if isinstance(exc, asyncio.CancelledError) and self._withdrawn is not None:
                    self._withdrawn()
                raise

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._bursts.in_flight -= 1
