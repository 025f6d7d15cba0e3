"""The narrated run behind ``carpool demo`` (``carpool.tour``), in this process: it reports
what batching did and checks that every caller got exactly its own row."""

from __future__ import annotations

import re

import pytest

from carpool.tour import run_demo


def test_run_demo_batches_and_checks_every_row(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_demo(requests=200, concurrency=16, max_batch_size=8) == 0
    out = capsys.readouterr().out
    assert out.startswith("carpool demo: 200 requests, 16 concurrent callers, ")
    assert "model = numpy MLP 256->1024->1024->8" in out
    calls = re.search(r"model calls +: (\d+) for 200 rows .*max_batch_size=8\)", out)
    assert calls is not None
    assert int(calls.group(1)) >= 200 / 8  # no batch above max_batch_size
    assert "every caller got its own row (same as running it alone): True" in out
    assert "outcomes: completed=200 failed=0 expired=0 cancelled=0" in out
