"""What a person sees of ``carpool bench``: a live view of the running step on a terminal, then a
line per finished step, the tables, notes and ``wrote`` lines. All of the command's printing
is here; nothing here measures, sends or writes a file."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import BarColumn, Progress, TaskID, TextColumn

from carpool.bench.loops import LoadGenerator, ShareTally
from carpool.bench.plan import Plan, Timing, clock
from carpool.bench.report.data import Report, Step

__all__ = ["Display", "stdout_console"]

REFRESH_S = 0.25  # the live display's period: cheap next to the load it watches
LATE_SHARE = 0.01  # more late open-loop sends than this share is worth a warning


def stdout_console() -> Console:
    """The console the command prints to: standard output, sized for where it goes."""
    out = Console()
    if not out.is_terminal:  # a pipe or a log: wide enough that tables never wrap
        out = Console(width=max(out.width, 160))
    return out


class Display:
    """What a person sees: on a terminal, a live view of the running step (progress, the
    table so far); everywhere, one line per finished step."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live = console.is_terminal

    @asynccontextmanager
    async def showing(
        self, plan: Plan, timing: Timing, generator: LoadGenerator, above: RenderableType | None
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
        generator: LoadGenerator,
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
        """One line of plain text: no markup, no highlighting, as a file name is given."""
        self.console.print(text, highlight=False, markup=False)

    def show(self, renderable: RenderableType) -> None:
        """A table (or any rich renderable), as rich prints it."""
        self.console.print(renderable)

    def finished(self, step: Step, tallies: Sequence[ShareTally], prefix: str = "") -> None:
        text = (
            f"{prefix}{step.load}: {step.requests} requests, {step.ok} ok, "
            f"{step.throughput_rps:,.1f} req/s"
        )
        if step.latency is not None:
            text += f", p50 {step.latency.p50:.2f} ms, p99 {step.latency.p99:.2f} ms"
        streams = step.streams
        if streams is not None:
            text += f", {streams.outputs} outputs, {streams.outputs_per_s:,.1f} outputs/s"
            for name, times in (("TTFO", streams.ttfo), ("TPO", streams.tpo)):
                if times is not None:
                    text += f", {name} p50 {times.p50:.2f} ms p99 {times.p99:.2f} ms"
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

    def report(self, report: Report) -> None:
        """A finished run's table, and each step's batch sizes when the server gave them."""
        from carpool.bench.report.present import batch_histogram, steps_table

        self.console.print(steps_table(report))
        for step in report.steps:
            if step.server is not None and step.server.batches:
                line = f"batch sizes at {step.load}: {batch_histogram(step)}"
                self.console.print(line, highlight=False)
