"""The server's logs: one handler and format for every logger, and the access log, a
``carpool.access`` record per request. The access log is on by default, so it is built for the
hot path: no stack walk per record, and :class:`TurnHandler` writes a loop turn's lines in one
write. A warning or worse is written at once."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

__all__ = [
    "JsonFormatter",
    "TextFormatter",
    "TurnHandler",
    "access_log",
    "configure_logging",
    "log_access",
]

access_log = logging.getLogger("carpool.access")
_INFO = logging.INFO


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with the access log's fields as keys, for log pipelines."""

    _RESERVED = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "color_message"}

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update((k, v) for k, v in vars(record).items() if k not in self._RESERVED)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TurnHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that holds INFO and DEBUG records logged on a running event loop
    until the end of the loop's turn, then writes them in one write; anything else, or
    anything logged off a loop, is written at once after what is held."""

    def __init__(self, stream: Any = None) -> None:
        super().__init__(stream)
        self._held: list[logging.LogRecord] = []
        self._loop: asyncio.AbstractEventLoop | None = None  # whose turn's end writes them

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno <= _INFO:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
            if loop is not None and (not self._held or loop is self._loop):
                if not self._held:
                    self._loop = loop
                    loop.call_soon(self.flush)
                self._held.append(record)
                return
        self._write_held()  # first what came before: no line is reordered
        super().emit(record)

    def flush(self) -> None:
        """Write what is held, then flush the stream (also at ``logging.shutdown``)."""
        with self.lock:  # type: ignore[union-attr]
            self._write_held()
            super().flush()

    def _write_held(self) -> None:
        # Under the handler's lock (emit runs under it; flush takes it).
        held, self._held = self._held, []
        if not held:
            return
        lines = []
        for record in held:
            try:
                lines.append(self.format(record) + self.terminator)
            except Exception:
                self.handleError(record)
        try:
            self.stream.write("".join(lines))
        except Exception:
            self.handleError(held[-1])


class TextFormatter(logging.Formatter):
    """carpool's text lines: a message's control characters escaped (``\\n``, ``\\x1b``),
    so that nothing a client sends (a path with ``%0a``) can start a line of its own or
    steer a terminal. A traceback keeps its lines."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        message = record.message
        if not message.isprintable():
            record.message = "".join(c if c.isprintable() else _escaped(c) for c in message)
        return super().formatMessage(record)


def _escaped(character: str) -> str:
    return repr(character)[1:-1] if character != " " else character


def configure_logging(level: str, access_log_on: bool, log_format: str) -> None:
    """carpool's log handler and format; the CLI sets them before models load, so that what
    loading logs (a graph served without batching, say) reads like the rest."""
    handler = TurnHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    access_log.setLevel(logging.INFO if access_log_on else logging.WARNING)


def log_access(
    client: tuple[str, int] | None, method: str, path: str, status: int, started: float
) -> None:
    """One request's line: who asked what, its status, and how long it took from
    ``started`` (``time.perf_counter()``). Call it only when ``access_log`` is enabled for
    INFO. The record is ``Logger.info``'s, without the caller's file and line."""
    host, port = client or ("-", 0)
    duration_ms = round((time.perf_counter() - started) * 1000.0, 3)
    record = access_log.makeRecord(
        access_log.name,
        _INFO,
        "",
        0,
        '%s:%s "%s %s" %d %.2fms',
        (host, port, method, path, status, duration_ms),
        None,
        extra={
            "client": f"{host}:{port}",
            "method": method,
            "path": path,
            "status": status,
            "duration_ms": duration_ms,
        },
    )
    access_log.handle(record)
