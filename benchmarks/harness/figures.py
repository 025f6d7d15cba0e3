"""What a scenario reports: named figures, printed as one table and written as JSON.

A scenario's ``measure(args) -> Figures`` is its whole result; ``run`` parses the common
flags, pins, prints the figures and exits non-zero when the scenario failed or a check
did not hold. Tests read the JSON (``--json PATH``): names and types, never printed text.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import common

Value = float | int | bool | str


@dataclass(frozen=True)
class Figure:
    """One measured number (or a check's outcome) with its unit and, when it has one, its goal.

    ``name`` is stable (snake_case): tests, docs and ``--json`` readers refer to it.
    ``met`` is the goal's verdict; a missed goal is reported, never a failure (noisy boxes);
    None for a goal whose figure was not measured (NaN: a peer or tool left out).
    """

    name: str
    value: Value
    unit: str = ""
    goal: str = ""
    met: bool | None = None


class Figures:
    """A scenario's figures, in the order measured; each name once."""

    def __init__(self) -> None:
        self._figures: dict[str, Figure] = {}

    def add(
        self, name: str, value: Value, unit: str = "", *, goal: str = "", met: bool | None = None
    ) -> Figure:
        if name in self._figures:
            raise ValueError(f"figure {name!r} reported twice")
        if isinstance(value, float) and math.isfinite(value):
            value = float(f"{value:.6g}")
        figure = Figure(name, value, unit, goal, met)
        self._figures[name] = figure
        return figure

    def at_least(self, name: str, value: float, target: float, unit: str = "x") -> Figure:
        """A figure whose goal is ``value >= target``."""
        return self._goal(name, value, unit, f">= {target:g}", value >= target)

    def at_most(self, name: str, value: float, target: float, unit: str = "x") -> Figure:
        """A figure whose goal is ``value <= target``."""
        return self._goal(name, value, unit, f"<= {target:g}", value <= target)

    def _goal(self, name: str, value: float, unit: str, goal: str, held: bool) -> Figure:
        """A figure with its goal; its verdict None when it is NaN (not measured), since
        every comparison with NaN is False."""
        return self.add(name, value, unit, goal=goal, met=None if math.isnan(value) else held)

    def check(self, name: str, ok: bool) -> Figure:
        """A correctness check (answers equal a reference, nothing lost): ``run`` fails if
        one is False, unlike a goal."""
        return self.add(name, bool(ok), "check")

    def update(self, other: Figures, prefix: str = "") -> None:
        for figure in other:
            self.add(
                prefix + figure.name, figure.value, figure.unit, goal=figure.goal, met=figure.met
            )

    def __iter__(self) -> Iterator[Figure]:
        return iter(self._figures.values())

    def __getitem__(self, name: str) -> Value:
        return self._figures[name].value

    def __contains__(self, name: object) -> bool:
        return name in self._figures

    def failed_checks(self) -> list[str]:
        return [f.name for f in self if f.unit == "check" and f.value is not True]

    def table(self) -> str:
        rows = [
            (
                f.name,
                _shown(f.value),
                f.unit,
                f.goal,
                _shown_verdict(f),
            )
            for f in self
        ]
        return common.table(["figure", "value", "unit", "goal", ""], rows, left=1)

    def as_json(self) -> list[dict[str, Any]]:
        return [asdict(f) for f in self]


def _shown_verdict(figure: Figure) -> str:
    if figure.met is None:
        return "n/a" if figure.goal else ""
    return "met" if figure.met else "MISSED"


def _shown(value: Value) -> str:
    if isinstance(value, bool) or not isinstance(value, float):
        return str(value)
    return common.fmt_num(value, 3 if abs(value) < 10 else 1)


def run(
    measure: Callable[[argparse.Namespace], Figures],
    parser: argparse.ArgumentParser,
    argv: list[str] | None = None,
) -> int:
    """A scenario's ``__main__``: parse, measure, print the figures, write ``--json``.

    Exit status 1 when ``measure`` raised (or got SIGTERM, raised as ``KeyboardInterrupt``
    so servers stop on the way out) or a check failed; 0 otherwise, goals met or not.
    """
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        metavar="PATH",
        help="also write the figures to PATH as JSON",
    )
    args = parser.parse_args(argv)
    name = Path(sys.argv[0]).stem if argv is None else parser.prog
    signal.signal(signal.SIGTERM, _terminate)
    try:
        figures = measure(args)
    except (Exception, KeyboardInterrupt) as exc:
        traceback.print_exc()
        print(f"\n{name}: {type(exc).__name__}: {exc}", flush=True)
        return 1
    print("\n" + figures.table(), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps({"scenario": name, "figures": figures.as_json()}, indent=1))
    failed = figures.failed_checks()
    if failed:
        print(f"\n{name}: checks failed: {', '.join(failed)}", flush=True)
        return 1
    return 0


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
