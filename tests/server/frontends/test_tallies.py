"""carpool.server.frontends.tallies: front ends' counts in memory shared with the main process,
which
outlive a front end killed at any point; what it staged and never committed is not there."""

from __future__ import annotations

import asyncio
import os

import pytest

from carpool.server.frontends.tallies import PROTOCOLS, Tallies
from carpool.server.grpc import service as grpc_service
from carpool.server.rest import calls, generate


async def _front_end(tallies: Tallies) -> None:
    tally = tallies.slot(1)
    tally.record("m", "http", 200, 0.5)
    tally.record(None, "grpc", 401)
    await asyncio.sleep(0)  # the next turn: committed
    tally.record("m", "http", 200, 0.25)  # staged: the process ends before it commits
    os._exit(0)  # as a kill -9 would leave it


def test_a_forked_front_ends_counts_outlive_it_and_its_replacement_adds_to_them() -> None:
    tallies = Tallies(["m", "other"], 2)
    pid = os.fork()
    if pid == 0:  # the front end: counts, then dies
        asyncio.run(_front_end(tallies))
    assert os.waitpid(pid, 0)[1] == 0
    assert tallies.totals() == (
        {"m": ({"http": {200: 1}}, 0.5), "other": ({}, 0.0)},
        {"grpc": {401: 1}},
    )

    async def replacement() -> None:
        tallies.slot(1).record("m", "http", 503)
        tallies.slot(2).record("m", "http", 200, 1.0)
        await asyncio.sleep(0)

    asyncio.run(replacement())
    models, own = tallies.totals()
    assert models["m"] == ({"http": {200: 2, 503: 1}}, 1.5)
    assert own == {"grpc": {401: 1}}


def test_commit_adds_what_was_staged_at_once() -> None:
    tallies = Tallies(["m"], 1)

    async def answer() -> None:
        tally = tallies.slot(1)
        tally.record("m", "openai", 200, 0.125)
        tally.commit()  # as the connection does once the answer is written
        assert tallies.totals()[0]["m"] == ({"openai": {200: 1}}, 0.125)

    asyncio.run(answer())


def test_the_protocols_are_the_servers_labels_and_others_are_refused() -> None:
    assert set(PROTOCOLS) == {calls.HTTP, calls.OPENAI, generate.GENERATE, grpc_service.PROTOCOL}
    tallies = Tallies(["m"], 2)
    with pytest.raises(ValueError, match=r"protocol 'smtp'.*tallies.PROTOCOLS"):
        tallies.slot(1).record("m", "smtp", 200)
    with pytest.raises(ValueError, match=r"front_end must be in 1..2, got 3"):
        tallies.slot(3)
    with pytest.raises(ValueError, match=r"model 'nope'"):
        tallies.slot(1).record("nope", "http", 200)
