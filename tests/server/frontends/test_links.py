"""carpool.server.frontends.links: two ends over a real Unix socket pair on one loop. Values arrive
as private copies; one frame of values is in flight at a time and what waits goes in the
next frame together; bare ops never wait; a value that does not pickle is refused alone;
a closed end is lost on both sides and frees its shared memory."""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import threading
from typing import Any

import numpy as np
import pytest

from carpool.errors import SharedMemoryFull
from carpool.ipc.transport import MIN_ARENA, SHRINK_AFTER_S
from carpool.server.frontends import links
from carpool.server.frontends.links import Link, Op, pickled_error


class End:
    """A link end that records what reaches it."""

    def __init__(self) -> None:
        self.frames: list[tuple[list[Op], list[Any]]] = []
        self.lost = 0
        self.refused: list[tuple[Op, Exception]] = []
        self.arrived = asyncio.Event()
        self.link = Link(self._ops, self._lost, lambda op, exc: self.refused.append((op, exc)))

    def _ops(self, ops: list[Op], values: list[Any]) -> None:
        self.frames.append((ops, values))
        self.arrived.set()

    def _lost(self) -> None:
        self.lost += 1
        self.arrived.set()

    async def next(self) -> tuple[list[Op], list[Any]]:
        while not self.frames:
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), 5)
        return self.frames.pop(0)


async def pair() -> tuple[End, End]:
    loop = asyncio.get_running_loop()
    left, right = socket.socketpair()
    a, b = End(), End()
    await loop.create_unix_connection(lambda: a.link, sock=left)
    await loop.create_unix_connection(lambda: b.link, sock=right)
    return a, b


async def test_values_arrive_as_private_copies_with_their_ops() -> None:
    a, b = await pair()
    sent = {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "t": np.array([b"hi"], object)}
    a.link.post_value(("infer", 1), sent)
    a.link.post(("cancel", 7))
    ops, values = await b.next()
    assert ops == [("infer", 1), ("cancel", 7)]
    (got,) = values
    np.testing.assert_array_equal(got["x"], sent["x"])
    assert got["t"].tolist() == [b"hi"]
    assert got["x"].flags.writeable
    assert got["x"].base is not sent["x"]
    got["x"][:] = -1  # a private copy: the arena under it may be written again at once
    a.link.post_value(("infer", 2), {"x": np.ones((1, 3), np.float32)})
    ops, values = await b.next()
    assert ops == [("infer", 2)]
    assert values[0]["x"].tolist() == [[1, 1, 1]]
    a.link.close()
    b.link.close()


async def test_two_frames_of_values_fly_then_values_wait_together_and_bare_ops_never_wait() -> None:
    a, b = await pair()
    for value in (1.0, 2.0):  # one frame each: both arenas in flight, nothing TAKEN yet
        a.link.post_value(("v", value), np.full(2, value))
        await asyncio.sleep(0)
    a.link.post_value(("v", 3.0), np.full(2, 3.0))
    a.link.post_value(("v", 4.0), np.full(2, 4.0))
    a.link.post(("bare", 0))
    frames = [await b.next() for _ in range(4)]
    # The bare op left at once (with a WANT); b answered with its TAKEN alone, since it had
    # nothing else to send; then the two waiting values went in one frame.
    assert [ops for ops, _ in frames] == [
        [("v", 1.0)],
        [("v", 2.0)],
        [("bare", 0)],
        [("v", 3.0), ("v", 4.0)],
    ]
    assert [v.tolist() for v in frames[3][1]] == [[3.0, 3.0], [4.0, 4.0]]
    assert a.frames == []  # TAKEN and WANT are the link's own: never handed on
    a.link.close()
    b.link.close()


async def test_a_taken_rides_on_the_readers_own_traffic() -> None:
    a, b = await pair()
    for value in (1.0, 2.0):
        a.link.post_value(("v", value), np.full(1, value))
        await asyncio.sleep(0)
    await b.next()
    await b.next()
    b.link.post(("answer", 1))  # b's own op carries its TAKEN for both frames
    assert await a.next() == ([("answer", 1)], [])
    a.link.post_value(("v", 3.0), np.full(1, 3.0))
    a.link.post_value(("v", 4.0), np.full(1, 4.0))
    await asyncio.sleep(0)
    a.link.post_value(("v", 5.0), np.full(1, 5.0))
    frames = [await b.next() for _ in range(2)]
    assert [ops for ops, _ in frames] == [[("v", 3.0), ("v", 4.0)], [("v", 5.0)]]
    a.link.close()
    b.link.close()


async def test_a_value_waiting_may_be_withdrawn() -> None:
    a, b = await pair()
    first, second = ("v", 1), ("v", 2)
    a.link.post_value(first, np.zeros(1))
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # the first is in flight: the second waits for TAKEN
    a.link.post_value(second, np.ones(1))
    assert a.link.withdraw(second) is True
    assert a.link.withdraw(second) is False
    a.link.post(("bare", 1))
    assert [ops for ops, _ in [await b.next(), await b.next()]] == [[first], [("bare", 1)]]
    await asyncio.sleep(0.05)
    assert b.frames == []  # the withdrawn value never left
    a.link.close()
    b.link.close()


async def test_a_value_that_does_not_pickle_is_refused_alone() -> None:
    a, b = await pair()
    a.link.post_value(("v", 1), {"x": np.ones(1), "lock": threading.Lock()})
    a.link.post_value(("v", 2), {"x": np.full(1, 2.0)})
    ops, values = await b.next()
    assert ops == [("v", 2)]
    assert values[0]["x"].tolist() == [2.0]
    ((op, exc),) = a.refused
    assert op == ("v", 1)
    assert "pickle" in str(exc)
    a.link.close()
    b.link.close()


async def test_a_large_value_grows_the_arena() -> None:
    a, b = await pair()
    big = np.arange(1 << 19, dtype=np.float64)  # 4 MiB: more than the first arena
    a.link.post_value(("v", 1), np.zeros(4))
    assert (await b.next())[0] == [("v", 1)]
    a.link.post_value(("v", 2), big)
    ops, values = await b.next()
    assert ops == [("v", 2)]
    np.testing.assert_array_equal(values[0], big)
    a.link.close()
    b.link.close()


async def test_a_grown_arena_shrinks_back_once_its_size_goes_unneeded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [0.0]
    monkeypatch.setattr(links, "_clock", lambda: now[0])
    a, b = await pair()
    before = set(os.listdir("/dev/shm"))
    big = np.arange(1 << 20, dtype=np.float64)  # 8 MiB
    for step, value in enumerate([big, big, np.zeros(4), np.zeros(4)]):
        a.link.post_value(("v", step), value)  # two arenas, used in turn
        np.testing.assert_array_equal((await b.next())[1][0], value)
    grown = {
        name: os.stat(f"/dev/shm/{name}").st_size for name in set(os.listdir("/dev/shm")) - before
    }
    assert sorted(grown.values()) == [8 << 20, 8 << 20]  # each arena holds an 8 MiB frame
    now[0] = SHRINK_AFTER_S + 1  # and then none needs it for that long
    for step in range(4, 8):
        a.link.post_value(("v", step), np.full(4, step))
        assert (await b.next())[1][0].tolist() == [step] * 4
    small = {
        name: os.stat(f"/dev/shm/{name}").st_size for name in set(os.listdir("/dev/shm")) - before
    }
    assert set(small).isdisjoint(grown)  # new names: the large segments are unlinked
    assert sorted(small.values()) == [MIN_ARENA, MIN_ARENA]
    a.link.close()
    b.link.close()


async def test_closing_one_end_loses_both_and_unlinks_shared_memory() -> None:
    a, b = await pair()
    before = set(os.listdir("/dev/shm"))
    a.link.post_value(("v", 1), np.zeros(4))
    b.link.post_value(("v", 2), np.zeros(4))
    await b.next()
    await a.next()
    assert len(set(os.listdir("/dev/shm")) - before) == 2  # one arena each way
    a.link.close()
    while not b.lost:
        b.arrived.clear()
        await asyncio.wait_for(b.arrived.wait(), 5)
    assert (a.lost, b.lost) == (1, 1)
    assert a.link.lost
    assert b.link.lost
    assert set(os.listdir("/dev/shm")) - before == set()
    a.link.post(("late", 0))  # a lost link drops what is posted
    await asyncio.sleep(0.01)


def test_an_exception_that_does_not_pickle_becomes_a_runtime_error() -> None:
    class Local(Exception):
        pass

    kept = ValueError("bad row")
    assert pickled_error(kept) is kept
    changed = pickled_error(Local("boom"))
    assert type(changed) is RuntimeError
    assert str(changed) == "Local: boom"


async def test_values_that_find_shared_memory_full_are_refused_and_bare_ops_still_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b = await pair()

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    a.link.post_value(("v", 1), np.zeros(4))
    a.link.post_value(("v", 2), np.zeros(4))
    a.link.post(("bare", 0))
    assert await b.next() == ([("bare", 0)], [])
    assert [op for op, _ in a.refused] == [("v", 1), ("v", 2)]
    assert all(isinstance(exc, SharedMemoryFull) for _, exc in a.refused)
    monkeypatch.undo()  # room again: the link goes on
    a.link.post_value(("v", 3), np.ones(2))
    ops, values = await b.next()
    assert ops == [("v", 3)]
    assert values[0].tolist() == [1.0, 1.0]
    a.link.close()
    b.link.close()
