"""@carpool.batch: one item in, one result out; the function sees lists."""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import gc
import inspect
import pickle
import threading
from typing import Any, get_type_hints

import pytest

import carpool
from carpool.engine.options import DEFAULTS, BatcherOptions


async def test_async_function_callers_share_calls() -> None:
    calls: list[list[int]] = []

    @carpool.batch(max_batch_size=4)
    async def double(items: list[int]) -> list[int]:
        calls.append(items)
        return [i * 2 for i in items]

    results = await asyncio.gather(*(double(i) for i in range(10)))
    assert results == [i * 2 for i in range(10)]
    assert [len(c) for c in calls] == [4, 4, 2]
    assert all(isinstance(c, list) for c in calls)
    stats = double.batcher_stats()
    assert (stats.completed, stats.batches) == (10, 3)
    await double.aclose()
    assert double.__name__ == "double"


async def test_the_function_gets_a_list_even_for_arrays() -> None:
    import numpy as np

    seen: list[Any] = []

    @carpool.batch
    async def first_elements(items: list[Any]) -> list[Any]:
        seen.append(type(items))
        return [item[0] for item in items]

    out = await asyncio.gather(first_elements(np.arange(3)), first_elements(np.arange(5)))
    assert [int(o) for o in out] == [0, 0]
    assert seen == [list]  # arrays of different shapes still share one list
    await first_elements.aclose()


async def test_methods_get_one_batcher_per_instance() -> None:
    class Scaler:
        def __init__(self, factor: int) -> None:
            self.factor = factor
            self.calls = 0

        @carpool.batch(max_batch_size=8)
        async def scale(self, items: list[int]) -> list[int]:
            self.calls += 1
            return [i * self.factor for i in items]

    a, b = Scaler(2), Scaler(3)
    out = await asyncio.gather(*(a.scale(i) for i in range(3)), *(b.scale(i) for i in range(3)))
    assert out == [0, 2, 4, 0, 3, 6]
    assert (a.calls, b.calls) == (1, 1)
    assert a.scale is a.scale
    await a.scale.aclose()
    await b.scale.aclose()


def test_sync_function_batches_callers_from_many_threads() -> None:
    barrier = threading.Barrier(16)
    sizes: list[int] = []

    @carpool.batch(max_batch_size=16)
    def square(items: list[int]) -> list[int]:
        sizes.append(len(items))
        return [i * i for i in items]

    results: dict[int, int] = {}

    def caller(i: int) -> None:
        barrier.wait()
        results[i] = square(i)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: i * i for i in range(16)}
    assert sum(sizes) == 16
    stats = square.batcher_stats()
    assert (stats.completed, stats.failed) == (16, 0)
    square.close()
    square.close()  # idempotent


def test_errors_reach_only_their_caller() -> None:
    @carpool.batch(max_batch_size=8)
    def checked(items: list[int]) -> list[int]:
        if any(i < 0 for i in items):
            raise ValueError("negative")
        return items

    with pytest.raises(ValueError, match="negative"):
        checked(-1)
    assert checked(5) == 5
    checked.close()


def test_instances_are_not_kept_alive_by_their_batchers() -> None:
    class Model:
        @carpool.batch
        def run(self, items: list[int]) -> list[int]:
            return items

    model = Model()
    bound = model.run
    assert bound(1) == 1
    bound.close()
    ref = __import__("weakref").ref(model)
    del model, bound
    gc.collect()
    assert ref() is None


def test_decorating_starts_nothing_and_the_first_call_starts_the_batcher(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handlers: list[Any] = []  # exit handlers registered and not unregistered
    monkeypatch.setattr(atexit, "register", handlers.append)

    def unregister(fn: Any) -> None:  # like atexit's: every registration of fn goes, if any
        handlers[:] = [h for h in handlers if h != fn]

    monkeypatch.setattr(atexit, "unregister", unregister)
    before = set(threading.enumerate())  # threads of earlier tests may end meanwhile

    def started() -> set[threading.Thread]:
        return set(threading.enumerate()) - before

    @carpool.batch(max_batch_size=4)
    def double(items: list[int]) -> list[int]:
        return [i * 2 for i in items]

    assert (started(), handlers) == (set(), [])
    assert double.batcher_stats() is None
    assert double(3) == 6
    assert started()
    assert len(handlers) == 1  # its loop thread's: drains it at exit unless closed
    double.close()
    assert (started(), handlers) == (set(), [])


def test_options_are_checked_when_decorating() -> None:
    with pytest.raises(ValueError, match="max_batch_size must be >= 1"):
        carpool.batch(max_batch_size=0)
    with pytest.raises(TypeError, match="decorates a function"):
        carpool.batch()(3)


async def test_a_sync_function_called_on_an_event_loop_refuses_and_says_what_to_do() -> None:
    """Defect 2 of issue 10: it would block the loop until its batch ran, serialising every
    caller on that loop. It raises at once instead; from a thread it batches as usual."""

    @carpool.batch
    def double(items: list[int]) -> list[int]:
        return [2 * x for x in items]

    try:
        with pytest.raises(carpool.errors.BlockingCallOnLoop) as info:
            double(1)
        assert isinstance(info.value, RuntimeError)
        assert info.value.function == double.__qualname__
        assert str(info.value) == (
            f"{double.__qualname__}() is a synchronous @carpool.batch function called on the "
            "thread of a running event loop: it would block the loop until its batch ran, so "
            "callers on this loop would run one at a time, never sharing a batch. Make the "
            "function 'async def' and await it, or call it from a thread: "
            f"'await asyncio.to_thread({double.__name__}, item)'."
        )
        assert double.batcher_stats() is None  # refused before any batcher started
        outs = await asyncio.gather(*(asyncio.to_thread(double, i) for i in range(8)))
        assert outs == [2 * i for i in range(8)]
    finally:
        double.close()


def _tens(items: list[int]) -> list[int]:
    return [10 * i for i in items]


def test_a_batched_function_pickles_as_its_function_and_options_not_its_batchers() -> None:
    f = carpool.batch(max_batch_size=4, max_wait_ms=1.0)(_tens)
    assert f(2) == 20  # its batcher runs now, on its own thread
    g = pickle.loads(pickle.dumps(f))  # how Ray ships a decorated class to its replicas
    assert g is not f
    assert g.batcher_stats() is None  # no batcher came along
    assert g(3) == 30
    assert g.batcher_stats().completed == 1
    f.close()
    g.close()


def test_every_option_of_batch_is_the_batchers_with_its_default() -> None:
    options = {f.name: f for f in dataclasses.fields(BatcherOptions)}
    types = get_type_hints(BatcherOptions)
    given = dict(inspect.signature(carpool.batch).parameters)
    assert given.pop("fn").default is None
    assert list(given) == [
        "max_batch_size",
        "max_wait_ms",
        "policy",
        "max_queue_size",
        "workers",
        "isolate_errors",
    ]
    hints = get_type_hints(carpool.batch)
    for name, parameter in given.items():
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY
        assert parameter.default == options[name].default == getattr(DEFAULTS, name), name
        assert hints[name] == types[name], name
    assert carpool.batch(abs, workers=2)._options == {
        **{name: getattr(DEFAULTS, name) for name in given},
        "workers": 2,
    }
