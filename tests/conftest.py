"""Helpers shared by the engine's tests: models that hold their batches behind a gate, a way
to let the event loop settle, a cost model that already knows its line, and builders of the
values a policy sees. Import them: ``from conftest import Gate, settle``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from carpool.policies.adaptive import AdaptivePolicy

# Ray must stay on loopback (tests/e2e/test_ray_actors.py): with this set before ray is first
# imported, every node of a local cluster binds and advertises 127.0.0.1.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
from carpool.engine.stats import BatcherStats
from carpool.policies.base import Admission, Decision, QueueView
from carpool.policies.cost import CostCurve, CostModel

WAIT_S = 10.0  # a bound on waits that only a broken engine reaches


async def settle() -> None:
    """Let every ready callback run (admission, the scheduler) a few rounds."""
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.fixture(scope="session", autouse=True)
def _own_cache(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Caches (minilm's exported ONNX graphs) in this session's own folder, for every
    process it starts too: never the user's ``~/.cache``."""
    saved = os.environ.get("XDG_CACHE_HOME")
    folder = tmp_path_factory.getbasetemp() / "xdg-cache"  # test_minilm's own, the same
    folder.mkdir(exist_ok=True)
    os.environ["XDG_CACHE_HOME"] = str(folder)
    yield
    if saved is None:
        del os.environ["XDG_CACHE_HOME"]
    else:
        os.environ["XDG_CACHE_HOME"] = saved


def _link_installed_bytecode(prefix: Path) -> None:
    """Link the bytecode Python's own library and the installed packages already have into
    ``prefix``, where a process that reads its bytecode there looks for it: torch, ray,
    transformers and the rest are not compiled again in each session (torch alone: ~9 s of
    CPU). Python replaces a link it finds stale; it never writes through one."""
    tag = f".{sys.implementation.cache_tag}.pyc"
    paths = {sysconfig.get_path(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots = {p for p in paths if not any(p.startswith(q + os.sep) for q in paths)}
    for root in sorted(roots):
        for folder, _, files in os.walk(root):
            if not folder.endswith(f"{os.sep}__pycache__"):
                continue
            into = prefix / os.path.dirname(folder).lstrip(os.sep)
            for name in files:
                if name.endswith(tag) and ".opt-" not in name:
                    with contextlib.suppress(OSError):  # one compiled there meanwhile, say
                        into.mkdir(parents=True, exist_ok=True)
                        os.symlink(os.path.join(folder, name), into / name)


@pytest.fixture(scope="session", autouse=True)
def _own_bytecode(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Compiled modules kept in this session's own folder for every process it starts (its
    servers, workers, benchmarks): each compiles carpool once, not at every start, even where
    ``PYTHONDONTWRITEBYTECODE`` is set; nothing is written beside the sources. The installed
    packages' bytecode is linked in, by a thread, beside the first tests: a process that
    starts before it is done compiles what it lacks, as without it."""
    saved = {
        name: os.environ.get(name) for name in ("PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE")
    }
    prefix = tmp_path_factory.getbasetemp() / "pycache"
    os.environ["PYTHONPYCACHEPREFIX"] = str(prefix)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    linker = threading.Thread(target=_link_installed_bytecode, args=(prefix,), daemon=True)
    linker.start()
    yield
    linker.join()
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def rows(batch: Any) -> list[Any]:
    """A batch's rows as plain lists (or the rows themselves, when not arrays)."""
    return [row.tolist() if hasattr(row, "tolist") else row for row in batch]


def firsts(batch: Any) -> list[int]:
    """The first element of each row: how tests with ``np.array([i])`` rows name them."""
    return [int(v) for v in np.asarray(batch).reshape(len(batch), -1)[:, 0]]


def column(start: int, stop: int) -> np.ndarray:
    """Rows ``start .. stop - 1``, one element each: ``infer_many``'s input."""
    return np.arange(start, stop).reshape(-1, 1)


def times_ten(batch: Any) -> Any:
    return batch * 10


class Gate:
    """An async model that records each batch and blocks until released, then returns
    ``fn(batch)``; counts the batches inside it at once."""

    def __init__(self, fn: Callable[[Any], Any] | None = None) -> None:
        self.batches: list[Any] = []
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.running = 0
        self.max_running = 0
        self.fn = fn if fn is not None else (lambda batch: batch)

    async def __call__(self, batch: Any) -> Any:
        self.batches.append(batch)
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        self.entered.set()
        try:
            await self.release.wait()
        finally:
            self.running -= 1
        return self.fn(batch)

    def open(self) -> None:
        self.release.set()

    def columns(self) -> list[list[int]]:
        """Each batch as the first elements of its rows."""
        return [firsts(batch) for batch in self.batches]

    def values(self) -> list[int]:
        """Every row it saw, by its first element, sorted."""
        return sorted(v for batch in self.batches for v in firsts(batch))


class Turnstile:
    """An async model that holds each batch behind a gate of its own, opened by its index."""

    def __init__(self, fn: Callable[[Any], Any] | None = None) -> None:
        self.batches: list[list[int]] = []
        self.fn = fn if fn is not None else (lambda batch: batch)
        self._entered: list[asyncio.Event] = []
        self._release: list[asyncio.Event] = []

    @staticmethod
    def _event(events: list[asyncio.Event], index: int) -> asyncio.Event:
        while len(events) <= index:
            events.append(asyncio.Event())
        return events[index]

    async def __call__(self, batch: np.ndarray) -> Any:
        index = len(self.batches)
        self.batches.append(firsts(batch))
        self._event(self._entered, index).set()
        await self._event(self._release, index).wait()
        return self.fn(batch)

    async def entered(self, index: int) -> None:
        await self._event(self._entered, index).wait()

    def open(self, index: int) -> None:
        self._event(self._release, index).set()


class ThreadGate:
    """A plain model (run in the batcher's threads) that records every batch and holds each
    until :meth:`open`."""

    def __init__(self, fn: Callable[[Any], Any] | None = None) -> None:
        self.fn = fn if fn is not None else (lambda batch: batch)
        self.batches: list[Any] = []
        self._entered = threading.Event()
        self._release = threading.Event()

    def _enter(self, batch: Any) -> None:
        self.batches.append(batch)
        self._entered.set()

    async def entered(self) -> None:
        await asyncio.to_thread(self._entered.wait, WAIT_S)
        assert self._entered.is_set()

    def open(self) -> None:
        self._release.set()

    def __call__(self, batch: Any) -> Any:
        self._enter(batch)
        assert self._release.wait(WAIT_S)
        return self.fn(batch)


class AsyncGate(ThreadGate):
    """The same as an ``async def`` model, run on the loop; open it from the loop."""

    def __init__(self, fn: Callable[[Any], Any] | None = None) -> None:
        super().__init__(fn)
        self._opened = asyncio.Event()

    async def __call__(self, batch: Any) -> Any:  # type: ignore[override]
        self._enter(batch)
        await asyncio.wait_for(self._opened.wait(), WAIT_S)
        return self.fn(batch)

    def open(self) -> None:
        super().open()
        self._opened.set()


@pytest.fixture(params=["sync", "async"])
def gate_kind(request: pytest.FixtureRequest) -> type[ThreadGate]:
    """Both kinds of held model: a plain one in threads, an async one on the loop."""
    return ThreadGate if request.param == "sync" else AsyncGate


class FakeCost(CostModel):
    """A cost model that already knows its curves (by key; ``None`` for every other key) and
    learns nothing more; what it is told is kept in ``seen``."""

    def __init__(self, curves: Mapping[Hashable, CostCurve]) -> None:
        super().__init__()
        self.curves = dict(curves)
        self.seen: list[tuple[int, float, Hashable]] = []

    def observe(self, rows: int, seconds: float, key: Hashable = None) -> None:
        self.seen.append((rows, seconds, key))

    def curve(self, key: Hashable = None) -> CostCurve | None:
        return self.curves.get(key, self.curves.get(None))


LINE = CostCurve(0.010, 0.001, 1.0, samples=100)  # 10 ms a batch plus 1 ms a row
KEY = (np.ndarray, (1,), np.dtype(np.int64))  # the collation key of np.array([i])


def line() -> FakeCost:
    """A cost model that knows :data:`LINE` for every key."""
    return FakeCost({None: LINE})


def t(rows: int) -> float:
    """The fake's seconds for a batch of ``rows``, computed as the policy computes them."""
    return LINE.predict(rows)


class Spy(AdaptivePolicy):
    """The adaptive policy, recording what it was asked and what it answered."""

    def __init__(self, latency_slo_ms: float, *, cost: CostModel) -> None:
        super().__init__(latency_slo_ms, cost=cost)
        self.admitted: list[tuple[Admission, float, float | None]] = []
        self.views: list[tuple[QueueView, float, Decision]] = []

    def admit(self, request: Admission, now: float) -> float | None:
        late = super().admit(request, now)
        self.admitted.append((request, now, late))
        return late

    def decide(self, view: QueueView, now: float) -> Decision:
        decision = super().decide(view, now)
        self.views.append((view, now, decision))
        return decision


def accounted(stats: BatcherStats) -> None:
    """Every accepted request has exactly one outcome, and none is left pending."""
    done = stats.completed + stats.failed + stats.expired + stats.cancelled
    assert stats.submitted == done + stats.pending
    assert stats.pending == 0


def view(**changes: Any) -> QueueView:
    """One row queued at t=10.0; batches of up to 8 rows; a 5 ms window; one idle worker."""
    base = QueueView(
        queued_rows=1,
        head_rows=1,
        head_arrival=10.0,
        idle_workers=1,
        busy_workers=0,
        max_batch_size=8,
        max_wait=0.005,
    )
    return dataclasses.replace(base, **changes)


def admission(**changes: Any) -> Admission:
    """One row arriving at t=10.0 with a 50 ms deadline; nothing queued or running."""
    base = Admission(
        rows=1,
        deadline=10.05,
        rows_ahead=0,
        key=None,
        workers=1,
        max_batch_size=8,
        in_flight=(),
    )
    return dataclasses.replace(base, **changes)


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll ``condition`` (for what other processes do) until it holds; fail after
    ``timeout`` seconds, a bound only a broken engine reaches."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.01)


def replica_children(parent: int) -> set[int]:
    """PIDs of ``parent``'s live replica processes: spawned children running spawn_main
    (``carpool-worker ...`` in ``ps`` once setproctitle renamed them)."""
    found = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (proc / "cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError):
            continue
        replica = b"spawn_main" in cmdline or cmdline.startswith(b"carpool-worker ")
        if int(fields[1]) == parent and fields[0] != "Z" and replica:
            found.add(int(proc.name))
    return found


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting to be reaped is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
