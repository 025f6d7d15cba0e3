"""carpool.ipc.transport: every batch structure and dtype survives lay_out -> write -> decode, views
alias the buffer and copies do not, arenas grow and shrink under a new name, messages cross a
pipe."""

from __future__ import annotations

import errno
import multiprocessing
import os
import pickle
import subprocess
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from carpool.collation.padding import PaddedBatch
from carpool.errors import SharedMemoryFull
from carpool.ipc.transport import (
    ALIGN,
    ARRAY,
    INLINE,
    MIN_ARENA,
    Arena,
    Attached,
    Channel,
    ShrinkPolicy,
    decode,
    extent,
    lay_out,
    sweep_orphans,
)

MiB = 1 << 20
SHM = Path("/dev/shm")

DTYPES = [
    "bool",
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    ">f4",  # big-endian, as some files store it
    "datetime64[ms]",
    "S5",  # fixed-width bytes live in shared memory too
    [("x", "<f4"), ("n", "<i2")],  # structured: the dtype object goes in the header
]


def roundtrip(value: Any, *, copy: bool = False) -> Any:
    laid = lay_out(value)
    buf = np.zeros(max(laid.nbytes, 1), np.uint8)
    laid.write(buf)
    return decode(laid.tree, buf, copy=copy)


def assert_same(got: Any, want: Any) -> None:
    assert type(got) is type(want)
    if isinstance(want, np.ndarray):
        assert got.dtype == want.dtype
        assert got.shape == want.shape
        assert np.array_equal(got, want, equal_nan=want.dtype.kind == "f")
    elif isinstance(want, dict):
        assert list(got) == list(want)
        for key in want:
            assert_same(got[key], want[key])
    elif isinstance(want, tuple | list):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_same(g, w)
    else:
        assert got == want


def sample(dtype: Any, shape: tuple[int, ...] = (4, 3)) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 100, size=shape)
    dt = np.dtype(dtype)
    if dt.fields is not None:
        out = np.zeros(shape, dt)
        out["x"], out["n"] = raw * 0.5, raw
        return out
    if dt.kind == "S":
        return raw.astype(str).astype(dt)
    if dt.kind == "M":
        return raw.astype(dt)
    return raw.astype(dt)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_roundtrips(dtype: Any) -> None:
    array = sample(dtype)
    assert_same(roundtrip(array), array)
    assert lay_out(array).tree[0] == ARRAY  # through the buffer, not pickled


def test_nan_and_inf_survive_bit_for_bit() -> None:
    array = np.array([[np.nan, np.inf, -np.inf, -0.0]], dtype=np.float16)
    got = roundtrip(array)
    assert got.tobytes() == array.tobytes()


@pytest.mark.parametrize(
    "view",
    [
        lambda a: a.T,  # transposed
        lambda a: a[::2, 1::3],  # strided
        lambda a: np.asfortranarray(a),
        lambda a: a[:, 5],  # one column
        lambda a: np.broadcast_to(a[0], (4, 12)),  # zero stride
    ],
    ids=["transposed", "strided", "fortran", "column", "broadcast"],
)
def test_non_contiguous_inputs_arrive_contiguous_and_equal(view: Any) -> None:
    array = view(np.arange(48, dtype=np.float32).reshape(4, 12))
    got = roundtrip(array)
    assert np.array_equal(got, array)
    assert got.flags.c_contiguous


def test_structures_roundtrip() -> None:
    a = sample("float32")
    ids = sample("int64", (2, 6))
    batch = {
        "ids": ids,
        "mask": ids > 50,
        "pair": (a, a[:1]),
        "list": [a, ids],
        "text": np.array([b"hi", b"there", "é".encode()], dtype=object),
        "scalar": 3.5,
        "name": "row",
        "none": None,
        "np_scalar": np.float32(2.0),
    }
    assert_same(roundtrip(batch), batch)
    assert_same(roundtrip((a, ids)), (a, ids))
    assert_same(roundtrip([a, {"k": ids}]), [a, {"k": ids}])
    assert_same(roundtrip(7), 7)


def test_a_padded_batch_keeps_its_class_and_lengths() -> None:
    batch = PaddedBatch(ids=np.ones((2, 5), np.int64), mask=np.ones((2, 5), bool))
    batch.lengths = np.array([[3], [5]])
    laid = lay_out(batch)
    assert len(laid.arrays) == 3  # the lengths go through the buffer too
    got = roundtrip(batch)
    assert type(got) is PaddedBatch
    assert_same(dict(got), dict(batch))
    assert np.array_equal(got.lengths, batch.lengths)


def test_object_arrays_and_plain_lists_travel_in_the_header() -> None:
    text = np.array(["a", "bb"], dtype=object)
    assert lay_out(text).tree == (INLINE, text)
    assert lay_out([1.0, 2.0]).tree == (INLINE, [1.0, 2.0])  # a list of numbers is one pickle
    assert lay_out(text).nbytes == 0


def test_containers_nest_two_deep_then_inline() -> None:
    a = np.ones(3)
    deep = {"a": ({"b": a},)}  # dict -> tuple -> dict: the inner dict is pickled whole
    laid = lay_out(deep)
    assert laid.nbytes == 0
    assert_same(roundtrip(deep), deep)


def test_empty_and_zero_dimensional_arrays() -> None:
    empty = np.zeros((0, 512), dtype=np.float32)
    scalar = np.array(4.5, dtype=np.float64)
    got = roundtrip({"e": empty, "s": scalar})
    assert_same(got, {"e": empty, "s": scalar})
    assert lay_out(empty).nbytes == 0


def test_offsets_are_aligned() -> None:
    batch = {"a": np.ones(3, np.int8), "b": np.ones(5, np.float64), "c": np.ones(1, np.int16)}
    laid = lay_out(batch)
    offsets = [offset for _, offset in laid.arrays]
    assert offsets == [0, ALIGN, 2 * ALIGN]
    assert laid.nbytes == 3 * ALIGN


def test_views_alias_the_buffer_and_copies_do_not() -> None:
    array = np.arange(6, dtype=np.int32)
    laid = lay_out(array)
    buf = np.zeros(laid.nbytes, np.uint8)
    laid.write(buf)
    view = decode(laid.tree, buf)
    copy = decode(laid.tree, buf, copy=True)
    lay_out(array * 10).write(buf)  # the next batch overwrites the buffer
    assert view.tolist() == [0, 10, 20, 30, 40, 50]
    assert copy.tolist() == [0, 1, 2, 3, 4, 5]


def test_arena_keeps_its_segment_while_batches_fit_and_grows_under_a_new_name() -> None:
    arena = Arena()
    reader = Attached()
    try:
        first = arena.name
        assert arena.size >= MIN_ARENA
        assert not arena.fit(MIN_ARENA)
        assert arena.name == first
        batch = np.arange(MIN_ARENA // 4 + 1000, dtype=np.float32)  # just over 1 MiB
        laid = lay_out(batch)
        assert arena.fit(laid.nbytes)
        assert arena.name != first
        assert arena.size >= laid.nbytes
        laid.write(arena.buf)
        got = decode(laid.tree, reader.buf(arena.name), copy=True)
        assert np.array_equal(got, batch)
        with pytest.raises(FileNotFoundError):
            Attached().buf(first)  # the old segment was unlinked
    finally:
        reader.close()
        arena.close()


def test_extent_is_what_plan_laid_out() -> None:
    a = sample("float32")
    record = np.zeros(3, dtype=[("x", "<i4"), ("y", "<f8")])  # its dtype travels as itself
    padded = PaddedBatch(ids=np.ones((2, 5), np.int64))
    padded.lengths = np.array([[3], [5]])
    for value in (
        a,
        {"a": a, "empty": np.zeros((0, 4)), "r": record, "s": 1.0},
        (a, [a[:1], a]),
        padded,
        np.array(4.5),
        np.array([b"x"], dtype=object),
        {"e": np.zeros((0, 4))},
    ):
        laid = lay_out(value)
        assert extent(laid.tree) == laid.nbytes


# The shrink policy, step by step: (nbytes, arena size, now) -> the size to remake it at.
# after_s=30, floor=1 MiB; a batch needs the arena when it takes more than a quarter of it.
SHRINK_STEPS = [
    (100, MiB, 0.0, None),  # at the floor: nothing to give back
    (8 * MiB, 8 * MiB, 1.0, None),  # needed: the clock starts at 1
    (100, 8 * MiB, 30.9, None),  # not needed, but only 29.9 s since
    (3 * MiB, 8 * MiB, 31.0, None),  # over a quarter: needed again at 31
    (MiB + MiB // 2, 8 * MiB, 35.0, None),  # under a quarter: the largest since
    (100, 8 * MiB, 60.9, None),
    (100, 8 * MiB, 61.0, 4 * MiB),  # 30 s unneeded: twice 1.5 MiB, rounded up to 4 MiB
    (MiB + MiB // 2, 4 * MiB, 62.0, None),  # the same batches need the smaller one: kept
    (MiB + MiB // 2, 4 * MiB, 500.0, None),  # however long they keep coming
    (100, 4 * MiB, 529.9, None),
    (100, 4 * MiB, 530.0, MiB),  # back to the floor
]


def test_the_shrink_policy_gives_back_room_unneeded_for_after_s_and_never_flaps() -> None:
    policy = ShrinkPolicy(after_s=30.0, floor=MiB)
    got = [policy.observe(nbytes, size, now) for nbytes, size, now, _ in SHRINK_STEPS]
    assert got == [want for *_, want in SHRINK_STEPS]


def test_the_shrink_policy_starts_its_clock_at_the_first_batch_it_sees() -> None:
    policy = ShrinkPolicy(after_s=30.0, floor=MiB)
    assert policy.observe(100, 16 * MiB, 1000.0) is None
    assert policy.observe(100, 16 * MiB, 1029.9) is None
    assert policy.observe(100, 16 * MiB, 1030.0) == MiB
    assert policy.observe(100, 16 * MiB, 1030.0) is None  # the clock restarted


def ours() -> dict[str, int]:
    """This process's segments in /dev/shm, and their sizes."""
    prefix = f"carpool_{os.getpid()}_"
    return {p.name: p.stat().st_size for p in SHM.iterdir() if p.name.startswith(prefix)}


def mapped() -> str:
    """This process's mappings (``/proc/self/maps``): where an unlinked segment still holds
    its pages."""
    return Path("/proc/self/maps").read_text()


def test_an_arena_shrinks_under_a_new_name_and_unlinks_the_large_segment() -> None:
    before = ours()
    arena = Arena(shrink=ShrinkPolicy(after_s=30.0))
    reader = Attached()
    try:
        assert arena.fit(8 * MiB, now=0.0)  # grows
        large = arena.name
        assert {n: s for n, s in ours().items() if n not in before} == {large: 8 * MiB}
        assert len(reader.buf(large)) == 8 * MiB
        batch = np.arange(25, dtype=np.float32)
        laid = lay_out(batch)
        assert not arena.fit(laid.nbytes, now=29.0)
        assert arena.fit(laid.nbytes, now=30.0)  # shrinks
        assert arena.size == MIN_ARENA
        assert {n: s for n, s in ours().items() if n not in before} == {arena.name: MIN_ARENA}
        laid.write(arena.buf)
        assert large in mapped()  # unlinked, but its pages stay while the reader maps it
        assert np.array_equal(decode(laid.tree, reader.buf(arena.name), copy=True), batch)
        assert large not in mapped()  # the header named the small one: it let go
    finally:
        reader.close()
        arena.close()
    assert ours() == before


def test_a_shrink_that_finds_dev_shm_full_keeps_the_arena_and_growth_still_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    arena = Arena(shrink=ShrinkPolicy(after_s=30.0))
    try:
        arena.fit(4 * MiB, now=0.0)
        large = arena.name
        with monkeypatch.context() as patched:
            patched.setattr(os, "posix_fallocate", full)
            assert not arena.fit(100, now=30.0)  # no room even for less: keeps what it has
            assert (arena.name, arena.size) == (large, 4 * MiB)
            with pytest.raises(SharedMemoryFull):
                arena.fit(16 * MiB, now=31.0)
            assert (arena.name, arena.size) == (large, 4 * MiB)
        assert not arena.fit(100, now=59.0)  # the policy waits after_s again
        assert arena.fit(100, now=61.0)
        assert arena.size == MIN_ARENA
        assert not (SHM / large).exists()
    finally:
        arena.close()


def test_messages_cross_a_channel_in_order_whatever_their_size() -> None:
    ours, ends = Channel.pair(multiprocessing.get_context("spawn"))
    theirs = Channel(*ends)
    try:
        message = ("run", ("psm_x", (ARRAY, "<f4", (32, 512), 0)), "psm_y")
        ours.send(message)
        assert theirs.poll(0)
        assert theirs.receive() == message
        assert not ours.poll(0)
        big = ("ok", (INLINE, "x" * 200_000))  # larger than a pipe's buffer: written in parts
        sender = threading.Thread(target=theirs.send, args=(big,))
        sender.start()
        assert ours.receive() == big
        sender.join()
    finally:
        theirs.close()
    with pytest.raises(EOFError):
        ours.receive()
    with pytest.raises(BrokenPipeError):
        ours.send(("stop",))
    ours.close()


def test_an_unpicklable_message_fails_before_anything_is_sent() -> None:
    ours, ends = Channel.pair(multiprocessing.get_context("spawn"))
    theirs = Channel(*ends)
    with pytest.raises((TypeError, AttributeError, pickle.PicklingError)):
        ours.send(("ok", (INLINE, lambda: None)))
    assert not theirs.poll(0)
    ours.close()
    theirs.close()


def test_a_segment_is_named_after_its_maker_and_a_dead_makers_are_swept(
    tmp_path: Any,
) -> None:
    arena = Arena()
    assert arena.name.startswith(f"carpool_{os.getpid()}_")
    dead = subprocess.Popen(["true"])
    dead.wait()  # reaped: its pid is free, nobody's (a reuse in between keeps the file)
    left = tmp_path / f"carpool_{dead.pid}_0123abcd"
    mine = tmp_path / f"carpool_{os.getpid()}_0123abcd"
    other = tmp_path / "psm_not_ours"
    for path in (left, mine, other):
        path.write_bytes(b"x")
    assert sweep_orphans(str(tmp_path)) == [left.name]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine.name, other.name])
    assert sweep_orphans(str(tmp_path / "missing")) == []
    arena.close()


def test_a_full_dev_shm_is_shared_memory_full_not_sigbus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    before = set(os.listdir("/dev/shm"))
    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(SharedMemoryFull) as info:
        Arena(1 << 22)
    assert info.value.needed == 1 << 22
    assert "give the server a larger /dev/shm" in str(info.value)
    assert set(os.listdir("/dev/shm")) == before  # the segment it could not fill is gone
    assert pickle.loads(pickle.dumps(info.value)).needed == 1 << 22
