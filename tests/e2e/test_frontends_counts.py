"""``carpool serve --frontends 2`` under load while a front end is killed: every answer a
client received is counted once in ``/metrics`` (but the one whose last bytes the kill may
catch before its count is committed), whenever the front end that sent it died
(issue 31: a front end's counts reached the main process only when statistics were
queried, so a ``kill -9`` took everything since the last scrape with it); what the dead
front end left in ``/dev/shm`` is unlinked at once, and the server ends with no warning
that shared memory leaked."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from server.conftest import Launcher, Server, float_request, wait_until

from .test_frontends import FRONTENDS, _children, alive, front_ends

CLIENTS = 16


def _cmd(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return b""


def _successes(server: Server, model: str) -> int:
    """``carpool_requests_total`` of ``model``'s successes, every protocol summed."""
    pattern = re.compile(
        rf'^carpool_requests_total\{{model="{model}",outcome="success",[^}}]*\}} (\S+)$', re.M
    )
    return sum(int(float(value)) for value in pattern.findall(server.metrics()))


class _Load:
    """``CLIENTS`` threads sending requests on keep-alive connections until stopped, each
    opening another connection when its own breaks; counting the 200s they received."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.received = 0
        self.stop = threading.Event()
        self._lock = threading.Lock()

    def client(self) -> None:
        body = json.dumps(float_request(1.0))
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)
        while not self.stop.is_set():
            try:
                conn.request("POST", "/v2/models/add_one/infer", body)
                response = conn.getresponse()
                response.read()
            except (OSError, http.client.HTTPException):  # its front end died: another
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)
                continue
            if response.status == 200:
                with self._lock:
                    self.received += 1
        conn.close()


def test_a_killed_front_end_loses_none_of_the_answers_it_sent(serve: Launcher) -> None:
    server = serve("models:add_one", *FRONTENDS)
    before = _successes(server, "add_one")
    load = _Load(server)
    dead = front_ends(server)[1]
    with ThreadPoolExecutor(CLIENTS) as clients:
        for _ in range(CLIENTS):
            clients.submit(load.client)
        wait_until(lambda: load.received >= 1500, "1,500 answers before the kill")
        os.kill(dead, signal.SIGKILL)
        server.reconnect()
        wait_until(lambda: front_ends(server).get(1, dead) != dead, "front end #1 replaced")
        sent = load.received
        wait_until(lambda: load.received >= sent + 500, "500 answers after the kill")
        load.stop.set()
    # No scrape during the load: the dead front end's counts were never asked for. An answer
    # is committed as its last bytes are written (Tally), so a kill that lands between the
    # two loses that one answer's count: one at most, never one the client did not get.
    counted = _successes(server, "add_one") - before
    assert load.received - 1 <= counted <= load.received
    stats = server.stats("add_one")["inference_stats"]
    # Triton's count of inferences completed; also those whose front end died unsent.
    assert stats["success"]["count"] >= load.received
    assert not [name for name in os.listdir("/dev/shm") if name.startswith(f"carpool_{dead}_")]
    (tracker,) = [p for p in _children(server.process.pid) if b"resource_tracker" in _cmd(p)]
    server.send_signal(signal.SIGTERM)
    assert server.wait_exit() == 0
    wait_until(lambda: not alive(tracker), "the resource tracker to end")
    assert "leaked" not in server.stderr()
