"""The soak, bounded: ``benchmarks/soak.py --duration 12 --interval 3``, and its books
balance exactly.

The 10-minute run's goals (RSS growth, flat fds and tasks, p99 drift) are the benchmark's
verdicts, printed, not asserted here: on a noisy machine a short run says little about them.
What 12 s (thousands of requests of the whole mix) must already show exactly: every
request sent to the model counted once by the server, the batcher's outcomes summing to what
it received, nothing lost or left in flight, no unexpected status.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"
SECONDS = 12  # of soak: every kind of the mix (cancelled, expired, 4xx) happens many times
ROW_EVERY = 3  # seconds between the table's rows
FIRST = SECONDS // 4  # the script's "first minute" of a shorter run


@pytest.mark.slow
@pytest.mark.timeout(150)  # 12 s of soak, a capacity step, a server start and drain
def test_a_short_soak_accounts_for_every_request() -> None:
    args = ["--duration", str(SECONDS), "--interval", str(ROW_EVERY), "--cpus", "none"]
    done = subprocess.run(
        [sys.executable, str(SOAK), *args],
        capture_output=True,
        text=True,
        timeout=140,
    )
    out = done.stdout
    assert done.returncode == 0, done.stderr[-2000:]
    assert "\nsoak: " not in out, out[-3000:]  # how the script reports a failure
    for text in [
        "capacity: ",
        f"RSS at {FIRST} s: ",
        f"fds: first {FIRST} s mean ",
        f"tasks: first {FIRST} s mean ",
        f"p99 first {FIRST} s: ",
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
    rows = re.findall(r"^\s+(\d+)\s+\d+\s+\d+\s", out, re.M)  # the table: a row every 3 s
    assert [int(t) for t in rows] == list(range(ROW_EVERY, SECONDS + 1, ROW_EVERY)), out[-3000:]
    for name in ("cancelled", "expired", "4xx"):  # the mix happened
        assert re.search(rf"'{name}': [1-9]", out), out[-3000:]
