"""What one ``carpool bench`` run measured: a report per run, a step per load level. Pure data,
JSON both ways (``--json``, ``--compare``), so a run is a file to keep, diff and plot later.
Latencies are in milliseconds, rates in requests per second."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from carpool.errors import CarpoolError

__all__ = [
    "FORMAT",
    "Latency",
    "Load",
    "Report",
    "ReportError",
    "ServerSide",
    "Step",
    "Streams",
    "percentile",
    "summarize",
    "summarize_streams",
]

FORMAT = "carpool-bench/1"  # the "format" field: bumped when a field changes meaning


class ReportError(CarpoolError, ValueError):
    """A file that is not a carpool bench report (or one of an unknown format)."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)

    def _fields(self) -> dict[str, Any]:
        return {"message": self.message}


@dataclass(frozen=True, slots=True)
class Load:
    """One load level. ``mode``: ``"concurrency"`` (closed loop: ``value`` callers, each
    sending its next request when the last is answered), ``"rate"`` (open loop: Poisson
    arrivals at ``value`` requests/s) or ``"trace"`` (open loop: the send times of a trace
    file, ``value`` its mean rate)."""

    mode: str
    value: float

    def __str__(self) -> str:
        if self.mode == "concurrency":
            return f"{self.value:g} clients"
        if self.mode == "rate":
            return f"{self.value:g} req/s"
        return f"trace ({self.value:.0f} req/s)"


@dataclass(frozen=True, slots=True)
class Latency:
    """Of the successful responses of a step, in milliseconds. In open-loop modes latency
    runs from the *scheduled* send time, so a client that falls behind cannot hide queueing
    (no coordinated omission)."""

    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: float


def percentile(values: Sequence[float] | np.ndarray[Any, Any], q: float) -> float:
    """The ``q``-th percentile (0 to 100) of ``values``, in their unit; NaN when there are none.

    numpy's ``linear`` method (the common definition, and what perf_analyzer's sorted-index
    method converges to on large samples): the one definition for carpool bench's reports
    and the benchmarks' tables alike.
    """
    array = np.asarray(values, dtype=np.float64)
    return float(np.percentile(array, q)) if array.size else math.nan


def summarize(latencies_s: Sequence[float] | np.ndarray[Any, Any]) -> Latency | None:
    """Percentiles (:func:`percentile`) of latencies given in seconds; ``None`` when there
    are none."""
    values = np.asarray(latencies_s, dtype=np.float64) * 1000.0
    if values.size == 0:
        return None
    p50, p90, p99 = (percentile(values, q) for q in (50, 90, 99))
    return Latency(
        count=int(values.size),
        mean=float(values.mean()),
        p50=p50,
        p90=p90,
        p99=p99,
        max=float(values.max()),
    )


@dataclass(frozen=True, slots=True)
class ServerSide:
    """What a carpool server's ``/metrics`` said about the step's window (scraped before
    and after it). ``batch_sizes``: model calls by batch size bucket (the histogram's upper
    bound, as a string, e.g. ``"8"``; ``"+Inf"`` for the last), within the window.
    ``batch_size_floors``: the smallest size of each of those buckets that holds more than
    one size (``/metrics`` has a bucket per power of two: ``{"8": 5}``); a bucket not in it
    holds exactly its bound's size (gRPC's statistics and an in-process batcher count every
    size). ``None`` in reports written before it was recorded, whose buckets are known by
    their bound alone. ``queue_wait_share``: the queue-wait seconds summed over the window's
    requests divided by the client-side latency summed over them: how much of what callers
    waited was spent queueing for a batch."""

    batches: int
    rows: int
    batch_size_mean: float
    batch_sizes: dict[str, int]
    queue_wait_ms_mean: float
    model_ms_mean: float
    queue_wait_share: float | None
    batch_size_floors: dict[str, int] | None = None

    def size_label(self, le: str) -> str:
        """The sizes a person reads for the bucket ``le`` of :attr:`batch_sizes`: its one
        size (``"3"``), its range (``"5-8"``, or ``"≥9"`` past the last bound), or where the
        report has no floors, its bound (``"≤8"``)."""
        floors = self.batch_size_floors
        if floors is None:
            return le if le in ("1", "+Inf") else f"\N{LESS-THAN OR EQUAL TO}{le}"
        if le not in floors:
            return le
        if le == "+Inf":
            return f"\N{GREATER-THAN OR EQUAL TO}{floors[le]}"
        return f"{floors[le]}-{le}"


@dataclass(frozen=True, slots=True)
class Streams:
    """Of a step's streams that ended well (``--stream``): their ``outputs`` in all, per
    second of the window and per stream; ``ttfo``, the time from a stream's send to its
    first output, and ``tpo``, the time between one output and the next, in milliseconds."""

    streams: int
    outputs: int
    outputs_per_s: float
    outputs_mean: float
    ttfo: Latency | None
    tpo: Latency | None


def summarize_streams(
    streams: int,
    outputs: int,
    first_s: Sequence[float],
    gaps_s: Sequence[float],
    window_s: float,
) -> Streams:
    """:class:`Streams` of ``streams`` streams with ``outputs`` outputs in all, times to
    first output ``first_s`` and gaps ``gaps_s`` in seconds, measured over ``window_s``."""
    return Streams(
        streams=streams,
        outputs=outputs,
        outputs_per_s=outputs / window_s,
        outputs_mean=outputs / streams if streams else math.nan,
        ttfo=summarize(first_s),
        tpo=summarize(gaps_s),
    )


@dataclass(frozen=True, slots=True)
class Step:
    """One load level's outcome. ``requests``: sent and finished within the measured
    window (after warmup); ``ok`` of them answered successfully; ``errors`` counts the
    others by kind: the HTTP status (``"503"``) or the exception's type name
    (``"ClientConnectorError"``, ``"QueueFull"``)."""

    load: Load
    duration_s: float
    requests: int
    ok: int
    errors: dict[str, int]
    throughput_rps: float  # successful answers that arrived in the window, per second
    latency: Latency | None
    server: ServerSide | None = None
    goodput_rps: float | None = None  # responses within the latency objective per second
    streams: Streams | None = None  # --stream: outputs and their times


@dataclass
class Report:
    """A whole run: what was measured, how, and each step's outcome."""

    target: str
    kind: str  # "http" or "in-process"
    model: str
    mode: str  # the Load mode of every step
    steps: list[Step] = field(default_factory=list)
    label: str = ""
    settings: dict[str, Any] = field(default_factory=dict)  # the options of the run
    client: dict[str, Any] = field(default_factory=dict)  # processes, connections, host
    created: str = ""  # ISO 8601, UTC
    format: str = FORMAT

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=False) + "\n"

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Report:
        if data.get("format") != FORMAT:
            raise ReportError(
                f"not a carpool bench report of format {FORMAT!r} (format: "
                f"{data.get('format')!r}); write one with carpool bench --json"
            )
        try:
            steps = [_step(s) for s in data["steps"]]
            fields = {k: v for k, v in data.items() if k != "steps"}
            return cls(steps=steps, **fields)
        except (KeyError, TypeError) as exc:
            raise ReportError(f"malformed carpool bench report: {exc}") from None

    @classmethod
    def load(cls, path: str | Path) -> Report:
        try:
            data = json.loads(Path(path).read_text())
        except OSError as exc:
            raise ReportError(f"cannot read report {str(path)!r}: {exc}") from None
        except json.JSONDecodeError as exc:
            raise ReportError(f"report {str(path)!r} is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ReportError(f"report {str(path)!r} is not a JSON object")
        report = cls.from_dict(data)
        if not report.label:
            report.label = Path(path).stem
        return report


def _step(data: Mapping[str, Any]) -> Step:
    latency = data.get("latency")
    server = data.get("server")
    return Step(
        load=Load(**data["load"]),
        duration_s=data["duration_s"],
        requests=data["requests"],
        ok=data["ok"],
        errors=dict(data["errors"]),
        throughput_rps=data["throughput_rps"],
        latency=Latency(**latency) if latency is not None else None,
        server=ServerSide(**server) if server is not None else None,
        goodput_rps=data.get("goodput_rps"),
        streams=_streams(data.get("streams")),
    )


def _streams(data: Mapping[str, Any] | None) -> Streams | None:
    if data is None:
        return None
    ttfo, tpo = data.get("ttfo"), data.get("tpo")
    return Streams(
        streams=data["streams"],
        outputs=data["outputs"],
        outputs_per_s=data["outputs_per_s"],
        outputs_mean=data["outputs_mean"],
        ttfo=Latency(**ttfo) if ttfo is not None else None,
        tpo=Latency(**tpo) if tpo is not None else None,
    )
