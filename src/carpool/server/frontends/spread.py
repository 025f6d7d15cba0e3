"""The main process of ``carpool serve --frontends N``: the batchers, N front-end processes and
their lives. Front ends share the ports (``SO_REUSEPORT``) and are forked by the zygote; one
that dies is replaced after a pause that grows while they keep dying young. On SIGTERM or
SIGINT each drains, then the batchers close within the drain timeout; a second SIGINT kills."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from functools import partial
from multiprocessing import resource_tracker
from typing import Any, NoReturn

from carpool.errors import ConfigError
from carpool.ipc.transport import unlink_made_by
from carpool.server.config import ServerConfig
from carpool.server.frontends.hub import Hub
from carpool.server.frontends.tallies import Tallies
from carpool.server.frontends.zygote import Zygote
from carpool.server.lifecycle.registry import Registry, ServedModel

__all__ = ["bind", "serve_spread"]

log = logging.getLogger("carpool.server")
_YOUNG_S = 5.0  # a front end that dies sooner died young: the next one waits longer
_PAUSE_S = (0.0, 0.5, 1.0, 2.0, 5.0)  # the wait before a replacement, by deaths in a row
_BACKLOG = 2048  # uvicorn's
_STREAMS_END_S = 0.5  # past the drain's deadline: for front ends to send their streams' ends

# The front end's own main: (config, where the front ends count their answers, its number,
# its link, the models that failed).
Entry = Callable[[ServerConfig, Tallies, int, socket.socket, Any], NoReturn]


def bind(host: str, port: int, *, listen: bool) -> socket.socket:
    """A socket bound to ``host:port`` with ``SO_REUSEPORT``, so that every front end
    listens on the port with a socket of its own (the kernel spreads new connections among
    them; one socket shared by all would let whichever process woke first take them all).
    Without ``listen`` it only holds the port: taken by nothing else while the server
    lives, refusing connections once no front end listens. ConfigError when the port is
    taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        if listen:
            sock.listen(_BACKLOG)
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"cannot listen on {host}:{port} ({exc.strerror}); choose another port"
        ) from None
    return sock


def serve_spread(config: ServerConfig, entry: Entry) -> int:
    """Serve ``config`` with ``config.frontends`` front ends running ``entry``; the exit code."""
    ports = [config.port] + ([config.grpc_port] if config.grpc_port else [])
    reserved = [bind(config.host, port, listen=False) for port in ports]
    # One shared-memory tracker for every process: each segment is unlinked by its writer,
    # and whatever a killed process leaves is unlinked when the last of them ends.
    resource_tracker.ensure_running()
    # The front ends' counts, mapped before the zygote is forked: every front end shares it.
    names = [model.name for model in config.models if model.name is not None]
    tallies = Tallies(names, config.frontends)
    zygote = Zygote(partial(entry, config, tallies))
    try:
        registry = Registry(config.models, load_failures=config.unavailable)
        try:
            import uvloop

            factory: Any = uvloop.new_event_loop
        except ImportError:
            factory = None
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(_Primary(config, registry, zygote, tallies).run())
    finally:
        zygote.stop()
        for sock in reserved:
            sock.close()


class _Primary:
    def __init__(
        self, config: ServerConfig, registry: Registry, zygote: Zygote, tallies: Tallies
    ) -> None:
        self.config = config
        self.registry = registry
        self.hub = Hub(registry, tallies)
        self._zygote = zygote
        self._pids: dict[int, int] = {}  # front end -> pid
        self._born: dict[int, float] = {}  # front end -> when it started (monotonic)
        self._young_deaths: dict[int, int] = {}  # front end -> deaths in a row, young
        self._respawns: set[asyncio.Task[None]] = set()
        self._failures: list[Any] = []
        self._stop = asyncio.Event()
        self._all_gone = asyncio.Event()
        self._deadline: float | None = None  # monotonic; set when the drain begins

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._signal, sig)
        try:
            started = await self.registry.start()
        except ConfigError as exc:
            log.error("startup failed: %s", exc)
            return 2
        except Exception:
            log.exception("startup failed")
            return 1
        self.registry.ready = True
        self.registry.describe()
        self._failures = list(self.registry.load_failures.values())
        for index in range(1, self.config.frontends + 1):
            await self._spawn(index)
        config = self.config
        log.info("%d front ends serving on %s:%d", config.frontends, config.host, config.port)
        await self._stop.wait()
        await self._drain(started)
        return 0

    async def _spawn(self, index: int) -> None:
        if self._deadline is not None:
            return  # draining: no new front end
        pid, link = self._zygote.spawn(index, self._failures)
        self._pids[index] = pid
        self._born[index] = time.monotonic()
        await self.hub.attach(index, link, self._lost)

    def _lost(self, index: int) -> None:
        pid = self._pids.pop(index, None)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # its link is gone: so must it be
            unlink_made_by(pid)  # what it left in /dev/shm (a drained one left nothing)
        if self._deadline is not None:
            if not self._pids:
                self._all_gone.set()
            return
        young = time.monotonic() - self._born.get(index, 0.0) < _YOUNG_S
        deaths = self._young_deaths[index] = self._young_deaths.get(index, 0) + 1 if young else 0
        pause = _PAUSE_S[min(deaths, len(_PAUSE_S) - 1)]
        log.warning(
            "front end #%d (pid %s) ended; its connections are lost; starting another in %gs",
            index,
            pid,
            pause,
        )
        task = asyncio.get_running_loop().create_task(self._respawn(index, pause))
        self._respawns.add(task)
        task.add_done_callback(self._respawns.discard)

    async def _respawn(self, index: int, pause: float) -> None:
        await asyncio.sleep(pause)
        try:
            await self._spawn(index)
        except Exception:
            log.exception("front end #%d could not start", index)

    def _signal(self, sig: int) -> None:
        if self._deadline is not None:
            if sig == signal.SIGINT:  # a second Ctrl-C: stop waiting
                self._kill_front_ends(signal.SIGKILL)
            return
        log.info(
            "signal %s: draining %d front ends (up to %gs)",
            signal.Signals(sig).name,
            len(self._pids),
            self.config.drain_timeout_s,
        )
        self.registry.ready = False
        self._deadline = time.monotonic() + self.config.drain_timeout_s
        for task in self._respawns:
            task.cancel()
        self._kill_front_ends(signal.SIGTERM)
        if not self._pids:
            self._all_gone.set()
        self._stop.set()

    def _kill_front_ends(self, sig: int) -> None:
        for pid in self._pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    async def _end_streams(self) -> None:
        """The drain's deadline passed: end the streams still running with an error, which
        their front ends send, for up to :data:`_STREAMS_END_S`; kill what is left."""
        self.hub.end_streams()
        try:
            async with asyncio.timeout(_STREAMS_END_S):
                await self._all_gone.wait()
        except TimeoutError:
            log.warning("front ends still draining at the deadline: killed")
            self._kill_front_ends(signal.SIGKILL)

    async def _drain(self, started: list[ServedModel]) -> None:
        assert self._deadline is not None
        left = max(0.0, self._deadline - time.monotonic())
        try:
            async with asyncio.timeout(left):
                await self._all_gone.wait()
        except TimeoutError:
            await self._end_streams()
        left = max(0.0, self._deadline - time.monotonic())
        await self.registry.close(started, timeout=left)
        self.hub.close()
