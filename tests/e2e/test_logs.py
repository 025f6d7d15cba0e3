"""The server's logs: lines a loop turn logs written together, in order; the access log's
record and its JSON form."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from carpool.server.telemetry.logs import (
    JsonFormatter,
    TextFormatter,
    TurnHandler,
    access_log,
    log_access,
)
from server.conftest import Launcher


class Stream:
    """A stream that keeps each write apart."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> None:
        self.writes.append(text)

    def flush(self) -> None:
        pass

    def lines(self) -> list[str]:
        return "".join(self.writes).splitlines()


@pytest.fixture
def logged() -> Iterator[tuple[logging.Logger, Stream, TurnHandler]]:
    stream = Stream()
    handler = TurnHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("carpool.test_logs")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    yield logger, stream, handler
    logger.handlers.clear()


async def test_lines_of_one_loop_turn_are_written_in_one_write_at_its_end(
    logged: tuple[logging.Logger, Stream, TurnHandler],
) -> None:
    logger, stream, _ = logged
    for n in range(3):
        logger.info("line %d", n)
    assert stream.writes == []  # held until the turn ends
    await asyncio.sleep(0)
    assert stream.writes == ["INFO line 0\nINFO line 1\nINFO line 2\n"]
    logger.info("next turn")
    await asyncio.sleep(0)
    assert stream.writes[1:] == ["INFO next turn\n"]


async def test_a_warning_goes_at_once_after_what_is_held(
    logged: tuple[logging.Logger, Stream, TurnHandler],
) -> None:
    logger, stream, _ = logged
    logger.info("first")
    logger.warning("then this")
    assert stream.lines() == ["INFO first", "WARNING then this"]
    await asyncio.sleep(0)
    assert stream.lines() == ["INFO first", "WARNING then this"]  # nothing written twice


async def test_a_line_from_another_thread_goes_at_once_after_what_is_held(
    logged: tuple[logging.Logger, Stream, TurnHandler],
) -> None:
    logger, stream, _ = logged
    logger.info("on the loop")
    thread = threading.Thread(target=logger.info, args=("off any loop",))
    thread.start()
    thread.join()
    assert stream.lines() == ["INFO on the loop", "INFO off any loop"]


def test_off_a_loop_lines_go_at_once(logged: tuple[logging.Logger, Stream, TurnHandler]) -> None:
    logger, stream, _ = logged
    logger.info("no loop")
    assert stream.writes == ["INFO no loop\n"]


async def test_flush_writes_what_is_held(
    logged: tuple[logging.Logger, Stream, TurnHandler],
) -> None:
    logger, stream, handler = logged
    logger.debug("held")
    handler.flush()  # what logging.shutdown() does before the process exits
    assert stream.writes == ["DEBUG held\n"]
    await asyncio.sleep(0)
    assert stream.writes == ["DEBUG held\n"]


def test_the_access_line_and_its_json_fields() -> None:
    stream = Stream()
    handler = TurnHandler(stream)
    access_log.addHandler(handler)
    level, access_log.level = access_log.level, logging.INFO
    try:
        log_access(("10.0.0.1", 4242), "POST", "/v2/models/m/infer", 200, time.perf_counter())
        log_access(None, "GET", "/v2", 404, time.perf_counter())
        handler.setFormatter(JsonFormatter())
        log_access(("::1", 1), "GET", "/metrics", 401, time.perf_counter())
    finally:
        access_log.removeHandler(handler)
        access_log.setLevel(level)
    text, unknown, entry = stream.lines()
    assert text.startswith('10.0.0.1:4242 "POST /v2/models/m/infer" 200 ')
    assert text.endswith("ms")
    assert unknown.startswith('-:0 "GET /v2" 404 ')
    fields = json.loads(entry)
    assert fields["logger"] == "carpool.access"
    assert fields["level"] == "info"
    assert (fields["client"], fields["method"], fields["path"], fields["status"]) == (
        "::1:1",
        "GET",
        "/metrics",
        401,
    )
    assert fields["duration_ms"] >= 0


def test_control_characters_in_a_message_are_escaped_not_written() -> None:
    formatter = TextFormatter()
    record = logging.makeLogRecord(
        {"msg": '127.0.0.1:1 "GET /v2/\nFORGED \x1b[31m\u00e9t\u00e9" 404', "name": "a"}
    )
    line = formatter.format(record)
    assert "\n" not in line
    assert "\x1b" not in line
    assert line.endswith('"GET /v2/\\nFORGED \\x1b[31m\u00e9t\u00e9" 404')
    plain = logging.makeLogRecord({"msg": "served %s", "args": ("x",), "name": "a"})
    assert formatter.format(plain).endswith(" a: served x")


def test_a_path_cannot_forge_an_access_line(serve: Launcher) -> None:
    server = serve("models:add_one", access_log=True)
    response = httpx.get(f"{server.url}/v2/%0aFORGED%20200%1b[2J")
    assert response.status_code == 404
    log = server.stderr_showing("FORGED")
    assert not any(line.startswith("FORGED") for line in log.splitlines())
    assert '"GET /v2/\\nFORGED 200\\x1b[2J" 404' in log
