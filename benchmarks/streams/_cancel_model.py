"""``benchmarks.streams.cancellations``' model: ``(key, length)`` in, ``length`` outputs out
(``_models.expected``), a step slept ``BENCH_CANCEL_STEP_MS``; it keeps a ledger of when
each step began and ended and the last step each key took part in, which key -1 writes to
``BENCH_CANCEL_LEDGER`` (JSON), so a client in another process can count steps after a cancel.
"""

from __future__ import annotations

import bisect
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.streams._models import SPREAD, served
from carpool.steps.model import StepModel

DUMP = -1  # the key of the request that writes the ledger
MODEL = "cancel"
MAX_SEQUENCES = 32


@dataclass
class Ledger:
    """When each step began and ended (``time.monotonic``, one clock for every process of
    the box) and, per key, the index of the last step that advanced it."""

    starts: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    last: dict[int, int] = field(default_factory=dict)

    def steps_after(self, key: int, cancelled_at: float) -> int:
        """Steps that began after ``cancelled_at`` and still advanced ``key``: 0 when the
        cancel was seen before the next step, 1 when that step was already on its way."""
        last = self.last.get(key)
        if last is None:
            return 0
        return max(0, last + 1 - bisect.bisect_right(self.starts, cancelled_at))

    def delivered_after(self, key: int, arrived: float) -> float | None:
        """Seconds from the end of the step that made ``key``'s last output to its arrival
        (None if no step made one)."""
        last = self.last.get(key)
        return None if last is None or last >= len(self.ends) else arrived - self.ends[last]

    def as_json(self) -> str:
        return json.dumps({"starts": self.starts, "ends": self.ends, "last": self.last})

    @classmethod
    def read(cls, path: Path) -> Ledger:
        doc = json.loads(path.read_text())
        return cls(doc["starts"], doc["ends"], {int(k): v for k, v in doc["last"].items()})


class Counting(StepModel[tuple[int, int], list[int], int]):
    """Input ``(key, length)``: outputs ``key * SPREAD + 1 .. + length``, one a step, each
    step slept ``step_s`` (the GIL free, as an accelerator leaves it)."""

    def __init__(self, step_s: float, dump_to: Path | None = None) -> None:
        self.step_s = step_s
        self.dump_to = dump_to
        self.ledger = Ledger()

    def start(self, inputs: Sequence[tuple[int, int]]) -> list[list[int]]:
        if self.dump_to is not None and any(key == DUMP for key, _ in inputs):
            self.dump_to.write_text(self.ledger.as_json())
        return [[key, length, 0] for key, length in inputs]

    def step(self, states: Sequence[list[int]]) -> list[int]:
        index = len(self.ledger.starts)
        self.ledger.starts.append(time.monotonic())
        if self.step_s:
            time.sleep(self.step_s)
        outputs = []
        for s in states:
            self.ledger.last[s[0]] = index
            s[2] += 1
            outputs.append(s[0] * SPREAD + s[2])
        self.ledger.ends.append(time.monotonic())
        return outputs

    def finished(self, state: list[int], output: int) -> bool:
        return state[2] >= state[1]


def _served() -> Counting:
    ledger = os.environ.get("BENCH_CANCEL_LEDGER")
    step_ms = float(os.environ.get("BENCH_CANCEL_STEP_MS", "2"))
    return Counting(step_ms / 1000, Path(ledger) if ledger else None)


cancel = served(MODEL, _served, MAX_SEQUENCES)
