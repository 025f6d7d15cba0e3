"""carpool.transport: every batch structure and dtype survives plan -> write -> decode, views
alias the buffer and copies do not, arenas grow under a new name, messages cross a pipe."""

from __future__ import annotations

import errno
import multiprocessing
import os
import pickle
import subprocess
import threading
from typing import Any

import numpy as np
import pytest

from carpool.errors import SharedMemoryFull
from carpool.padding import PaddedBatch
from carpool.transport import (
    ALIGN,
    ARRAY,
    INLINE,
    MIN_ARENA,
    Arena,
    Attached,
    Channel,
    decode,
    plan,
    sweep_orphans,
)

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
    laid = plan(value)
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
    assert plan(array).tree[0] == ARRAY  # through the buffer, not pickled


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
    laid = plan(batch)
    assert len(laid.arrays) == 3  # the lengths go through the buffer too
    got = roundtrip(batch)
    assert type(got) is PaddedBatch
    assert_same(dict(got), dict(batch))
    assert np.array_equal(got.lengths, batch.lengths)


def test_object_arrays_and_plain_lists_travel_in_the_header() -> None:
    text = np.array(["a", "bb"], dtype=object)
    assert plan(text).tree == (INLINE, text)
    assert plan([1.0, 2.0]).tree == (INLINE, [1.0, 2.0])  # a list of numbers is one pickle
    assert plan(text).nbytes == 0


def test_containers_nest_two_deep_then_inline() -> None:
    a = np.ones(3)
    deep = {"a": ({"b": a},)}  # dict -> tuple -> dict: the inner dict is pickled whole
    laid = plan(deep)
    assert laid.nbytes == 0
    assert_same(roundtrip(deep), deep)


def test_empty_and_zero_dimensional_arrays() -> None:
    empty = np.zeros((0, 512), dtype=np.float32)
    scalar = np.array(4.5, dtype=np.float64)
    got = roundtrip({"e": empty, "s": scalar})
    assert_same(got, {"e": empty, "s": scalar})
    assert plan(empty).nbytes == 0


def test_offsets_are_aligned() -> None:
    batch = {"a": np.ones(3, np.int8), "b": np.ones(5, np.float64), "c": np.ones(1, np.int16)}
    laid = plan(batch)
    offsets = [offset for _, offset in laid.arrays]
    assert offsets == [0, ALIGN, 2 * ALIGN]
    assert laid.nbytes == 3 * ALIGN


def test_views_alias_the_buffer_and_copies_do_not() -> None:
    array = np.arange(6, dtype=np.int32)
    laid = plan(array)
    buf = np.zeros(laid.nbytes, np.uint8)
    laid.write(buf)
    view = decode(laid.tree, buf)
    copy = decode(laid.tree, buf, copy=True)
    plan(array * 10).write(buf)  # the next batch overwrites the buffer
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
        laid = plan(batch)
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
