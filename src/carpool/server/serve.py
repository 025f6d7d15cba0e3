"""Process lifecycle: bind, serve, and on SIGTERM/SIGINT drain and exit 0. On a signal readiness
turns false, the listening socket closes, received requests are answered and batchers finish
what they accepted; past ``drain_timeout_s`` the rest is cut off, so exit comes in bounded
time. uvicorn's internals: :mod:`carpool.server.rest.uvicorn_internals`."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import os
import signal
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, NoReturn

import uvicorn

from carpool.errors import ConfigError
from carpool.ipc.lifelines import set_title
from carpool.ipc.transport import sweep_orphans
from carpool.loading import LoadFailure
from carpool.server.auth import ApiKeys
from carpool.server.config import ServerConfig
from carpool.server.frontends.remote import FrontEndRegistry, Upstream
from carpool.server.frontends.spread import bind, serve_spread
from carpool.server.frontends.tallies import Tallies
from carpool.server.inference.cache import ResponseCache
from carpool.server.inference.path import Inference
from carpool.server.lifecycle.control import ModelControl
from carpool.server.lifecycle.registry import Registry, ServedModel
from carpool.server.rest.app import App
from carpool.server.rest.connections import protocol_class
from carpool.server.rest.uvicorn_internals import UvicornServer, concurrency_limit, over_tls
from carpool.server.telemetry.logs import configure_logging

if TYPE_CHECKING:
    from carpool.server.grpc.service import GrpcServer

__all__ = ["build_app", "serve"]

log = logging.getLogger("carpool.server")
# The collector's young generation holds 10,000 objects before it is scanned, not Python's
# 700: a request allocates dozens, so at 700 a scan ran every few requests and walked the
# ones in flight (which then survived into the older generations, to be walked again). It
# cost about a fifth of a binary request's CPU at 64 clients (38 -> 31 us in process). Only
# cyclic garbage waits longer; what refcounting frees is still freed at once.
_GC_THRESHOLDS = (10_000, 10, 10)
# After uvicorn's whole-second drain: _after_drain's second for threads to end, and room for
# the batchers' workers to be stopped; past it, something hangs the main thread.
_LAST_RESORT_S = 3.0


def _loop() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def build_app(config: ServerConfig, registry: Registry | None = None) -> App:
    """The REST app for ``config``, holding the gRPC server when ``grpc_port`` is not 0;
    over ``registry`` (a front end's), else a registry of ``config``'s models."""
    if registry is None:
        registry = Registry(config.models, load_failures=config.unavailable)
    if config.model_control_mode != "none" or any(m.response_cache for m in config.models):
        registry.cache = ResponseCache(config.cache_size)  # models loaded later may use it
    inference = Inference(registry)
    api_keys = ApiKeys(config.api_keys) if config.api_keys else None
    control = _control(config, registry)
    grpc = _grpc_server(config, inference, api_keys, control) if config.grpc_port else None
    return App(
        inference,
        max_body_bytes=config.max_body_bytes,
        drain_timeout_s=config.drain_timeout_s,
        control=control,
        grpc=grpc,
        api_keys=api_keys,
        metrics_need_key=config.metrics_need_key,
        body_timeout_s=config.body_timeout_s,
        max_client_batch_size=config.max_client_batch_size,
    )


def _control(config: ServerConfig, registry: Registry) -> ModelControl | None:
    """Model control over ``registry``, unless the models are fixed at start (mode none);
    the models it loads are served as those loaded at start (``config.served``)."""
    if config.model_control_mode == "none" or config.catalog is None:
        return None
    return ModelControl(
        registry,
        config.catalog,
        mode=config.model_control_mode,
        poll_s=config.repository_poll_secs,
        settle_s=config.repository_poll_settle_secs,
        drain_timeout_s=config.drain_timeout_s,
        serve=lambda model: ServedModel(config.served(model)),
    )


def _grpc_server(
    config: ServerConfig,
    inference: Inference,
    api_keys: ApiKeys | None,
    control: ModelControl | None,
) -> GrpcServer:
    # Imported here, and only here: grpc and tritonclient load only when the gRPC port is
    # on. (grpc_service imports neither this module nor the app: no cycle.)
    from carpool.server.grpc.service import GrpcServer

    tls = None  # REST's certificate, if it has one
    if config.ssl_certfile and config.ssl_keyfile:
        tls = (config.ssl_certfile, config.ssl_keyfile)
    return GrpcServer(
        inference,
        _address(config.host, config.grpc_port),
        max_message_bytes=config.max_body_bytes,  # REST's body limit, for gRPC's messages
        api_keys=api_keys,
        tls=tls,
        share_port=config.frontends > 1,  # every front end listens on the one port
        max_concurrent_rpcs=config.grpc_max_concurrent_rpcs,
        control=control,
    )


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # an IPv6 host in brackets


class _Server(UvicornServer):
    """uvicorn's server, ending 0 on a signal (:class:`UvicornServer`), but a signal flips
    readiness first, and the drain is bounded."""

    def __init__(self, config: uvicorn.Config, app: App, tls: ssl.SSLContext | None) -> None:
        super().__init__(config, tls=tls)
        self._app = app

    def on_signal(self, sig: int, *, first: bool, forced: bool) -> None:
        self._app.begin_drain()
        if forced:
            return  # a second Ctrl-C: the drain stops waiting for connections
        log.info(
            "signal %s: draining (up to %.0fs)",
            signal.Signals(sig).name,
            self.config.timeout_graceful_shutdown or 0,
        )
        if first:
            _exit_at_the_latest((self.config.timeout_graceful_shutdown or 0) + _LAST_RESORT_S)


def _exit_at_the_latest(after_s: float) -> None:
    """The last resort behind the drain's bound: exit 0 ``after_s`` from now, whatever the
    main thread still waits on (the drain and :func:`_after_drain` end before it when
    nothing hangs; something that does, a model's code or a file in its thread, say, is
    named in the log and abandoned)."""

    def fire() -> None:
        alive = [t.name for t in threading.enumerate() if t is not threading.current_thread()]
        log.error("the drain did not end within %gs; exiting anyway (threads: %s)", after_s, alive)
        _exit_now(0)

    timer = threading.Timer(after_s, fire)
    timer.name = "carpool-exit-deadline"
    timer.daemon = True
    timer.start()


def _stuck_threads(within_s: float) -> list[str]:
    """Threads that would keep the process alive, after giving idle pool workers (told to
    stop when their batcher closed) ``within_s`` to notice and exit."""
    deadline = time.monotonic() + within_s
    others = [t for t in threading.enumerate() if not t.daemon and t is not threading.main_thread()]
    for thread in others:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [t.name for t in others if t.is_alive()]


def serve(config: ServerConfig) -> NoReturn:
    """Run the server until a signal, then end the process with its exit code."""
    configure_logging(config.log_level, config.access_log, config.log_format)
    swept = sweep_orphans()
    if swept:
        log.warning("removed %d shared-memory segments left by dead processes", len(swept))
    if config.frontends > 1:
        try:
            code = serve_spread(config, _front_end)
        except ConfigError as exc:  # the port is taken
            log.error("startup failed: %s", exc)
            code = 2
        _exit_now(_after_drain(code))
    app = build_app(config)
    server = _server(app, config)
    _run(server)
    # A start that failed on settings (no model could start: Ray unreachable, say) is a
    # usage error, like a bad flag: 2.
    code = 0 if server.started_up() else 2 if isinstance(app.startup_error, ConfigError) else 1
    _exit_now(_after_drain(code))


def _front_end(
    config: ServerConfig,
    tallies: Tallies,
    index: int,
    link: socket.socket,
    failures: list[LoadFailure],
) -> NoReturn:
    """A front-end process (forked by the zygote): the whole server, listening on the
    ports beside the other front ends, its models' batchers the main process's, over
    ``link``; its answers counted in its slot of ``tallies``."""
    set_title(f"carpool: frontend#{index}", f"frontend#{index}")
    listening = bind(config.host, config.port, listen=True)
    upstream = Upstream()
    tally = tallies.slot(index)
    app = build_app(config, FrontEndRegistry(config.models, failures, upstream, link, tally))
    server = _server(app, config, sent=tally.commit)
    upstream.on_lost = partial(_main_gone, server)
    _run(server, sockets=[listening])
    _exit_now(0 if server.started_up() else 1)


def _main_gone(server: _Server) -> None:
    """The main process is gone: nothing is left to serve; drain (every request in flight
    was answered 503 as the link went) and end. (At the front end's own end, it closed
    the link itself: nothing to do.)"""
    if not server.stopping():
        log.error("the server's main process is gone: this front end ends")
        server.stop()


def _server(app: App, config: ServerConfig, *, sent: Callable[[], None] | None = None) -> _Server:
    """uvicorn's server of ``app``; ``sent()`` after each HTTP answer is written."""
    protocol = protocol_class(
        header_timeout_s=config.header_timeout_s,
        limit_concurrency=config.limit_concurrency,
        write_timeout_s=config.body_timeout_s,  # a stalled reader, as a stalled writer
        record=app.recorder.server("http"),  # answers no app saw
        sent=sent,
    )
    http: type[asyncio.Protocol] = protocol
    tls = None
    if config.ssl_certfile and config.ssl_keyfile:
        # What uvicorn's own settings made. The protocol does TLS, not uvicorn (whose loop
        # waited 60 s for a handshake, uncounted by --limit-concurrency): a handshake gets
        # --header-timeout's seconds, and counts from accept (uvicorn_internals.over_tls).
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(config.ssl_certfile, config.ssl_keyfile)
        http = over_tls(protocol, tls, handshake_timeout_s=config.header_timeout_s)
    uv_config = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        loop=_loop(),
        http=http,
        limit_concurrency=concurrency_limit(config.limit_concurrency),
        timeout_keep_alive=5,  # uvicorn's default: an idle keep-alive connection closes
        lifespan="on",
        access_log=False,  # carpool's own access log, with model latency, replaces it
        log_level=config.log_level,
        log_config=None,  # uvicorn's loggers go through carpool's handler and format
        timeout_graceful_shutdown=math.ceil(config.drain_timeout_s),
        server_header=False,
    )
    return _Server(uv_config, app, tls)


def _run(server: _Server, sockets: list[socket.socket] | None = None) -> None:
    """Serve until a signal and its drain: on ``sockets``, else on the configured port."""
    # The models' weights, tokenizers and modules live as long as the process: out of the
    # collector's sight, a full collection does not walk them (on minilm, walking them
    # paused every request in flight for 100-160 ms, every ~12 s).
    gc.freeze()
    gc.set_threshold(*_GC_THRESHOLDS)
    server.serve_to_end(sockets)  # a failed startup too: the caller says why


def _after_drain(code: int) -> int:
    stuck = _stuck_threads(within_s=1.0)
    if stuck:
        # A model call that never returned: its worker thread would keep the interpreter
        # from exiting, and the drain already answered its requests with 503.
        log.error("model calls still running in %s after the drain; exiting anyway", stuck)
    return code


def _exit_now(code: int) -> NoReturn:
    """End the process once everything is drained: the logs are flushed, then the
    interpreter's own teardown is skipped. Native libraries' static destructors
    (onnxruntime's and torch's thread pools) can abort that teardown ("terminate called
    without an active exception", SIGABRT), turning a clean drain into exit code -6 for the
    process supervisor. What the process opened is closed by its owners before this: the
    app's shutdown (or its failed startup) closed every batcher it started, and with them
    their worker processes and Ray actors; so no atexit handler is left with work to do."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken pipe: nothing to flush
            stream.flush()
    os._exit(code)
