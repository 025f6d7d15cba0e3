"""What :mod:`carpool.server.rest.uvicorn_internals` relies on in uvicorn, uvloop and asyncio,
asserted against the installed versions, one assumption at a time: a release that changes one
fails here, naming the pin in ``pyproject.toml`` and the adapter to fix before the pin moves
(README, Development: moving a pin). The last test keeps every such reach inside the adapter.

The protocol is driven over a fake transport (bytes in, bytes out, no socket); the TLS
protocols, the signal handling and the server over real sockets and a subprocess.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import logging
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Iterator
from importlib.metadata import version
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import trustme
import uvicorn
import uvloop
from packaging.requirements import Requirement
from uvicorn.protocols.http.flow_control import service_unavailable
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from carpool.server.rest.uvicorn_internals import (
    UvicornProtocol,
    UvicornServer,
    answering,
    concurrency_limit,
    over_tls,
    rearm_keep_alive,
    set_extensions,
    tls_protocol_class,
)

ROOT = Path(__file__).resolve().parents[3]
ADAPTER = "src/carpool/server/rest/uvicorn_internals.py"
PINNED = ("uvicorn", "uvloop", "httptools")


def _pins() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found = {}
    for line in project["optional-dependencies"]["server"]:
        requirement = Requirement(line)
        if requirement.name in PINNED:
            found[requirement.name] = requirement
    return found


def relies(holds: bool, package: str, what: str) -> None:
    """Assert ``what`` of ``package``, saying which pin and which adapter it concerns."""
    pin = _pins()[package]
    assert holds, (
        f"{package} {version(package)} breaks what {ADAPTER} relies on: {what}. Fix the adapter "
        f"for it before moving the pin '{pin}' in pyproject.toml (README, Development)."
    )


# ----------------------------------------------------------------------------- the pins


@pytest.mark.parametrize("package", PINNED)
def test_the_installed_version_is_the_pinned_range(package: str) -> None:
    pin = _pins()[package]
    uppers = [s for s in pin.specifier if s.operator in ("<", "<=", "==", "~=")]
    lowers = [s for s in pin.specifier if s.operator in (">=", ">", "==", "~=")]
    assert uppers, f"{pin}: pin {package} with an upper bound (the next minor release)"
    assert lowers, f"{pin}: pin {package} with a lower bound (the release these tests ran on)"
    assert pin.specifier.contains(version(package)), (
        f"{package} {version(package)} is installed, outside the pin '{pin}' in pyproject.toml: "
        "run this file and tests/server/test_connection_limits.py on it, then move the pin "
        "(README, Development)"
    )


# ----------------------------------------------------------------------------- the protocol


class _Transport(asyncio.Transport):
    """A connection's transport without a socket: what is written, whether it is closed."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(
            name, default
        )

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class _App:
    """An ASGI app that answers 200 once ``release`` is set; the scopes it saw."""

    def __init__(self) -> None:
        self.scopes: list[dict[str, Any]] = []
        self.release = asyncio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.scopes.append(scope)
        await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


class _Recording(UvicornProtocol):
    answers = 0

    def answered(self) -> None:
        self.answers += 1


def _protocol(
    app: Any,
    *,
    limit: int | None = None,
    cls: type[UvicornProtocol] = _Recording,
    connect: bool = True,
) -> tuple[Any, _Transport, ServerState]:
    """A protocol made as uvicorn's server makes one (keyword arguments; its loop), connected
    to a fake transport unless not ``connect``."""
    config = uvicorn.Config(app, lifespan="off", log_config=None, limit_concurrency=limit)
    state = ServerState()
    loop = asyncio.get_running_loop()
    protocol = cls(config=config, server_state=state, app_state={}, _loop=loop)
    transport = _Transport()
    if connect:
        protocol.connection_made(transport)
    return protocol, transport, state


REQUEST = b"GET /x HTTP/1.1\r\nhost: test\r\n\r\n"


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_uvicorn_makes_its_protocol_with_these_arguments() -> None:
    params = inspect.signature(HttpToolsProtocol.__init__).parameters
    relies(
        list(params)[1:] == ["config", "server_state", "app_state", "_loop"],
        "uvicorn",
        f"HttpToolsProtocol(config, server_state, app_state, _loop), not {list(params)[1:]}",
    )
    source = inspect.getsource(uvicorn.Server.startup)
    relies(
        "config.http_protocol_class(" in source and "server_state=" in source,
        "uvicorn",
        "Server.startup calls Config(http=...) with keyword arguments (over_tls is a function)",
    )


async def test_the_protocol_keeps_transport_loop_and_counts_itself() -> None:
    protocol, transport, state = _protocol(_App())
    relies(protocol.transport is transport, "uvicorn", "connection_made keeps .transport")
    relies(protocol.loop is asyncio.get_running_loop(), "uvicorn", ".loop is the _loop given")
    relies(
        protocol.connections is state.connections and protocol in state.connections,
        "uvicorn",
        ".connections is the server state's set, and connection_made adds the protocol",
    )
    protocol.connection_lost(None)
    relies(protocol not in state.connections, "uvicorn", "connection_lost discards it")


async def test_extensions_set_as_a_head_begins_reach_the_app() -> None:
    app = _App()

    class Extending(_Recording):
        def on_message_begin(self) -> None:
            super().on_message_begin()
            set_extensions(self, {"carpool.test": {"n": 1}})

    protocol, _, _ = _protocol(app, cls=Extending)
    protocol.data_received(REQUEST)
    await _settle()
    relies(
        len(app.scopes) == 1 and app.scopes[0].get("extensions") == {"carpool.test": {"n": 1}},
        "uvicorn",
        "on_message_begin makes .scope, which the request's cycle passes to the app whole",
    )
    app.release.set()
    await _settle()


async def test_an_answer_is_answering_until_complete_then_answered_and_keep_alive_armed() -> None:
    app = _App()
    protocol, transport, _ = _protocol(app)
    relies(not answering(protocol), "uvicorn", ".cycle is None before a request")
    protocol.data_received(REQUEST)
    await _settle()
    relies(answering(protocol), "uvicorn", ".cycle.response_complete is False while answering")
    app.release.set()
    await _settle()
    relies(transport.written.startswith(b"HTTP/1.1 200"), "uvicorn", "the app's answer is written")
    relies(not answering(protocol), "uvicorn", ".cycle.response_complete once answered")
    relies(
        protocol.answers == 1,
        "uvicorn",
        "the cycle calls the protocol's on_response_complete once the answer is written",
    )
    timer = protocol.timeout_keep_alive_task
    relies(
        isinstance(timer, asyncio.TimerHandle),
        "uvicorn",
        "on_response_complete arms .timeout_keep_alive_task",
    )


async def test_bytes_cancel_keep_alive_and_rearm_keep_alive_arms_it_again() -> None:
    app = _App()
    app.release.set()
    protocol, transport, _ = _protocol(app)
    protocol.data_received(REQUEST)
    await _settle()
    protocol.data_received(b"G")  # the next request's first byte
    relies(
        protocol.timeout_keep_alive_task is None,
        "uvicorn",
        "data_received cancels the keep-alive timer and sets .timeout_keep_alive_task to None",
    )
    relies(
        isinstance(protocol.timeout_keep_alive, int | float) and not protocol.pipeline,
        "uvicorn",
        ".timeout_keep_alive (the seconds) and .pipeline (a sized queue) exist",
    )
    protocol.timeout_keep_alive = 0.01
    rearm_keep_alive(protocol)
    relies(isinstance(protocol.timeout_keep_alive_task, asyncio.TimerHandle), "uvicorn", "armed")
    await asyncio.sleep(0.05)
    relies(transport.closed, "uvicorn", "timeout_keep_alive_handler closes the connection")


async def test_a_pipelined_request_waits_in_pipeline_and_keep_alive_stays_off() -> None:
    app = _App()
    protocol, _, _ = _protocol(app)
    protocol.data_received(REQUEST + REQUEST)  # the second before the first is answered
    await _settle()
    relies(len(protocol.pipeline) == 1, "uvicorn", "a request pipelined waits in .pipeline")
    rearm_keep_alive(protocol)
    assert protocol.timeout_keep_alive_task is None  # pipelined requests wait: not armed
    app.release.set()
    await _settle()
    relies(len(app.scopes) == 2 and protocol.answers == 2, "uvicorn", "then it is started")


async def test_past_the_limit_uvicorn_picks_service_unavailable_which_overloaded_replaces() -> None:
    seen: list[str] = []

    async def past_limit(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["path"])
        await send({"type": "http.response.start", "status": 503, "headers": []})
        await send({"type": "http.response.body", "body": b"json"})

    class Limited(_Recording):
        overloaded = staticmethod(past_limit)

    relies(callable(service_unavailable), "uvicorn", "flow_control.service_unavailable exists")
    app = _App()
    app.release.set()
    # --limit-concurrency 1, and one connection open: the one asking, served.
    protocol, _, _ = _protocol(app, limit=concurrency_limit(1), cls=Limited)
    protocol.data_received(REQUEST)
    await _settle()
    relies(
        len(app.scopes) == 1 and not seen,
        "uvicorn",
        "limit_concurrency counts the connection asking: N + 1 serves N (concurrency_limit)",
    )
    # Another connection open besides it: past the limit, answered by `overloaded`.
    protocol.connections.add(object())
    protocol.data_received(REQUEST)
    await _settle()
    relies(
        seen == ["/x"] and len(app.scopes) == 1,
        "uvicorn",
        "past limit_concurrency, on_headers_complete passes service_unavailable to "
        "_start_asgi_task(cycle, app)",
    )
    assert concurrency_limit(0) is None  # no limit


async def test_a_malformed_request_is_answered_400_by_send_400_response() -> None:
    recorded: list[int] = []

    class Counting(_Recording):
        record = staticmethod(recorded.append)

    protocol, transport, _ = _protocol(_App(), cls=Counting)
    protocol.data_received(b"NOT HTTP AT ALL\r\n\r\n")
    relies(
        recorded == [400] and transport.written.startswith(b"HTTP/1.1 400") and transport.closed,
        "uvicorn",
        "a request httptools cannot parse goes to send_400_response, which answers and closes",
    )


async def test_shutdown_is_called_on_each_connection_and_the_drain_waits_for_them() -> None:
    config = uvicorn.Config(_App(), lifespan="off", log_config=None, timeout_graceful_shutdown=5)
    config.load()
    server = uvicorn.Server(config)
    server.servers = []
    server.lifespan = config.lifespan_class(config)
    loop = asyncio.get_running_loop()

    class Connection:
        told = False

        def shutdown(self) -> None:
            self.told = True
            loop.call_later(0.3, server.server_state.connections.discard, self)

    connection = Connection()
    server.server_state.connections.add(connection)  # type: ignore[arg-type]
    started = time.monotonic()
    await server.shutdown()
    relies(
        connection.told and time.monotonic() - started >= 0.25,
        "uvicorn",
        "Server.shutdown calls shutdown() on each of server_state.connections, then waits "
        "until that set is empty",
    )


async def test_a_handshaking_connection_counts_until_it_fails_and_a_drain_forgets_it() -> None:
    protocol, _, state = _protocol(_App(), connect=False)
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    protocol.handshaking(done)
    assert protocol in state.connections  # what limit_concurrency and the drain count
    done.set_exception(ssl.SSLError("no hello"))
    await _settle()
    assert protocol not in state.connections
    other, transport, state = _protocol(_App(), connect=False)
    other.handshaking(asyncio.get_running_loop().create_future())
    other.shutdown()  # the drain: nothing to wait for
    assert other not in state.connections
    other.connection_made(transport)  # its handshake ended after the drain began
    assert transport.closed


# ----------------------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def certificates() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(the server's context, a client's that trusts it)."""
    ca = trustme.CA()
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    return server, client


class _Echo(asyncio.Protocol):
    transport: Any  # the TLS protocol's app-side transport (uvloop's is no WriteTransport)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data.upper())


async def _tls_round_trip(contexts: tuple[ssl.SSLContext, ssl.SSLContext]) -> tuple[bytes, bool]:
    """A TLS server made of tls_protocol_class's protocol: an echo, then a stalled hello."""
    loop = asyncio.get_running_loop()
    handshakes: list[asyncio.Future[None]] = []
    second = asyncio.Event()  # the stalled connection was accepted

    def accepted() -> asyncio.BaseProtocol:
        waiter: asyncio.Future[None] = loop.create_future()
        handshakes.append(waiter)
        if len(handshakes) == 2:
            second.set()
        cls = tls_protocol_class(loop)
        return cls(loop, _Echo(), contexts[0], waiter, server_side=True, ssl_handshake_timeout=0.3)

    server = await loop.create_server(accepted, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=contexts[1])
        writer.write(b"hello")
        echoed = await asyncio.wait_for(reader.read(5), 5)
        writer.close()
        shook = handshakes[0].done() and handshakes[0].exception() is None
        stalled = socket.create_connection(("127.0.0.1", port))  # never says hello
        try:
            async with asyncio.timeout(5):
                await second.wait()
                failed = await asyncio.wait([handshakes[1]])
        finally:
            stalled.close()
        timed_out = handshakes[1].exception() is not None
        assert failed
        return echoed, shook and timed_out


@pytest.mark.parametrize(
    "loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"]
)
def test_the_loops_tls_protocols_are_made_as_over_tls_makes_them(
    loop_factory: Callable[[], asyncio.AbstractEventLoop],
    certificates: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    package = "uvloop" if loop_factory is uvloop.new_event_loop else "uvicorn"
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        try:
            echoed, shook = runner.run(_tls_round_trip(certificates))
        except TypeError as exc:
            relies(
                False, package, f"the loop's SSLProtocol(loop, app, context, waiter, ...): {exc}"
            )
    relies(
        echoed == b"HELLO" and shook,
        package,
        "the loop's SSLProtocol completes the handshake and sets the waiter, relays data, and "
        "fails the waiter of a handshake past ssl_handshake_timeout",
    )


def test_over_tls_is_called_as_uvicorn_calls_a_protocol_class() -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    factory = over_tls(_Recording, context, handshake_timeout_s=1.0)

    async def make() -> asyncio.BaseProtocol:
        config = uvicorn.Config(_App(), lifespan="off", log_config=None)
        loop = asyncio.get_running_loop()
        return factory(config=config, server_state=ServerState(), app_state={}, _loop=loop)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        made = runner.run(make())
    relies(
        type(made).__module__ == "uvloop.loop" and type(made).__name__ == "SSLProtocol",
        "uvloop",
        "uvloop.loop.SSLProtocol is the TLS protocol of uvloop's servers",
    )


# ----------------------------------------------------------------------------- the server


def test_the_server_state_it_reads_starts_false() -> None:
    server = uvicorn.Server(uvicorn.Config(_App(), log_config=None))
    for name in ("started", "should_exit", "force_exit"):
        relies(getattr(server, name, None) is False, "uvicorn", f"Server.{name} starts False")
    relies(
        "sockets" in inspect.signature(uvicorn.Server.run).parameters,
        "uvicorn",
        "Server.run(sockets=...) serves on sockets already bound",
    )
    relies(
        list(inspect.signature(uvicorn.Server._log_started_message).parameters)[1:]
        == ["listeners"],
        "uvicorn",
        "Server._log_started_message(listeners) logs the address, naming https after config.ssl",
    )


def test_a_signal_drains_without_ending_the_process_by_that_signal() -> None:
    # In a process of its own: were uvicorn to re-raise SIGTERM, it would end this one.
    script = (
        "import signal, uvicorn\n"
        "from carpool.server.rest.uvicorn_internals import UvicornServer\n"
        "heard = []\n"
        "class S(UvicornServer):\n"
        "    def on_signal(self, sig, *, first, forced):\n"
        "        heard.append((sig, first, forced))\n"
        "server = S(uvicorn.Config(None, log_config=None), tls=None)\n"
        "with server.capture_signals():\n"
        "    assert signal.getsignal(signal.SIGTERM) == server.handle_exit, 'not handle_exit'\n"
        "    signal.raise_signal(signal.SIGTERM)\n"
        "    signal.raise_signal(signal.SIGINT)\n"
        "print(heard, server.should_exit, server.force_exit)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    relies(
        done.returncode == 0,
        "uvicorn",
        "capture_signals installs handle_exit and re-raises only what uvicorn's own handle_exit "
        f"recorded (exit {done.returncode}: {done.stderr[-300:]})",
    )
    sigterm, sigint = int(signal.SIGTERM), int(signal.SIGINT)
    assert done.stdout.split("]")[0] == f"[({sigterm}, True, False), ({sigint}, False, True)"
    relies(done.stdout.strip().endswith("True True"), "uvicorn", "should_exit, then force_exit")


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def started_log() -> Iterator[_Kept]:
    """What uvicorn's server logs, at INFO, whatever carpool's logging did to its logger."""
    logger = logging.getLogger("uvicorn.error")
    kept, level = _Kept(), logger.level
    logger.addHandler(kept)
    logger.setLevel(logging.INFO)
    yield kept
    logger.removeHandler(kept)
    logger.setLevel(level)


def test_a_server_serves_the_protocol_names_https_and_stops(started_log: _Kept) -> None:
    app = _App()
    app.release.set()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, http=_Recording, lifespan="off", log_config=None
    )
    server = UvicornServer(config, tls=ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER))
    thread = threading.Thread(target=server.serve_to_end)  # no signals off the main thread
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started_up() and time.monotonic() < deadline:
            time.sleep(0.02)
        relies(server.started_up(), "uvicorn", "Server.started turns True once listening")
        port = server.servers[0].sockets[0].getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
            client.sendall(REQUEST)
            relies(client.recv(100).startswith(b"HTTP/1.1 200"), "uvicorn", "Config(http=cls)")
    finally:
        server.stop()
        thread.join(10)
    relies(not thread.is_alive() and server.stopping(), "uvicorn", "should_exit ends the server")
    relies(
        any("https://127.0.0.1:" in message for message in started_log.messages),
        "uvicorn",
        "the started message names the scheme after config.ssl",
    )
    assert config.ssl is None  # put back


def test_a_failed_startup_returns_without_having_started() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "lifespan.startup.failed", "message": "no"})

    server = UvicornServer(uvicorn.Config(app, port=0, lifespan="on", log_config=None), tls=None)
    thread = threading.Thread(target=server.serve_to_end)
    thread.start()
    thread.join(10)
    relies(
        not thread.is_alive() and not server.started_up(),
        "uvicorn",
        "a failed lifespan startup exits (SystemExit) with Server.started False",
    )


# ----------------------------------------------------------------------------- the fence

# Who may reach past a package's documented names, outside the adapter. decorator.py sits
# below the server's layers; asyncio._get_running_loop is in asyncio.__all__ (since 3.7), the
# check without an exception that its hot path needs.
PUBLIC = {
    "uvicorn": {"Config"},
    "uvloop": {"new_event_loop", "Loop", "EventLoopPolicy", "install", "run"},
    # asyncio's names, less its modules (sslproto, base_events...) and what starts with _
    "asyncio": {
        name
        for name, value in vars(asyncio).items()
        if not name.startswith("_") and not isinstance(value, ModuleType)
    },
}
OUTSIDE = {("carpool/decorator.py", "asyncio._get_running_loop")}


def _reaches(path: Path) -> Iterator[str]:
    """What ``path`` takes of uvicorn, uvloop, httptools or asyncio beyond ``PUBLIC``."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if alias.name == "httptools" or (top in PUBLIC and "." in alias.name):
                    yield f"import {alias.name}"
        elif isinstance(node, ast.ImportFrom) and node.module:
            top = node.module.split(".")[0]
            if top == "httptools" or (top in PUBLIC and "." in node.module):
                yield f"from {node.module} import ..."
            elif top in PUBLIC:
                for alias in node.names:
                    if alias.name not in PUBLIC[top]:
                        yield f"from {top} import {alias.name}"
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            package, name = node.value.id, node.attr
            if package in PUBLIC and name not in PUBLIC[package]:
                yield f"{package}.{name}"


def test_no_module_but_the_adapter_reaches_into_their_internals() -> None:
    src = ROOT / "src"
    adapter = ROOT / ADAPTER
    found = [
        f"{path.relative_to(src)}: {reach}"
        for path in sorted((src / "carpool").rglob("*.py"))
        if path != adapter
        for reach in _reaches(path)
        if (str(path.relative_to(src)), reach) not in OUTSIDE
    ]
    assert not found, f"move these into {ADAPTER}, with a test here: {found}"
