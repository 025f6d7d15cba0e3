"""When requests are sent: a load step's arrival offsets, in seconds from its start. Open-loop
loads (``--rate``, ``--trace``, bursts) become a sorted float64 array here, seeded so that a
run repeats exactly. Pure: numpy and the standard library."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["bursty_offsets", "count_offsets", "poisson_offsets", "read_trace"]

Offsets = npt.NDArray[np.float64]

_SLACK_SIGMAS = 6.0  # draw mean + 6 sd gaps at once: a second draw is then a ~1e-9 event
_TRACE_COLUMNS = {"offset_s": 1.0, "offset_ms": 1e-3}  # header name -> seconds per unit


def poisson_offsets(rate: float, duration_s: float, *, seed: int) -> Offsets:
    """Send offsets of a Poisson process of ``rate`` requests/s, all in ``[0, duration_s)``.

    Gaps are exponential with mean ``1 / rate`` (``numpy.random.default_rng(seed)``); the
    first request comes one gap after 0, as in a Poisson process. Ascending float64.
    Raises ``ValueError`` for a rate or duration that is not a finite number > 0.
    """
    _check_positive("rate", rate)
    _check_positive("duration_s", duration_s)
    return _poisson(np.random.default_rng(seed), rate, duration_s)


def count_offsets(rate: float, count: int, *, seed: int) -> Offsets:
    """Exactly ``count`` Poisson arrivals at ``rate`` requests/s (however long they take).

    With the same seed and rate these are exactly the first ``count`` offsets that
    :func:`poisson_offsets` gives over a long enough duration. Raises ``ValueError`` for
    a rate that is not a finite number > 0 or a count that is not an int >= 0.
    """
    _check_positive("rate", rate)
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ValueError(f"count must be an int >= 0, got {count!r}")
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=count)
    return np.cumsum(gaps, dtype=np.float64)


def bursty_offsets(
    high_rate: float, low_rate: float, period_s: float, duration_s: float, *, seed: int
) -> Offsets:
    """Poisson arrivals whose rate alternates every ``period_s``: ``high_rate`` first.

    Phase ``k`` covers ``[k * period_s, (k + 1) * period_s)``, at ``high_rate`` for even ``k``
    and ``low_rate`` for odd ``k`` (0 makes the low phases silent); the last phase is cut at
    ``duration_s``. For watching a batching policy adapt as load comes and goes.
    Raises ``ValueError`` for rates, period or duration out of range.
    """
    _check_positive("high_rate", high_rate)
    if not _finite(low_rate) or low_rate < 0:
        raise ValueError(f"low_rate must be a finite number >= 0, got {low_rate!r}")
    _check_positive("period_s", period_s)
    _check_positive("duration_s", duration_s)
    rng = np.random.default_rng(seed)
    phases: list[Offsets] = []
    for k in range(math.ceil(duration_s / period_s)):
        start = k * period_s
        length = min(period_s, duration_s - start)
        rate = high_rate if k % 2 == 0 else low_rate
        if rate > 0 and length > 0:
            phases.append(start + _poisson(rng, rate, length))
    if not phases:
        return np.empty(0, dtype=np.float64)
    offsets = np.concatenate(phases)
    return offsets[offsets < duration_s]  # start + x can round up to the phase's end


def read_trace(path: str | Path) -> Offsets:
    """Send offsets from a CSV file, in seconds, sorted ascending (not shifted).

    One column of numbers (seconds), or a header row naming a column ``offset_s``
    (seconds) or ``offset_ms`` (milliseconds); other columns are then ignored. Blank lines
    are skipped. Raises ``ValueError`` naming the line of a value that is not a finite
    number >= 0, for a header without either column, and for a file without offsets;
    ``OSError`` when the file cannot be read.
    """
    where = f"trace {str(path)!r}"
    with open(path, newline="") as file:
        rows = [(n, row) for n, row in enumerate(csv.reader(file), start=1) if any(row)]
    if not rows:
        raise ValueError(f"{where} holds no offsets")
    column, scale = 0, 1.0
    first_line, first = rows[0]
    if not _is_number(first[0]):
        names = [cell.strip() for cell in first]
        found = [name for name in names if name in _TRACE_COLUMNS]
        if len(found) != 1:
            raise ValueError(
                f"{where}, line {first_line}: the header must name one column offset_s "
                f"(seconds) or offset_ms (milliseconds), got {', '.join(names)}"
            )
        column, scale = names.index(found[0]), _TRACE_COLUMNS[found[0]]
        rows = rows[1:]
    elif len(first) > 1:
        raise ValueError(
            f"{where}, line {first_line}: {len(first)} columns but no header; give one "
            "column of offsets in seconds, or a header row naming offset_s or offset_ms"
        )
    if not rows:
        raise ValueError(f"{where} holds a header but no offsets")
    values = np.empty(len(rows), dtype=np.float64)
    for i, (line, row) in enumerate(rows):
        cell = row[column].strip() if column < len(row) else ""
        value = float(cell) if _is_number(cell) else math.nan
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(
                f"{where}, line {line}: expected an offset, a number >= 0, got {cell!r}"
            )
        values[i] = value * scale
    return np.sort(values)


def _poisson(rng: np.random.Generator, rate: float, length: float) -> Offsets:
    # Exponential gaps, cumulated, cut at length. Drawn in chunks sized to rarely need a
    # second, in sequence and cumulated as one array, so the offsets are exactly those of
    # one long draw (count_offsets's).
    mean = rate * length
    chunk = int(mean + _SLACK_SIGMAS * math.sqrt(mean) + 16)
    gaps = rng.exponential(1.0 / rate, size=chunk)
    offsets = np.cumsum(gaps)
    while offsets[-1] < length:
        gaps = np.concatenate([gaps, rng.exponential(1.0 / rate, size=chunk)])
        offsets = np.cumsum(gaps)
    return offsets[: int(np.searchsorted(offsets, length, side="left"))]


def _check_positive(name: str, value: Any) -> None:
    if not _finite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
