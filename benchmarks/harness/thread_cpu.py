"""CPU seconds of a process tree, thread by thread, from ``/proc`` (not a benchmark itself).

Owns: one reading of every thread of a server process and its descendants
(``/proc/<pid>/task/<tid>/stat`` utime + stime, named by ``/proc/<pid>/task/<tid>/comm``),
and the CPU each named thread used between two readings. Linux only; reads files, starts
nothing, prints nothing.

A thread is named ``comm`` (its process's ``comm`` first when it is not the server's
own process), its process's first thread ``main``; threads sharing a name are summed
(``python3 x3``: the threads Python starts all carry the interpreter's name). A thread that
started during the window counts from 0; one that ended in it is lost (its CPU cannot be
read any more), so the totals are lower bounds.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")  # /proc's CPU times are in clock ticks (10 ms)

Reading = dict[tuple[int, int], tuple[str, float]]  # (pid, tid) -> (name, CPU seconds)


def _stat_fields(path: Path) -> list[str]:
    # After the last ")": comm may hold spaces and parentheses.
    return path.read_text().rsplit(")", 1)[1].split()


def descendants(pid: int) -> list[int]:
    """``pid`` and every live process below it (found by parent pid, one scan of /proc)."""
    parents: dict[int, int] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                parents[int(proc.name)] = int(_stat_fields(proc / "stat")[1])
            except (OSError, IndexError, ValueError):
                continue
    tree, frontier = [pid], [pid]
    while frontier:
        frontier = [child for child, parent in parents.items() if parent in frontier]
        tree += frontier
    return tree


def read(pid: int) -> Reading:
    """Every thread of ``pid``'s process tree: its name and CPU seconds so far."""
    reading: Reading = {}
    for proc in descendants(pid):
        try:
            process = (Path(f"/proc/{proc}") / "comm").read_text().strip()
            tasks = list(Path(f"/proc/{proc}/task").iterdir())
        except OSError:
            continue  # ended since the scan
        for task in tasks:
            try:
                fields = _stat_fields(task / "stat")
                comm = (task / "comm").read_text().strip()
            except (OSError, IndexError):
                continue
            tid = int(task.name)
            name = "main" if tid == proc else comm
            if proc != pid:
                name = f"{process}/{name}"
            reading[(proc, tid)] = (name, (int(fields[11]) + int(fields[12])) * TICK_S)
    return reading


def used(before: Reading, after: Reading) -> dict[str, float]:
    """CPU seconds each named thread used between two readings, by name, most first; a
    name shared by several threads is summed and labelled with their number."""
    seconds: dict[str, float] = {}
    threads: Counter[str] = Counter()
    for key, (name, cpu) in after.items():
        seconds[name] = seconds.get(name, 0.0) + cpu - before.get(key, (name, 0.0))[1]
        threads[name] += 1
    return {
        (name if threads[name] == 1 else f"{name} x{threads[name]}"): s
        for name, s in sorted(seconds.items(), key=lambda item: -item[1])
    }


def top(per_thread: Mapping[str, float], n: int, scale: float) -> str:
    """The ``n`` busiest threads (``per_thread`` most first), ``name value`` with values
    times ``scale``, rounded; those that round to 0 left out."""
    shown = [(name, s * scale) for name, s in list(per_thread.items())[:n]]
    return ", ".join(f"{name} {value:.0f}" for name, value in shown if round(value) > 0)
