"""``--client-processes`` (``carpool.bench.client_processes``): real spawned processes run
their share of each step and send back their tallies; a failing share is raised in the parent,
and the processes stay usable for the next step."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest

from bench.conftest import closed_plan, open_plan
from carpool.bench.client_processes import ClientProcesses
from carpool.bench.loops import step_of
from carpool.bench.plan import Timing
from carpool.bench.targets.base import Send

pytestmark = pytest.mark.slow  # each test spawns interpreters that import numpy and carpool


@dataclass(frozen=True)
class OddFails:
    """Answers at once; request ``i`` fails as ``"odd"`` when ``i`` is odd. Opening a pool of
    ``refused`` connections raises. Picklable, so each client process gets its own copy."""

    refused: int = -1

    @asynccontextmanager
    async def open(self, connections: int) -> AsyncIterator[Send]:
        if connections == self.refused:
            raise LookupError(f"{connections} connections")

        async def send(i: int) -> str | None:
            await asyncio.sleep(0)
            return "odd" if i % 2 else None

        yield send


async def test_a_closed_step_is_shared_out_and_the_tallies_merged() -> None:
    plan = closed_plan(3, requests=20)
    with ClientProcesses(OddFails(), 2) as processes:
        timing = Timing.of(plan, lead_s=processes.lead_s)
        tallies = await processes.run(plan, timing)
        assert processes.counts() == (20, 10)
    # callers 2 + 1, requests 10 + 10; process 0 sends requests 0, 2, 4, ... and 1 the odd ones
    assert [(t.done, t.failed) for t in tallies] == [(10, 0), (10, 10)]
    step = step_of(plan, timing, tallies, slo_ms=None)
    assert (step.requests, step.ok, step.errors) == (20, 10, {"odd": 10})


async def test_an_open_step_deals_its_send_times_and_a_failure_is_raised() -> None:
    plan = open_plan([0.001 * k for k in range(9)])
    with ClientProcesses(OddFails(refused=3), 2) as processes:
        tallies = await processes.run(plan, Timing.of(plan, lead_s=processes.lead_s))
        assert [(t.done, t.failed) for t in tallies] == [(5, 0), (4, 4)]  # dealt in turn
        failing = closed_plan(5, requests=10)  # 3 callers (connections) in process 0, 2 in 1
        with pytest.raises(RuntimeError, match=r"^client process 0: ExceptionGroup: "):
            await processes.run(failing, Timing.of(failing, lead_s=processes.lead_s))
        again = closed_plan(2, requests=4)
        tallies = await processes.run(again, Timing.of(again, lead_s=processes.lead_s))
    assert [t.done for t in tallies] == [2, 2]  # the failed process took the next step
