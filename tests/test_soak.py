"""The soak, bounded: ``benchmarks/soak.py --duration 60``, and its books balance exactly.

The 10-minute run's goals (RSS growth, flat fds and tasks, p99 drift) are the benchmark's
verdicts, printed, not asserted here: on a noisy machine a minute says little about them.
What a minute must already show exactly: every request sent to the model counted once by
the server, the batcher's outcomes summing to what it received, nothing lost or left in
flight, no unexpected status.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).resolve().parent.parent / "benchmarks" / "soak.py"


@pytest.mark.slow
@pytest.mark.timeout(150)  # 60 s of soak, a 5 s capacity step, a server start and drain
def test_a_minute_of_soak_accounts_for_every_request() -> None:
    done = subprocess.run(
        [sys.executable, str(SOAK), "--duration", "60", "--cpus", "none"],
        capture_output=True,
        text=True,
        timeout=140,
    )
    out = done.stdout
    assert done.returncode == 0, done.stderr[-2000:]
    assert "\nsoak: " not in out, out[-3000:]  # how the script reports a failure
    for text in [
        "capacity: ",
        "RSS at 15 s: ",
        "fds: first 15 s mean ",
        "tasks: first 15 s mean ",
        "p99 first 15 s: ",
        "[ok] server counted every request sent to 'demo'",
        "[ok] answers under their status, cancellations under one each",
        "[ok] batcher received ",
        "[ok] nothing left: in flight 0, queued rows 0",
        "lost requests: 0\n",
        "unexpected answers: 0; server 5xx other than 503: 0\n",
        "accounting: ok\n",
        "server exit code: 0\n",
    ]:
        assert text in out, out[-3000:]
    assert "[FAILED]" not in out, out[-3000:]
    rows = re.findall(r"^\s+(\d+)\s+\d+\s+\d+\s", out, re.M)  # the table: a row every 5 s
    assert [int(t) for t in rows] == list(range(5, 65, 5)), out[-3000:]
    for name in ("cancelled", "expired", "4xx"):  # the mix happened
        assert re.search(rf"'{name}': [1-9]", out), out[-3000:]
