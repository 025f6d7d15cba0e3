"""Model control (``--model-control-mode``), as Triton does it: models loaded, reloaded and
unloaded while the server serves. ``explicit``: a load warms the new version up before traffic
moves, the replaced one drains, and a failed load leaves it serving. ``poll``: a repository
folder that changed and stayed the same for ``settle_s`` loads, reloads or unloads. Model code
and files are read in daemon threads (:func:`_off_loop`), never on the loop."""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from carpool.errors import ConfigError, WorkerStartError
from carpool.loading import Catalog
from carpool.loading.catalog import read_version
from carpool.server.failures import ControlUnavailable, LoadFailed
from carpool.server.lifecycle import watch
from carpool.server.lifecycle.load_config import check_unload, load_overrides
from carpool.server.lifecycle.registry import Registry, ServedModel

__all__ = ["CONTROL_OFF", "ControlUnavailable", "LoadFailed", "ModelControl", "act"]

log = logging.getLogger("carpool.server")
T = TypeVar("T")
_LOOK_WAIT_S = 10.0  # a look at the repository waited for at most this long per poll
CONTROL_OFF = (
    "explicit model load / unload is not allowed: start the server with "
    "--model-control-mode explicit"
)


async def act(
    control: ModelControl | None, name: str, action: str, parameters: Mapping[str, Any]
) -> None:
    """A load or unload request (``action``) for ``name`` with its ``parameters``, as REST
    and gRPC both receive it; ``control`` None: the server has no model control (503)."""
    if control is None:
        raise ControlUnavailable(CONTROL_OFF)
    if action == "load":
        await control.load(name, load_overrides(parameters, name))
    else:
        check_unload(parameters)
        await control.unload(name)


class ModelControl:
    """Loads and unloads the models of ``catalog`` into ``registry`` while serving, in
    ``mode`` ``explicit`` or ``poll`` (see the module docstring). A replaced or unloaded
    version gets ``drain_timeout_s`` to finish what it accepted. Loads and unloads of one
    model run one at a time; an unloaded model shows ``UNLOADING``, then ``UNAVAILABLE``,
    and its requests are 404s. In ``poll`` mode the load and unload routes answer 503."""

    def __init__(
        self,
        registry: Registry,
        catalog: Catalog,
        *,
        mode: str,
        poll_s: float = 15.0,
        settle_s: float = 0.0,
        drain_timeout_s: float = 30.0,
        serve: Callable[[Any], ServedModel] = ServedModel,
    ) -> None:
        self.registry = registry
        self.catalog = catalog
        self.mode = mode
        self.poll_s = poll_s
        self.settle_s = settle_s
        self.drain_timeout_s = drain_timeout_s
        self._serve = serve
        self._locks: dict[str, asyncio.Lock] = {}
        self._closing = False
        self._poller: asyncio.Task[None] | None = None
        self._applied: dict[str, watch.Fingerprint] = {}  # poll: folders as last acted on
        self._seen: dict[str, watch.Fingerprint] = {}  # poll: folders at the last look
        self._look: asyncio.Future[dict[str, watch.Fingerprint]] | None = None  # under way
        self._unread: set[str] = set()  # poll: files not read (not regular), logged once
        self._changed_at: dict[str, float] = {}  # poll: when each folder last looked different
        registry.known = catalog.names
        registry.needs_a_model = mode == "none"

    # ------------------------------------------------------------- the routes

    async def load(self, name: str, overrides: Mapping[str, Any] | None = None) -> None:
        """Load (or reload) ``name``, with ``overrides`` over its settings: returns once
        the new version serves and the one before has drained."""
        self._check_explicit()
        if name not in self.catalog.names():
            raise LoadFailed(name, "no such model in the model repository")
        await self.load_now(name, overrides)

    async def unload(self, name: str) -> None:
        """Stop serving ``name``: returns once it has drained and its workers are gone."""
        self._check_explicit()
        known = self.registry.find(name) is not None or name in self.registry.load_failures
        if not known and name not in self.catalog.names():  # a served model's folder may be gone
            raise LoadFailed(name, "no such model in the model repository", action="unload")
        await self.unload_now(name)

    def _check_explicit(self) -> None:
        if self._closing:
            raise ControlUnavailable("the server is stopping")
        if self.mode != "explicit":
            raise ControlUnavailable(
                "explicit model load / unload is not allowed if polling is enabled"
                if self.mode == "poll"
                else CONTROL_OFF
            )

    # ------------------------------------------------------------- the work

    async def load_now(self, name: str, overrides: Mapping[str, Any] | None = None) -> None:
        async with self._lock(name):
            old = self.registry.find(name)
            if old is None:
                self.registry.mark(name, self._version(name), "LOADING")
            try:
                served = await self._start(name, overrides)
            except LoadFailed as failed:
                if old is None:
                    self.registry.fail(name, failed.reason, self._version(name))
                log.error("%s", failed)
                raise
            replaced = self.registry.put(served)
            self._forget(name)
            log.info(
                "%s model %r: %s", "reloaded" if replaced else "loaded", name, served.describe()
            )
            if replaced is not None:
                await self._drain(replaced)

    async def unload_now(self, name: str) -> None:
        async with self._lock(name):
            served = self.registry.remove(name)
            if served is None:
                self.registry.mark(name, self._version(name), "UNAVAILABLE", "unloaded")
                return
            self.registry.mark(name, served.version, "UNLOADING")
            self._forget(name)
            try:
                await self._drain(served)
            finally:
                self.registry.mark(name, served.version, "UNAVAILABLE", "unloaded")
                self.catalog.release(name)
                del served
                gc.collect()  # a model's objects in cycles go now, not at some later scan
            log.info("unloaded model %r", name)

    async def _start(self, name: str, overrides: Mapping[str, Any] | None) -> ServedModel:
        """The new version, loaded (in a thread: reading and building a model blocks),
        started and warmed up; :class:`LoadFailed` says why not."""
        try:
            model = await _off_loop(f"carpool-load {name}", self.catalog.load, name, overrides)
            served = self._serve(model)
        except (ConfigError, TypeError, ValueError) as exc:
            raise LoadFailed(name, str(exc)) from None
        try:
            await served.batcher.__aenter__()
        except WorkerStartError as exc:
            raise LoadFailed(name, exc.reason) from None
        return served

    async def _drain(self, served: ServedModel) -> None:
        """``served``, out of the registry: the requests on their way to it reach it, it
        finishes its queue and batches, and its workers stop."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_timeout_s
        await served.retire(timeout=self.drain_timeout_s)
        await served.batcher.aclose(timeout=max(0.0, deadline - loop.time()))

    def _forget(self, name: str) -> None:
        if self.registry.cache is not None:
            self.registry.cache.drop(name)

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    def _version(self, name: str) -> str:
        folder = self.catalog.folder(name)
        return read_version(folder) if folder is not None else "1"

    # ------------------------------------------------------------- polling

    def start(self) -> None:
        """Begin (in ``poll`` mode) looking at the repository, from how it is now."""
        if self.mode != "poll":
            return
        # On the loop, as the repository's models were read at start: a file that is not
        # regular is never opened (watch.fingerprint), so no named pipe blocks it.
        self._seen = watch.fingerprints(self.catalog.folders())
        self._applied = dict(self._seen)
        self._poller = asyncio.get_running_loop().create_task(self._poll())

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                await self.poll_once()
            except Exception:  # a look that failed is tried again at the next
                log.exception("looking at the model repository failed")

    async def poll_once(self) -> None:
        """Act on the repository's changes that have settled since the last look."""
        now = await self._looked()
        if now is None:
            return
        changes = watch.settled(self._applied, self._seen, now)
        looked = asyncio.get_running_loop().time()
        for name in now:
            if now[name] != self._seen.get(name):
                self._changed_at[name] = looked
        self._seen = now
        for name in changes.unload:
            self._applied.pop(name, None)
            await self.unload_now(name)
        for name in changes.load:
            if looked - self._changed_at.get(name, -math.inf) < self.settle_s:
                continue  # still settling: loaded at a later look, if it stays the same
            self._applied[name] = now[name]
            try:
                await self.load_now(name)
            except LoadFailed:
                pass  # logged, shown in the index; tried again when the folder changes

    async def _looked(self) -> dict[str, watch.Fingerprint] | None:
        """The repository's fingerprints, read off the loop; None when the look (a slow or
        hung file system) takes over ``_LOOK_WAIT_S``: it is waited for again at the next
        poll, never started twice."""
        if self._look is None:
            folders = self.catalog.folders
            self._look = asyncio.ensure_future(
                _off_loop("carpool-poll", lambda: watch.fingerprints(folders()))
            )
        done, _ = await asyncio.wait({self._look}, timeout=_LOOK_WAIT_S)
        if not done:
            log.warning("looking at the model repository took over %gs; waiting on", _LOOK_WAIT_S)
            return None
        look, self._look = self._look, None
        now = look.result()
        for name, files in now.items():
            for path, *_, digest in files:
                where = f"{name}/{path}"
                if digest == watch.NOT_READ and where not in self._unread:
                    self._unread.add(where)
                    log.warning("model repository: %s is not a regular file; not read", where)
        return now

    async def close(self, *, timeout: float | None = None) -> None:  # noqa: ASYNC109 - a drain bound
        """Stop taking loads and unloads, and stop polling; wait for those under way, for
        up to ``timeout`` seconds (a model's import that never returns is abandoned)."""
        self._closing = True
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        if self._look is not None:
            self._look.cancel()

        async def finished() -> None:
            for lock in list(self._locks.values()):
                async with lock:
                    pass

        try:
            await asyncio.wait_for(finished(), timeout)
        except TimeoutError:
            busy = sorted(name for name, lock in self._locks.items() if lock.locked())
            log.error("loads or unloads still under way at the drain deadline: %s", busy)


async def _off_loop(name: str, call: Callable[..., T], *args: Any) -> T:
    """``call(*args)`` in a daemon thread called ``name``: the loop goes on meanwhile, and
    nothing waits for the thread at exit (asyncio.to_thread's executor is joined, without a
    bound, as asyncio.run ends and again at interpreter exit). Cancelled, the caller stops
    waiting; the thread runs on, its result dropped."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        try:
            result = call(*args)
        except BaseException as exc:  # handed to the caller, whatever it is
            outcome: tuple[T | None, BaseException | None] = (None, exc)
        else:
            outcome = (result, None)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop closed: nobody waits any more
            pass

    threading.Thread(target=run, name=name, daemon=True).start()
    return await future
