"""``carpool bench``: the parsed flags in; steps run, tables printed, reports written. Flags become
:class:`~carpool.bench.options.Options` first, so a usage error is one line and exit status 2
before anything is loaded; each step's send times and bodies are drawn before the step, so the
client does no per-request work but sending."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import platform
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from carpool.bench.arrivals import read_trace
from carpool.bench.client_processes import ClientProcesses
from carpool.bench.loops import InProcess, LoadGenerator, Probe, event_loop, measure
from carpool.bench.options import Options, options_from
from carpool.bench.plan import Plan, Timing, plans
from carpool.bench.report.data import Report, ReportError, Step
from carpool.bench.report.display import Display, stdout_console
from carpool.bench.targets.base import BenchError, Client, is_url
from carpool.bench.targets.local_target import LocalTarget
from carpool.bench.targets.remote import client_for, connect, requests_for, stream_client_for
from carpool.loading import load_target, with_batching
from carpool.model import Model
from carpool.stepwise import StepwiseModel

if TYPE_CHECKING:
    from rich.console import RenderableType

__all__ = ["main"]


# ----------------------------------------------------------------------------- inputs


def _check_paths(args: argparse.Namespace) -> None:
    """Named files exist, outputs can be written, matplotlib is there for ``--plot``: the
    checks :func:`~carpool.bench.options.options_from` leaves to its caller (they look at
    the filesystem)."""
    for name in ("trace", "input_data", "strings"):
        path = getattr(args, name)
        if path and not Path(path).is_file():
            raise BenchError(f"--{name.replace('_', '-')} file {path!r} does not exist")
    for name, path in (("--json", args.json), ("--plot", args.plot)):
        if path and not Path(path).resolve().parent.is_dir():
            raise BenchError(f"cannot write {name} {path!r}: no such directory")
    _check_plot(args.plot)


def _check_plot(path: str | None) -> None:
    if path and importlib.util.find_spec("matplotlib") is None:
        raise BenchError("--plot needs matplotlib: pip install 'carpool[bench]'")


def _plans(options: Options) -> list[Plan]:
    """:func:`~carpool.bench.plan.plans`, with the ``--trace`` file read for it."""
    if options.mode != "trace":
        return plans(options)
    assert options.trace is not None
    try:
        trace = np.asarray(read_trace(options.trace), dtype=np.float64)
    except (OSError, ValueError) as exc:
        raise BenchError(f"--trace {options.trace!r}: {exc}") from None
    return plans(options, trace=trace)


# ----------------------------------------------------------------------------- running


@contextmanager
def _generator(client: Client, processes: int) -> Iterator[LoadGenerator]:
    if processes == 1:
        yield InProcess(client)
        return
    with ClientProcesses(client, processes) as pool:
        yield pool


async def _step(
    plan: Plan,
    generator: LoadGenerator,
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
    if options.kind == "grpc":
        from importlib.metadata import version

        info["grpc"] = f"grpcio {version('grpcio')}"
        info["connections"] = "one HTTP/2 channel per client process"
    elif is_url(options.target):
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
    report: Report, generator: LoadGenerator, probe: Probe, display: Display, options: Options
) -> Report:
    from carpool.bench.report.present import steps_table

    for plan in _plans(options):
        above = steps_table(report) if report.steps else None
        report.steps.append(await _step(plan, generator, probe, display, options, above))
    return report


async def _run_remote(options: Options, display: Display) -> Report:
    """A model behind a server: v2 over HTTP or gRPC, or an embeddings endpoint."""
    _plans(options)  # a bad trace file is a usage error before the server is asked anything
    async with connect(options) as target:
        client = (stream_client_for if options.stream else client_for)(target, options)
        report = _report(options, str(target), target.kind, target.name)
        with _generator(client, options.processes) as generator:
            return await _steps(report, generator, target, display, options)


async def _run_local(options: Options, model: Model, display: Display) -> Report:
    _plans(options)
    if isinstance(model, StepwiseModel) and options.stream:
        return await _run_stepwise(options, model, display)
    async with LocalTarget.serving(model, options.target) as target:
        _, requests = requests_for(target.metadata, options, batched=model.batching.batched)
        report = _report(options, str(target), target.kind, target.name, batching=_batching(model))
        return await _steps(report, InProcess(target.client(requests)), target, display, options)


async def _run_stepwise(options: Options, model: StepwiseModel, display: Display) -> Report:
    """``--stream`` in this process: each request a stream of the model's step batcher."""
    from carpool.bench.targets.step_target import StepTarget
    from carpool.bench.targets.stream_requests import stream_requests

    async with StepTarget.serving(model, options.target) as target:
        _, requests = requests_for(target.metadata, options, batched=model.batching.batched)
        client = target.client(stream_requests(requests, options))
        report = _report(options, str(target), target.kind, target.name, batching=_batching(model))
        return await _steps(report, InProcess(client), target, display, options)


async def _run_sweep(options: Options, model: Model, display: Display) -> Report:
    from carpool.bench.report.present import SweepResult, sweep_table
    from carpool.bench.sweep import Cell, grid, summary, sweep

    cells = grid(model, options.sizes, options.waits)
    if str(cells[0].model.batching.policy) == "eager" and len(options.waits) > 1:
        display.note(
            "note: the eager policy never waits, so --max-wait-ms changes nothing; "
            "add --policy fixed to sweep it"
        )
    plan = _plans(options)[0]

    async def run_cell(target: LocalTarget, cell: Cell, so_far: list[SweepResult]) -> Step:
        _, requests = requests_for(target.metadata, options, batched=True)
        prefix = f"max_batch_size={cell.max_batch_size} max_wait_ms={cell.max_wait_ms:g}  "
        above = sweep_table(so_far) if so_far else None
        generator = InProcess(target.client(requests))
        return await _step(plan, generator, target, display, options, above, prefix)

    results = await sweep(cells, options.target, run_cell)
    budget = options.p99_budget_ms
    display.show(sweep_table(results, p99_budget_ms=budget))
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


def _save(report: Report, options: Options, display: Display) -> None:
    if options.json:
        try:
            report.save(options.json)
        except OSError as exc:
            raise BenchError(f"cannot write --json {options.json!r}: {exc}") from None
        display.note(f"wrote {options.json}")
    if options.plot:
        from carpool.bench.report.plot import plot_report

        plot_report(report, options.plot)
        display.note(f"wrote {options.plot}")


def _compare(args: argparse.Namespace, display: Display) -> int:
    from carpool.bench.report.present import compare_table

    if args.target:
        raise BenchError("--compare reads reports written by --json; it takes no TARGET")
    if len(args.compare) < 2:
        raise BenchError("--compare needs two reports or more")
    _check_plot(args.plot)
    try:
        reports = [Report.load(path) for path in args.compare]
    except ReportError as exc:
        raise BenchError(str(exc)) from None
    display.show(compare_table(reports))
    if args.plot:
        from carpool.bench.report.plot import plot_compare

        plot_compare(reports, args.plot)
        display.note(f"wrote {args.plot}")
    return 0


def _load(options: Options) -> Model:
    """What ``carpool serve TARGET`` would serve, with the batching flags applied: loaded by
    :mod:`carpool.loading`, a target or setting it refuses a :class:`BenchError`."""
    try:
        model = with_batching(load_target(options.target), options.batching)
    except (TypeError, ValueError) as exc:  # ConfigError is a ValueError
        raise BenchError(str(exc)) from None
    if options.stream and not isinstance(model, StepwiseModel):
        raise BenchError(f"--stream needs a step-wise model; {options.target!r} answers whole")
    return model


def main(args: argparse.Namespace) -> int:
    """Run ``carpool bench``; 0 when the run completed (counted errors included), 2 on a
    usage error, reported in one line."""
    display = Display(stdout_console())
    try:
        if args.compare:
            return _compare(args, display)
        options = options_from(args, check_paths=_check_paths)
        model = None
        if not is_url(options.target):
            model = _load(options)
        with asyncio.Runner(loop_factory=event_loop()) as runner:
            if model is None:
                report = runner.run(_run_remote(options, display))
            elif options.sweep:
                report = runner.run(_run_sweep(options, model, display))
            else:
                report = runner.run(_run_local(options, model, display))
        if not options.sweep:
            display.report(report)
        _save(report, options, display)
    except BenchError as exc:
        sys.stderr.write(f"carpool bench: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("carpool bench: interrupted\n")
        return 130
    return 0
