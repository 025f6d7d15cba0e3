"""``carpool bench``'s flags, checked, as :class:`Options`; a usage error is a
:class:`~carpool.bench.targets.base.BenchError` naming the flag. Pure: the checks that look at
the world (files, matplotlib) are passed in, so every rule is testable without files."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from carpool.bench.lengths import Lengths, parse_lengths
from carpool.bench.targets.base import BenchError, is_url, target_kind

__all__ = ["Options", "options_from"]

CONCURRENCY = (1, 8, 64, 256)  # one caller, then the levels where batching starts to pay
DURATION_S = 5.0  # perf_analyzer's measurement interval
WARMUP_S = 1.0  # connections opened, caches and the batcher's pool warm
DISTINCT = 64  # requests cycled through: no cache sees one body; encoding takes milliseconds
# --repeat-fraction's others: more than a response cache of a few MiB holds (an answer of a
# few floats takes about 1 KiB there); 4096 demo requests encode in ~0.1 s and take 4.5 MB.
UNIQUE = 4096
CONNECTIONS = 256  # open loop: in flight at once before requests wait for a connection
TIMEOUT_S = 30.0  # a request this late is a failure (TimeoutError), not a latency
LENGTH_PARAMETER = "max_tokens"  # what LLM servers (and carpool's smollm2) call it


# Where a run was written, how the client ran (Report.client) and the sweep grid (its own
# setting): recorded elsewhere or not at all; the stream settings only when streaming.
_NOT_SETTINGS = frozenset(
    {"target", "kind", "json", "plot", "label", "processes", "connections", "batching", "sweep",
     "sizes", "waits", "p99_budget_ms", "stream", "lengths", "length_parameter"}
)  # fmt: skip


@dataclass(frozen=True)
class Options:
    """Everything a run needs, checked."""

    target: str
    mode: str  # "concurrency", "rate" or "trace"
    kind: str = "http"  # what TARGET is: one of carpool.bench.targets.base.KINDS
    values: tuple[float, ...] = ()  # callers or rates per step; () for a trace
    trace: str | None = None
    duration_s: float | None = None  # as given; None: DURATION_S, or the whole trace
    requests: int | None = None
    warmup_s: float = WARMUP_S
    seed: int = 0
    rows: int = 1
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    input_data: str | None = None
    strings: str | None = None
    distinct: int = DISTINCT
    repeat_fraction: float = 1.0  # the share that repeats --distinct; the rest: --unique
    unique: int = UNIQUE
    encoding: str = "json"  # v2 HTTP: json|binary; grpc: raw; openai: float|base64
    model: str | None = None  # grpc and openai targets: the model asked for
    processes: int = 1
    connections: int = CONNECTIONS
    timeout_s: float = TIMEOUT_S
    batching: dict[str, Any] = field(default_factory=dict)  # in-process overrides
    sweep: bool = False
    sizes: tuple[int, ...] = ()
    waits: tuple[float, ...] = ()
    p99_budget_ms: float | None = None
    slo_ms: float | None = None
    json: str | None = None
    plot: str | None = None
    label: str = ""
    stream: bool = False  # each request a stream of a step-wise model
    lengths: Lengths | None = None  # --stream: requested lengths, sent as length_parameter
    length_parameter: str = LENGTH_PARAMETER

    def settings(self) -> dict[str, Any]:
        """The options a report records (what was run, not where it was written)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _NOT_SETTINGS}
        out["values"] = list(self.values)
        out["shapes"] = {k: list(v) for k, v in self.shapes.items()}
        if self.stream:  # a one-shot run's settings name no stream
            out["stream"] = True
            out["lengths"] = str(self.lengths) if self.lengths is not None else None
            out["length_parameter"] = self.length_parameter
        return out


# ----------------------------------------------------------------------------- options


def options_from(
    args: argparse.Namespace, *, check_paths: Callable[[argparse.Namespace], None]
) -> Options:
    """:class:`Options` from ``carpool bench``'s flags; :class:`BenchError` says what is wrong.

    ``check_paths`` raises for named files that do not exist, outputs that cannot be
    written or a missing matplotlib; it is passed in to keep this module free of I/O. It
    runs after the range checks and before the batching flags: that order decides which
    of several wrong flags is reported.
    """
    if not args.target:
        raise BenchError("name a TARGET (a model URL or an in-process model), or use --compare")
    mode, values = _load(args)
    _check(args)
    check_paths(args)
    batching, sizes, waits = _batching_flags(args, mode)
    kind = target_kind(args.target)
    encoding = _target_flags(args, kind)
    lengths = _stream_flags(args, kind)
    return Options(
        target=args.target,
        mode=mode,
        kind=kind,
        values=values,
        trace=args.trace,
        duration_s=args.duration,
        requests=args.requests,
        warmup_s=WARMUP_S if args.warmup is None else args.warmup,
        seed=args.seed or 0,
        rows=args.rows or 1,
        shapes=dict(_shape(s) for s in args.shape),
        input_data=args.input_data,
        strings=args.strings,
        distinct=args.distinct or DISTINCT,
        repeat_fraction=1.0 if args.repeat_fraction is None else args.repeat_fraction,
        unique=args.unique or UNIQUE,
        encoding=encoding,
        model=args.model,
        processes=args.client_processes or 1,
        connections=args.connections or CONNECTIONS,
        timeout_s=args.timeout or TIMEOUT_S,
        batching=batching,
        sweep=args.sweep_batching,
        sizes=sizes,
        waits=waits,
        p99_budget_ms=args.p99_budget_ms,
        slo_ms=args.slo_ms,
        json=args.json,
        plot=args.plot,
        label=args.label or "",
        stream=args.stream,
        lengths=lengths,
        length_parameter=args.length_parameter or LENGTH_PARAMETER,
    )


def _stream_flags(args: argparse.Namespace, kind: str) -> Lengths | None:
    """``--stream`` and its flags, for targets and settings a stream can have; the lengths."""
    if not args.stream:
        if kind == "chat":
            raise BenchError("a /v1/chat/completions target is streamed: add --stream")
        named = {"--lengths": args.lengths, "--length-parameter": args.length_parameter}
        for flag, given in named.items():
            if given is not None:
                raise BenchError(f"{flag} applies to streams; add --stream")
        return None
    if kind == "openai":
        raise BenchError("--stream needs a step-wise model; /v1/embeddings answers whole")
    for flag, given in (
        ("--sweep-batching", args.sweep_batching),
        ("--repeat-fraction", args.repeat_fraction is not None),
        ("--encoding", args.encoding is not None),
    ):
        if given:
            raise BenchError(f"{flag} applies to one-shot requests, not to --stream")
    if args.length_parameter is not None and not args.length_parameter.strip():
        raise BenchError("--length-parameter must name a request parameter")
    try:
        return parse_lengths(args.lengths) if args.lengths is not None else None
    except ValueError as exc:
        raise BenchError(str(exc)) from None


# --encoding per kind of target: the values it takes, the first the default.
_ENCODINGS = {
    "http": ("json", "binary"),  # v2 JSON, or the binary tensor extension
    "in-process": ("json", "binary"),  # nothing is encoded: recorded, never used
    "grpc": ("raw",),  # raw_input_contents: there is no other way to send
    "openai": ("float", "base64"),  # the answers' encoding_format (requests are JSON)
    "chat": ("json",),  # chat bodies are JSON; --stream refuses --encoding anyway
}


def _target_flags(args: argparse.Namespace, kind: str) -> str:
    """The flags that depend on what TARGET is: --encoding (returned, checked), --model,
    and the request flags an embeddings endpoint has no use for."""
    if args.model is not None and kind not in ("grpc", "openai", "chat"):
        where = "the URL names the model" if kind == "http" else "TARGET is the model"
        raise BenchError(f"--model applies to grpc:// and OpenAI (/v1/...) targets; {where}")
    if kind == "chat" and args.shape:
        raise BenchError("--shape describes v2 tensors; /v1/chat/completions takes messages")
    if kind == "openai":
        for flag, given in (("--input-data", args.input_data), ("--shape", args.shape)):
            if given:
                raise BenchError(f"{flag} describes v2 tensors; /v1/embeddings takes texts: "
                                 "give them with --strings FILE")  # fmt: skip
    allowed = _ENCODINGS[kind]
    encoding = (args.encoding or allowed[0]).lower()
    if encoding not in allowed:
        if kind == "grpc":
            raise BenchError("--encoding applies to HTTP targets; gRPC sends raw tensors")
        raise BenchError(
            f"--encoding for a {kind} target must be {' or '.join(allowed)}, got {args.encoding!r}"
        )
    return encoding


def _shape(text: str) -> tuple[str, tuple[int, ...]]:
    name, sep, dims = text.rpartition(":")
    try:
        shape = tuple(int(d) for d in dims.split(","))
    except ValueError:
        shape = ()
    if not sep or not name or not shape or any(d < 1 for d in shape):
        raise BenchError(f"--shape {text!r} must be NAME:DIMS with dims >= 1, e.g. INPUT0:256")
    return name, shape


def _load(args: argparse.Namespace) -> tuple[str, tuple[float, ...]]:
    """The load mode and its steps' values (none for a trace)."""
    modes = [m for m in ("concurrency", "rate", "trace") if getattr(args, m) is not None]
    if len(modes) > 1:
        raise BenchError("choose one load mode: --concurrency, --rate or --trace")
    mode = modes[0] if modes else "concurrency"
    if mode == "concurrency":
        values = tuple(args.concurrency or CONCURRENCY)
        if any(c < 1 for c in values):
            raise BenchError(f"--concurrency values must be >= 1, got {list(values)}")
        return mode, values
    if mode == "rate":
        if any(not (math.isfinite(r) and r > 0) for r in args.rate):
            raise BenchError(f"--rate values must be > 0 requests/s, got {list(args.rate)}")
        return mode, tuple(args.rate)
    return mode, ()


def _check(args: argparse.Namespace) -> None:
    """Numbers in range, and flags that exclude each other."""
    if args.duration is not None and args.requests is not None:
        raise BenchError("--duration and --requests both end a step; give one")
    for name in ("duration", "timeout", "slo_ms", "p99_budget_ms", "warmup"):
        value = getattr(args, name)
        zero = name == "warmup"  # no warm-up is fine; no duration or timeout is not
        if value is not None and not (value >= 0 if zero else value > 0):
            flag = "--" + name.replace("_", "-")
            raise BenchError(f"{flag} must be {'>= 0' if zero else '> 0'}, got {value:g}")
    for name in ("requests", "rows", "distinct", "unique", "client_processes", "connections"):
        count = getattr(args, name)
        if count is not None and count < 1:
            raise BenchError(f"--{name.replace('_', '-')} must be >= 1, got {count}")
    _check_repeats(args)
    if args.input_data and args.strings:
        raise BenchError("--input-data gives whole requests; --strings applies to generated ones")


def _check_repeats(args: argparse.Namespace) -> None:
    """``--repeat-fraction`` in range, for a target and requests it can apply to."""
    fraction = args.repeat_fraction
    if fraction is None:
        if args.unique is not None:
            raise BenchError("--unique is the pool of --repeat-fraction's others; add that")
        return
    if not 0.0 <= fraction <= 1.0:
        raise BenchError(f"--repeat-fraction must be in [0, 1], got {fraction:g}")
    if args.target and target_kind(args.target) not in ("http", "grpc"):
        raise BenchError("--repeat-fraction applies to v2 targets: an HTTP model URL or grpc://")
    if args.input_data:
        raise BenchError("--repeat-fraction generates its others; --input-data gives every request")


def _batching_flags(
    args: argparse.Namespace, mode: str
) -> tuple[dict[str, Any], tuple[int, ...], tuple[float, ...]]:
    """In-process batching overrides, and the sweep's grid (sizes, waits)."""
    url = is_url(args.target)
    batching = {
        key: getattr(args, key)
        for key in ("policy", "workers", "max_queue_size")
        if getattr(args, key) is not None
    }
    given = [
        f"--{key.replace('_', '-')}"
        for key in ("max_batch_size", "max_wait_ms", *batching)
        if getattr(args, key) is not None
    ]
    if url and args.sweep_batching:
        raise BenchError(
            "--sweep-batching needs an in-process TARGET (it starts a batcher per setting); "
            "a server's batching is set where it runs"
        )
    if url and given:
        raise BenchError(f"{', '.join(given)} apply to in-process targets; set them on the server")
    if not url and (args.client_processes or 1) > 1:
        raise BenchError("--client-processes needs a URL TARGET; a batcher runs on one loop")
    if args.p99_budget_ms is not None and not args.sweep_batching:
        raise BenchError("--p99-budget-ms picks the best --sweep-batching setting; add that")
    if args.sweep_batching:
        if mode == "trace":
            raise BenchError("--sweep-batching runs --concurrency or --rate steps, not --trace")
        sizes = tuple(args.max_batch_size or (8, 16, 32))  # a batch-size doubling either side
        waits = tuple(args.max_wait_ms or (0.0, 2.0, 5.0))  # no wait, and carpool's default
        return batching, sizes, waits
    for key in ("max_batch_size", "max_wait_ms"):
        values = getattr(args, key)
        if values is not None:
            if len(values) != 1:
                flag = "--" + key.replace("_", "-")
                raise BenchError(f"{flag} takes one value here; a list needs --sweep-batching")
            batching[key] = values[0]
    return batching, (), ()
