"""carpool.ipc.lifelines: a process keeps the room for its title in ``ps`` when the variable it
scrubs from its environment was the last one (issue 31: ``CARPOOL_API_KEY`` alone in the
environment, and no front end showed ``carpool: frontend#1``)."""

from __future__ import annotations

import subprocess
import sys

_SCRUB = """
import os, sys
from carpool.ipc.lifelines import keep_title_room, set_title
if sys.argv[1] == "keep":
    keep_title_room()
os.environ.pop("CARPOOL_API_KEY")
set_title("carpool: frontend#1", "frontend#1")
print(open("/proc/self/cmdline", "rb").read().split(b"\\0")[0].decode())
"""


def _title_after_scrubbing(keep: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", _SCRUB, keep],
        env={"CARPOOL_API_KEY": "secret"},  # the only variable, so the last
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def test_the_title_survives_the_last_variable_scrubbed() -> None:
    assert _title_after_scrubbing("keep") == "carpool: frontend#1"
    assert _title_after_scrubbing("no") != "carpool: frontend#1"  # what keep_title_room fixes
