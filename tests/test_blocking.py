"""The thread bridge on its own: enter on a private loop, park, leave, join."""

from __future__ import annotations

import asyncio
import threading
from types import TracebackType

import pytest

from carpool.blocking import LoopThread


class Recorder:
    def __init__(self, fail_on_enter: bool = False) -> None:
        self.events: list[str] = []
        self.thread: int | None = None
        self.fail_on_enter = fail_on_enter

    async def __aenter__(self) -> Recorder:
        self.thread = threading.get_ident()
        asyncio.get_running_loop()
        if self.fail_on_enter:
            raise OSError("cannot start")
        self.events.append("enter")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.events.append("exit")


def test_enters_on_its_own_thread_and_exits_on_stop() -> None:
    target = Recorder()
    bridge = LoopThread(target, name="test-bridge")
    bridge.start()
    assert target.events == ["enter"]
    assert target.thread not in (None, threading.get_ident())
    bridge.stop()
    assert target.events == ["enter", "exit"]
    bridge.stop()  # idempotent


def test_an_error_while_entering_is_raised_in_the_caller() -> None:
    bridge = LoopThread(Recorder(fail_on_enter=True), name="test-bridge")
    with pytest.raises(OSError, match="cannot start"):
        bridge.start()
