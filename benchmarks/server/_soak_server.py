"""``soak``'s server side: one sample of the ``carpool serve`` process under soak (RSS, open
fds and the sockets among them, threads, CPU from ``/proc``; the event loop's tasks from
``/metrics``), and waiting until it is idle. Linux only.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from benchmarks.harness import processes as _process


@dataclass(frozen=True)
class Proc:
    """The server process as /proc and /metrics see it."""

    rss_mb: float
    fds: int
    sockets: int  # of the fds: the listening socket and one per client connection
    threads: int
    tasks: float
    cpu_s: float

    @property
    def files(self) -> int:
        """The fds that are not sockets: under load, flat exactly unless something leaks."""
        return self.fds - self.sockets


async def observe(scrape: aiohttp.ClientSession, server: _process.Server) -> Proc:
    async with scrape.get(server.base + "/metrics") as r:
        text = await r.text()
    gauge = "carpool_event_loop_tasks "
    tasks = [float(line.split()[1]) for line in text.splitlines() if line.startswith(gauge)]
    rss_mb, fds, sockets, threads = _from_proc(server.pid)
    cpu_s = _process.cpu_seconds(server.pid)
    return Proc(rss_mb, fds, sockets, threads, tasks[0] if tasks else float("nan"), cpu_s)


def _from_proc(pid: int) -> tuple[float, int, int, int]:
    """RSS in MB, open fds, the sockets among them, and threads of ``pid``."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    rss_mb = int(fields["VmRSS"].split()[0]) / 1024
    fds = sockets = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        fds += 1
        try:
            sockets += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except OSError:  # closed meanwhile
            pass
    return rss_mb, fds, sockets, int(fields["Threads"])


async def settle(scrape: aiohttp.ClientSession, server: _process.Server, fds: int) -> Proc:
    """The server idle: once its fds are back to ``fds`` (connections closed), or 10 s."""
    deadline = time.monotonic() + 10.0
    while True:
        proc = await observe(scrape, server)
        if proc.fds <= fds or time.monotonic() > deadline:
            return proc
        await asyncio.sleep(0.2)
