"""``carpool bench``: the parsed flags in; steps run, tables printed, reports written.

Every option is checked before anything is loaded or sent: a usage error is one line on
stderr and exit status 2. Then each step's plan is built (send times from ``load``,
request bodies from ``payload``, both before the step, so the client does no per-request
work beyond sending), the steps run through ``runner`` with a live display on a terminal,
and the :class:`~carpool.bench.report.Report` is printed, saved and plotted.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import math
import os
import platform
import sys
from collections import deque
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import BarColumn, Progress, TaskID, TextColumn

from carpool.bench.report import Load, Report, ReportError, Step
from carpool.bench.runner import (
    ClientProcesses,
    Generator,
    InProcess,
    Plan,
    Probe,
    Tally,
    Timing,
    clock,
    event_loop,
    measure,
)
from carpool.bench.targets import (
    BenchError,
    Client,
    HttpTarget,
    LocalTarget,
    is_url,
    load_model,
)
from carpool.model import Model

__all__ = ["Options", "main", "options_from"]

CONCURRENCY = (1, 8, 64, 256)  # one caller, then the levels where batching starts to pay
DURATION_S = 5.0  # perf_analyzer's measurement interval
WARMUP_S = 1.0  # connections opened, caches and the batcher's pool warm
DISTINCT = 64  # requests cycled through: no cache sees one body; encoding takes milliseconds
CONNECTIONS = 256  # open loop: in flight at once before requests wait for a connection
TIMEOUT_S = 30.0  # a request this late is a failure (TimeoutError), not a latency
REFRESH_S = 0.25  # the live display's period: cheap next to the load it watches
LATE_SHARE = 0.01  # more late open-loop sends than this share is worth a warning


# Where a run was written, how the client ran (Report.client) and the sweep grid (its own
# setting): recorded elsewhere or not at all.
_NOT_SETTINGS = frozenset(
    {"target", "json", "plot", "label", "processes", "connections", "batching", "sweep",
     "sizes", "waits", "p99_budget_ms"}
)  # fmt: skip


@dataclass(frozen=True)
class Options:
    """Everything a run needs, checked."""

    target: str
    mode: str  # "concurrency", "rate" or "trace"
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
    encoding: str = "json"
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

    def settings(self) -> dict[str, Any]:
        """The options a report records (what was run, not where it was written)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _NOT_SETTINGS}
        out["values"] = list(self.values)
        out["shapes"] = {k: list(v) for k, v in self.shapes.items()}
        return out


# ----------------------------------------------------------------------------- options


def _shape(text: str) -> tuple[str, tuple[int, ...]]:
    name, sep, dims = text.rpartition(":")
    try:
        shape = tuple(int(d) for d in dims.split(","))
    except ValueError:
        shape = ()
    if not sep or not name or not shape or any(d < 1 for d in shape):
        raise BenchError(f"--shape {text!r} must be NAME:DIMS with dims >= 1, e.g. INPUT0:256")
    return name, shape


def options_from(args: argparse.Namespace) -> Options:
    """:class:`Options` from ``carpool bench``'s flags; :class:`BenchError` says what is wrong."""
    if not args.target:
        raise BenchError("name a TARGET (a model URL or an in-process model), or use --compare")
    mode, values = _load(args)
    _check(args)
    batching, sizes, waits = _batching_flags(args, mode)
    encoding = (args.encoding or "json").lower()
    if encoding not in ("json", "binary"):
        raise BenchError(f"--encoding must be json or binary, got {args.encoding!r}")
    return Options(
        target=args.target,
        mode=mode,
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
        encoding=encoding,
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
    )


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
    """Numbers in range, files that exist, outputs that can be written."""
    if args.duration is not None and args.requests is not None:
        raise BenchError("--duration and --requests both end a step; give one")
    for name in ("duration", "timeout", "slo_ms", "p99_budget_ms", "warmup"):
        value = getattr(args, name)
        zero = name == "warmup"  # no warm-up is fine; no duration or timeout is not
        if value is not None and not (value >= 0 if zero else value > 0):
            flag = "--" + name.replace("_", "-")
            raise BenchError(f"{flag} must be {'>= 0' if zero else '> 0'}, got {value:g}")
    for name in ("requests", "rows", "distinct", "client_processes", "connections"):
        count = getattr(args, name)
        if count is not None and count < 1:
            raise BenchError(f"--{name.replace('_', '-')} must be >= 1, got {count}")
    if args.input_data and args.strings:
        raise BenchError("--input-data gives whole requests; --strings applies to generated ones")
    for name in ("trace", "input_data", "strings"):
        path = getattr(args, name)
        if path and not Path(path).is_file():
            raise BenchError(f"--{name.replace('_', '-')} file {path!r} does not exist")
    for name, path in (("--json", args.json), ("--plot", args.plot)):
        if path and not Path(path).resolve().parent.is_dir():
            raise BenchError(f"cannot write {name} {path!r}: no such directory")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise BenchError("--plot needs matplotlib: pip install 'carpool[bench]'")


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


# ----------------------------------------------------------------------------- plans


def plans(options: Options) -> list[Plan]:
    """Each step's plan; open-loop send times drawn here, before anything is sent."""
    from carpool.bench import load as arrivals

    duration = options.duration_s if options.duration_s is not None else DURATION_S
    warmup, seed, count = options.warmup_s, options.seed, options.requests
    by_time = None if count is not None else duration

    def warm(rate: float) -> np.ndarray[Any, Any]:
        if warmup <= 0:
            return np.empty(0)
        return np.asarray(arrivals.poisson_offsets(rate, warmup, seed=seed + 1), dtype=np.float64)

    if options.mode == "concurrency":
        return [
            Plan(Load("concurrency", c), warmup, by_time, count, connections=int(c))
            for c in options.values
        ]
    if options.mode == "rate":
        out = []
        for rate in options.values:
            if count is not None:
                offsets = arrivals.count_offsets(rate, count, seed=seed)
            else:
                offsets = arrivals.poisson_offsets(rate, duration, seed=seed)
            out.append(
                Plan(
                    Load("rate", rate),
                    warmup,
                    by_time,
                    count,
                    np.asarray(offsets, dtype=np.float64),
                    warm(rate),
                    options.connections,
                )
            )
        return out
    assert options.trace is not None
    try:
        offsets = np.asarray(arrivals.read_trace(options.trace), dtype=np.float64)
    except (OSError, ValueError) as exc:
        raise BenchError(f"--trace {options.trace!r}: {exc}") from None
    if offsets.size:
        offsets = offsets - offsets[0]
    if count is not None:
        offsets = offsets[:count]
    elif options.duration_s is not None:
        offsets = offsets[offsets < options.duration_s]
    if not offsets.size:
        raise BenchError(f"--trace {options.trace!r} has no send times to replay")
    span = float(offsets[-1])
    rate = offsets.size / span if span > 0 else float(offsets.size)
    return [Plan(Load("trace", rate), warmup, None, None, offsets, warm(rate), options.connections)]


def _payload(
    metadata: Mapping[str, Any], options: Options, batched: bool | None
) -> tuple[Any, list[dict[str, np.ndarray[Any, Any]]]]:
    """The request spec and the distinct requests a run cycles through."""
    from carpool.bench import payload

    try:
        if options.input_data:  # the file gives the shapes; the metadata names and types
            requests = payload.read_requests(options.input_data, metadata)
            spec = payload.RequestSpec(
                tuple(
                    payload.InputSpec(t["name"], t["datatype"], tuple(requests[0][t["name"]].shape))
                    for t in metadata["inputs"]
                )
            )
            return spec, requests
        spec = payload.spec_from_metadata(
            metadata, rows=options.rows, shapes=options.shapes, batched=batched
        )
        strings = payload.read_strings(options.strings) if options.strings else None
        return spec, payload.generate(spec, options.distinct, seed=options.seed, strings=strings)
    except (OSError, ValueError) as exc:
        raise BenchError(f"requests for model {metadata.get('name')!r}: {exc}") from None


# ----------------------------------------------------------------------------- display


class Display:
    """What a person sees: on a terminal, a live view of the running step (progress, the
    table so far); everywhere, one line per finished step."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live = console.is_terminal

    @asynccontextmanager
    async def showing(
        self, plan: Plan, timing: Timing, generator: Generator, above: RenderableType | None
    ) -> AsyncIterator[None]:
        if not self.live:
            yield
            return
        progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[where]}"),
            TextColumn("{task.fields[counts]}"),
            console=self.console,
            auto_refresh=False,
        )
        task = progress.add_task(str(plan.load), total=None, where="", counts="")
        view = Group(above, progress) if above is not None else progress
        with Live(view, console=self.console, auto_refresh=False, transient=True) as live:
            async with asyncio.TaskGroup() as group:
                watcher = group.create_task(
                    self._watch(progress, task, live, plan, timing, generator)
                )
                try:
                    yield
                finally:
                    watcher.cancel()

    async def _watch(
        self,
        progress: Progress,
        task: TaskID,
        live: Live,
        plan: Plan,
        timing: Timing,
        generator: Generator,
    ) -> None:
        by_time = plan.requests is None and plan.duration_s is not None
        total = (plan.duration_s if by_time else plan.requests) or (
            len(plan.offsets) if plan.offsets is not None else 0
        )
        recent: deque[tuple[float, int]] = deque(maxlen=int(2 / REFRESH_S))  # ~2 s of rate
        while True:
            now = clock()
            done, failed = generator.counts()
            recent.append((now, done))
            then, before = recent[0]
            rate = (done - before) / (now - then) if now > then else 0.0
            if now < timing.window:
                description = f"{plan.load} warm-up"
                where = f"{max(0.0, now - timing.start):.1f}/{plan.warmup_s:g} s"
                progress.update(task, total=plan.warmup_s, completed=now - timing.start)
            else:
                description = str(plan.load)
                elapsed = now - timing.window
                if by_time:
                    where = f"{elapsed:.1f}/{total:g} s"
                    progress.update(task, total=total, completed=min(elapsed, total))
                else:
                    where = f"{done}/{total} requests"
                    progress.update(task, total=total, completed=done)
            counts = f"ok {done - failed}  errors {failed}  {rate:,.0f} req/s"
            progress.update(task, description=description, where=where, counts=counts)
            live.refresh()
            await asyncio.sleep(REFRESH_S)

    def note(self, text: str) -> None:
        self.console.print(text, highlight=False, markup=False)

    def finished(self, step: Step, tallies: Sequence[Tally], prefix: str = "") -> None:
        text = (
            f"{prefix}{step.load}: {step.requests} requests, {step.ok} ok, "
            f"{step.throughput_rps:,.1f} req/s"
        )
        if step.latency is not None:
            text += f", p50 {step.latency.p50:.2f} ms, p99 {step.latency.p99:.2f} ms"
        if step.errors:
            text += ", errors " + ", ".join(f"{k}: {v}" for k, v in step.errors.items())
        if step.server is not None:
            text += f", mean batch {step.server.batch_size_mean:.1f}"
        self.note(text)
        late = sum(t.late for t in tallies)
        if late > LATE_SHARE * max(1, step.requests):
            lag = max(t.lag_max_s for t in tallies) * 1000
            self.note(
                f"  note: {late} of {step.requests} sends left more than 5 ms behind schedule "
                f"(up to {lag:.0f} ms): the client could not keep up, and their latency "
                "includes the delay; try --client-processes"
            )


# ----------------------------------------------------------------------------- running


@contextmanager
def _generator(client: Client, processes: int) -> Iterator[Generator]:
    if processes == 1:
        yield InProcess(client)
        return
    with ClientProcesses(client, processes) as pool:
        yield pool


async def _step(
    plan: Plan,
    generator: Generator,
    probe: Probe,
    display: Display,
    options: Options,
    above: RenderableType | None,
    prefix: str = "",
) -> Step:
    timing = Timing.of(plan, lead_s=generator.lead_s)
    async with display.showing(plan, timing, generator, above):
        step, tallies = await measure(plan, timing, generator, probe, slo_ms=options.slo_ms)
    display.finished(step, tallies, prefix)
    return step


def _client_info(options: Options) -> dict[str, Any]:
    loop = event_loop()
    name = "uvloop" if loop is not asyncio.new_event_loop else "asyncio"
    info: dict[str, Any] = {
        "processes": options.processes,
        "loop": name,
        "host": platform.node(),
        "python": platform.python_version(),
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
    }
    if is_url(options.target):
        import aiohttp

        info["http"] = f"aiohttp {aiohttp.__version__}"
        closed = options.mode == "concurrency"
        info["connections"] = "one per caller" if closed else options.connections
    return info


def _report(options: Options, target: str, kind: str, model: str, **settings: Any) -> Report:
    return Report(
        target=target,
        kind=kind,
        model=model,
        mode=options.mode,
        label=options.label,
        settings={**options.settings(), **settings},
        client=_client_info(options),
        created=datetime.now(UTC).isoformat(timespec="seconds"),
    )


def _batching(model: Model) -> dict[str, Any]:
    return {k: str(v) if k == "policy" else v for k, v in asdict(model.batching).items()}


async def _steps(
    report: Report, generator: Generator, probe: Probe, display: Display, options: Options
) -> Report:
    from carpool.bench.present import steps_table

    for plan in plans(options):
        above = steps_table(report) if report.steps else None
        report.steps.append(await _step(plan, generator, probe, display, options, above))
    return report


async def _run_http(options: Options, display: Display) -> Report:
    from carpool.bench import payload

    plans(options)  # a bad trace file is a usage error before the server is asked anything
    async with HttpTarget.connect(options.target) as target:
        spec, requests = _payload(target.metadata, options, batched=None)
        binary = options.encoding == "binary"
        try:
            bodies = [payload.encode(r, spec, binary=binary) for r in requests]
        except ValueError as exc:
            raise BenchError(f"cannot encode requests: {exc}") from None
        report = _report(options, str(target), target.kind, target.name)
        with _generator(target.client(bodies, options.timeout_s), options.processes) as generator:
            return await _steps(report, generator, target, display, options)


async def _run_local(options: Options, model: Model, display: Display) -> Report:
    plans(options)
    async with LocalTarget.serving(model, options.target) as target:
        _, requests = _payload(target.metadata, options, batched=model.batching.batched)
        report = _report(options, str(target), target.kind, target.name, batching=_batching(model))
        return await _steps(report, InProcess(target.client(requests)), target, display, options)


async def _run_sweep(options: Options, model: Model, display: Display) -> Report:
    from carpool.bench.present import SweepResult, sweep_table
    from carpool.bench.sweep import Cell, grid, summary, sweep

    cells = grid(model, options.sizes, options.waits)
    if str(cells[0].model.batching.policy) == "eager" and len(options.waits) > 1:
        display.note(
            "note: the eager policy never waits, so --max-wait-ms changes nothing; "
            "add --policy fixed to sweep it"
        )
    plan = plans(options)[0]

    async def run_cell(target: LocalTarget, cell: Cell, so_far: list[SweepResult]) -> Step:
        _, requests = _payload(target.metadata, options, batched=True)
        prefix = f"max_batch_size={cell.max_batch_size} max_wait_ms={cell.max_wait_ms:g}  "
        above = sweep_table(so_far) if so_far else None
        generator = InProcess(target.client(requests))
        return await _step(plan, generator, target, display, options, above, prefix)

    results = await sweep(cells, options.target, run_cell)
    budget = options.p99_budget_ms
    display.console.print(sweep_table(results, p99_budget_ms=budget))
    display.note(summary(results, budget))
    sweep_settings = [
        {"max_batch_size": c.max_batch_size, "max_wait_ms": c.max_wait_ms} for c in cells
    ]
    report = _report(
        options,
        options.target,
        LocalTarget.kind,
        str(model.name),
        batching=_batching(cells[0].model),
        sweep=sweep_settings,
    )
    report.steps = [r.step for r in results]
    return report


# ----------------------------------------------------------------------------- output


def _console() -> Console:
    console = Console()
    if not console.is_terminal:  # a pipe or a log: wide enough that tables never wrap
        console = Console(width=max(console.width, 160))
    return console


def _print_report(report: Report, console: Console) -> None:
    from carpool.bench.present import batch_histogram, steps_table

    console.print(steps_table(report))
    for step in report.steps:
        if step.server is not None and step.server.batches:
            console.print(f"batch sizes at {step.load}: {batch_histogram(step)}", highlight=False)


def _save(report: Report, options: Options, console: Console) -> None:
    if options.json:
        try:
            report.save(options.json)
        except OSError as exc:
            raise BenchError(f"cannot write --json {options.json!r}: {exc}") from None
        console.print(f"wrote {options.json}", highlight=False, markup=False)
    if options.plot:
        from carpool.bench.plot import plot_report

        plot_report(report, options.plot)
        console.print(f"wrote {options.plot}", highlight=False, markup=False)


def _compare(args: argparse.Namespace, console: Console) -> int:
    from carpool.bench.present import compare_table

    if args.target:
        raise BenchError("--compare reads reports written by --json; it takes no TARGET")
    if len(args.compare) < 2:
        raise BenchError("--compare needs two reports or more")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise BenchError("--plot needs matplotlib: pip install 'carpool[bench]'")
    try:
        reports = [Report.load(path) for path in args.compare]
    except ReportError as exc:
        raise BenchError(str(exc)) from None
    console.print(compare_table(reports))
    if args.plot:
        from carpool.bench.plot import plot_compare

        plot_compare(reports, args.plot)
        console.print(f"wrote {args.plot}", highlight=False, markup=False)
    return 0


def main(args: argparse.Namespace) -> int:
    """Run ``carpool bench``; 0 when the run completed (counted errors included), 2 on a
    usage error, reported in one line."""
    console = _console()
    try:
        if args.compare:
            return _compare(args, console)
        options = options_from(args)
        model = None
        if not is_url(options.target):
            model = load_model(options.target, options.batching)
        display = Display(console)
        with asyncio.Runner(loop_factory=event_loop()) as runner:
            if model is None:
                report = runner.run(_run_http(options, display))
            elif options.sweep:
                report = runner.run(_run_sweep(options, model, display))
            else:
                report = runner.run(_run_local(options, model, display))
        if not options.sweep:
            _print_report(report, console)
        _save(report, options, console)
    except BenchError as exc:
        sys.stderr.write(f"carpool bench: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("carpool bench: interrupted\n")
        return 130
    return 0
