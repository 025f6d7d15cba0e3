"""Model control in process: loads, reloads, unloads and polls against a real registry,
real batchers and a model repository on disk (the routes: test_model_control.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from carpool.loading import Catalog
from carpool.server.inference.call import Answer, Call
from carpool.server.inference.path import Inference
from carpool.server.lifecycle.control import ControlUnavailable, LoadFailed, ModelControl, act
from carpool.server.lifecycle.registry import ModelNotFound, Registry
from carpool.server.messages import InferInput, InferRequest

GATED = """\
import pathlib, time
GATE = pathlib.Path({gate!r})
def model(x):
    while not GATE.exists():
        time.sleep(0.002)
    return x + {offset}
"""


def write(repository: Path, name: str, offset: int, gate: Path | None = None) -> None:
    folder = repository / name
    folder.mkdir(parents=True, exist_ok=True)
    code = f"def model(x):\n    return x + {offset}\n"
    if gate is not None:
        code = GATED.format(gate=str(gate), offset=offset)
    (folder / "model.py").write_text(code)


def request(value: float) -> InferRequest:
    data = np.full((1, 2), value, np.float32)
    return InferRequest(None, {}, (InferInput("INPUT0", "FP32", (1, 2), data, {}),), None, False)


async def infer(inference: Inference, name: str, value: float) -> float:
    async def read() -> bytes:
        return b""

    def decode(model: Any, read: bytes) -> InferRequest:
        return request(value)

    def encode(answer: Answer, read: bytes) -> float:
        return float(answer.outputs[0][0].data[0, 0])

    call = Call(protocol="http", model=name, read=read, decode=decode, encode=encode)
    return await inference.infer(call)


async def until(condition: Callable[[], bool]) -> None:
    """Wait, a loop turn at a time, for what another task or thread brings about."""
    async with asyncio.timeout(30):
        while not condition():  # noqa: ASYNC110 - a state of the registry, not an event
            await asyncio.sleep(0.005)


class Setup:
    def __init__(self, repository: Path, mode: str = "explicit", loaded: tuple[str, ...] = ()):
        self.catalog = Catalog([str(repository)])
        self.registry = Registry(self.catalog.load_some(loaded))
        self.control = ModelControl(
            self.registry, self.catalog, mode=mode, poll_s=3600, drain_timeout_s=10
        )
        self.inference = Inference(self.registry)

    async def __aenter__(self) -> Setup:
        await self.registry.start()
        self.registry.ready = True
        self.control.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.control.close()
        await self.registry.close(list(self.registry), timeout=5)
        self.inference.admissions.close()

    def state(self, name: str) -> dict[str, str]:
        return next(e for e in self.registry.index() if e["name"] == name)


async def test_load_serves_and_unload_stops_a_model(tmp_path: Path) -> None:
    write(tmp_path, "a", 1)
    write(tmp_path, "b", 2)
    async with Setup(tmp_path, loaded=("a",)) as s:
        assert s.registry.index() == [
            {"name": "a", "version": "1", "state": "READY", "reason": ""},
            {"name": "b"},
        ]
        await s.control.load("b")
        assert await infer(s.inference, "b", 1.0) == 3.0
        served = s.registry.get("b")
        await s.control.unload("b")
        assert s.state("b") == {
            "name": "b",
            "version": "1",
            "state": "UNAVAILABLE",
            "reason": "unloaded",
        }
        assert "closed" in repr(served.batcher)
        with pytest.raises(ModelNotFound, match="Request for unknown model: 'b' is not found"):
            await infer(s.inference, "b", 1.0)
        assert await infer(s.inference, "a", 1.0) == 2.0  # the other model never noticed
        await s.control.unload("b")  # again: nothing to do
        await s.control.load("b")
        assert await infer(s.inference, "b", 1.0) == 3.0


async def test_no_request_fails_while_a_model_reloads_again_and_again(tmp_path: Path) -> None:
    write(tmp_path, "a", 1)
    async with Setup(tmp_path, loaded=("a",)) as s:
        stop = asyncio.Event()
        answers: list[float] = []

        async def client() -> None:
            while not stop.is_set():
                answers.append(await infer(s.inference, "a", 0.0))

        async with asyncio.TaskGroup() as group:
            for _ in range(16):
                group.create_task(client())
            for offset in (2, 3, 4, 5, 6):
                await asyncio.sleep(0.02)
                write(tmp_path, "a", offset)
                await s.control.load("a")
            await asyncio.sleep(0.02)
            stop.set()
        assert set(answers) <= {1.0, 2.0, 3.0, 4.0, 5.0, 6.0}
        assert answers[-1] == 6.0
        assert len(answers) > 16
        assert await infer(s.inference, "a", 0.0) == 6.0


async def test_a_failed_load_leaves_the_version_serving_as_it_was(tmp_path: Path) -> None:
    write(tmp_path, "a", 1)
    async with Setup(tmp_path, loaded=("a",)) as s:
        before = s.registry.get("a")
        (tmp_path / "a" / "model.py").write_text("raise RuntimeError('half written')\n")
        with pytest.raises(LoadFailed, match=r"failed to load 'a': .*RuntimeError: half written"):
            await s.control.load("a")
        assert s.registry.get("a") is before
        assert await infer(s.inference, "a", 1.0) == 2.0
        assert s.state("a")["state"] == "READY"
        write(tmp_path, "a", 1)
        with pytest.raises(LoadFailed, match="'a': max_batch_size must be"):
            await s.control.load("a", {"max_batch_size": -1})
        with pytest.raises(LoadFailed, match="failed to load 'zz': no such model"):
            await s.control.load("zz")
        assert "zz" not in {e["name"] for e in s.registry.index()}


async def test_a_model_that_never_loaded_shows_why(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "model.py").write_text("raise RuntimeError('no weights')\n")
    write(tmp_path, "a", 1)
    async with Setup(tmp_path, loaded=("a",)) as s:
        with pytest.raises(LoadFailed):
            await s.control.load("b")
        entry = s.state("b")
        assert entry["state"] == "UNAVAILABLE"
        assert "RuntimeError: no weights" in entry["reason"]
        write(tmp_path, "b", 2)
        await s.control.load("b")
        assert s.state("b")["state"] == "READY"


async def test_an_unload_finishes_what_was_accepted_and_shows_unloading(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    write(tmp_path / "repo", "a", 1, gate=gate)
    async with Setup(tmp_path / "repo", loaded=("a",)) as s:
        pending = [asyncio.create_task(infer(s.inference, "a", float(i))) for i in range(3)]
        await asyncio.sleep(0.05)  # in the batcher, held by the gate
        unloading = asyncio.create_task(s.control.unload("a"))
        await until(lambda: s.state("a")["state"] == "UNLOADING")
        with pytest.raises(ModelNotFound):
            await infer(s.inference, "a", 9.0)  # no new request is taken
        gate.touch()
        assert await asyncio.gather(*pending) == [1.0, 2.0, 3.0]
        await unloading
        assert s.state("a")["reason"] == "unloaded"


async def test_loading_shows_in_the_index_until_the_model_serves(tmp_path: Path) -> None:
    write(tmp_path, "a", 1)
    (tmp_path / "slow").mkdir()
    flag = tmp_path / "go"
    code = (
        f"import pathlib, time\nwhile not pathlib.Path({str(flag)!r}).exists():\n"
        "    time.sleep(0.002)\ndef model(x):\n    return x\n"
    )
    (tmp_path / "slow" / "model.py").write_text(code)
    async with Setup(tmp_path, loaded=("a",)) as s:
        loading = asyncio.create_task(s.control.load("slow"))
        await until(lambda: s.state("slow").get("state") == "LOADING")
        assert await infer(s.inference, "a", 1.0) == 2.0  # the loop serves meanwhile
        flag.touch()
        await loading
        assert s.state("slow")["state"] == "READY"


async def test_polling_follows_folders_added_changed_and_removed(tmp_path: Path) -> None:
    write(tmp_path, "a", 1)
    async with Setup(tmp_path, mode="poll", loaded=("a",)) as s:
        write(tmp_path, "b", 2)
        await s.control.poll_once()
        assert s.registry.find("b") is None  # seen once: it may still be being written
        await s.control.poll_once()
        assert await infer(s.inference, "b", 0.0) == 2.0
        loaded = s.registry.get("b")
        await s.control.poll_once()
        assert s.registry.get("b") is loaded  # once per change
        write(tmp_path, "b", 3)
        await s.control.poll_once()
        await s.control.poll_once()
        assert await infer(s.inference, "b", 0.0) == 3.0
        (tmp_path / "b" / "model.py").unlink()
        (tmp_path / "b").rmdir()
        await s.control.poll_once()
        await s.control.poll_once()
        assert s.state("b") == {
            "name": "b",
            "version": "1",
            "state": "UNAVAILABLE",
            "reason": "unloaded",
        }
        with pytest.raises(ControlUnavailable, match="not allowed if polling is enabled"):
            await s.control.load("a")


async def test_requests_are_refused_without_explicit_control(tmp_path: Path) -> None:
    with pytest.raises(ControlUnavailable, match="--model-control-mode explicit"):
        await act(None, "a", "load", {})
    write(tmp_path, "a", 1)
    async with Setup(tmp_path, loaded=("a",)) as s:
        await act(s.control, "a", "load", {"config": '{"max_batch_size": 4}'})
        assert s.registry.get("a").model.batching.max_batch_size == 4
        await s.control.close()
        with pytest.raises(ControlUnavailable, match="the server is stopping"):
            await s.control.unload("a")
