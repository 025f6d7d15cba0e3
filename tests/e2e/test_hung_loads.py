"""A model's import that never returns, a named pipe in a polled model folder: neither may
hold the loop or the exit. SIGTERM or SIGINT while such a load runs still exits within
``--drain-timeout`` and a second (it used to wait for the import for ever: only ``kill -9``
ended it), and a poll that meets a pipe lists it unread and goes on loading the folders
added after it. A real ``carpool serve`` process, real sockets.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from server.conftest import Launcher, wait_until

from .test_model_exits import adds, infer, state, write_model

pytestmark = pytest.mark.slow

WITHIN_S = 20.0  # how long a poll may take to show on a loaded 2-core machine
DRAIN_S = 2.0
MARGIN_S = 3.0  # past the drain timeout: uvicorn's whole seconds, 1 s for threads, a loaded machine


def hangs(started: Path) -> str:
    """A model.py that says it began (``started``), then never returns from its import."""
    touch = f"pathlib.Path({str(started)!r}).touch()"
    return f"import pathlib, threading\n{touch}\nthreading.Event().wait()\n"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_an_import_that_never_returns_exits_within_the_drain_timeout(
    serve: Launcher, tmp_path: Path, threads: ThreadPoolExecutor, sig: signal.Signals
) -> None:
    repository = tmp_path / "models"
    started = tmp_path / "import-started"
    write_model(repository / "a", adds(1))
    write_model(repository / "hangs", hangs(started))
    server = serve(
        str(repository),
        "--model-control-mode",
        "explicit",
        "--load-model",
        "a",
        "--drain-timeout",
        str(DRAIN_S),
    )
    url = f"{server.url}/v2/repository/models/hangs/load"
    loading = threads.submit(httpx.post, url, timeout=60.0)
    wait_until(started.exists, "the import to begin")
    assert state(server, "hangs") == ("LOADING", "")
    assert infer(server, "a") == (200, 2.0)  # the loop serves while the import hangs
    signalled = time.monotonic()
    server.send_signal(sig)
    assert server.wait_exit(within=DRAIN_S + 10 * MARGIN_S) == 0, server.stderr()
    took = time.monotonic() - signalled
    assert took < DRAIN_S + MARGIN_S, f"exited {took:.2f}s after {sig.name}:\n{server.stderr()}"
    assert loading.result().status_code == 503  # answered as the drain ended, not left open


def test_a_named_pipe_in_a_polled_folder_blocks_neither_the_poll_nor_the_exit(
    serve: Launcher, tmp_path: Path
) -> None:
    repository = tmp_path / "models"
    write_model(repository / "a", adds(1))
    os.mkfifo(repository / "a" / "weights.bin")  # there at start: the first look meets it
    server = serve(
        str(repository),
        "--model-control-mode",
        "poll",
        "--repository-poll-secs",
        "0.2",
        "--drain-timeout",
        str(DRAIN_S),
    )
    write_model(repository / "later", adds(3))
    os.mkfifo(repository / "later" / "weights.bin")  # a poll meets this one
    wait_until(lambda: state(server, "later") == ("READY", ""), "later to load", WITHIN_S)
    assert infer(server, "later") == (200, 4.0)
    write_model(repository / "after", adds(5))  # polling goes on past the pipes
    wait_until(lambda: state(server, "after") == ("READY", ""), "after to load", WITHIN_S)
    assert infer(server, "after") == (200, 6.0)
    assert infer(server, "a") == (200, 2.0)
    assert "later/weights.bin is not a regular file; not read" in server.stderr()
    signalled = time.monotonic()
    server.terminate()
    assert server.wait_exit(within=DRAIN_S + 10 * MARGIN_S) == 0, server.stderr()
    took = time.monotonic() - signalled
    assert took < DRAIN_S + MARGIN_S, f"exited {took:.2f}s after SIGTERM:\n{server.stderr()}"


def test_the_last_resort_exits_whatever_holds_the_main_thread() -> None:
    """Behind the drain's own bound: should anything hang the main thread past it (no known
    path does), the process still exits 0, naming the threads left."""
    code = (
        "import threading\n"
        "from carpool.server import serve\n"
        "threading.Thread(target=threading.Event().wait, name='stuck').start()\n"
        "serve._exit_at_the_latest(0.5)\n"
        "threading.Event().wait()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "the drain did not end within 0.5s; exiting anyway" in result.stderr
    assert "'stuck'" in result.stderr


def test_a_settle_time_keeps_a_file_written_in_two_parts_from_loading_half(
    serve: Launcher, tmp_path: Path
) -> None:
    """Two looks agree while a copy pauses longer than the poll interval: the first half
    loads and serves. ``--repository-poll-settle-secs`` longer than the pause waits for the
    whole file."""
    repository = tmp_path / "models"
    write_model(repository / "a", adds(1))
    server = serve(
        str(repository),
        "--model-control-mode",
        "poll",
        "--repository-poll-secs",
        "0.3",
        "--repository-poll-settle-secs",
        "4",
    )
    write_model(repository / "halves", "")
    with open(repository / "halves" / "model.py", "w") as model:
        model.write(adds(1))
        model.flush()
        time.sleep(1.5)  # five looks: without a settle time, two agree on the first half
        model.write(adds(2))  # the whole file redefines it: x + 2
    wait_until(lambda: state(server, "halves") == ("READY", ""), "halves to load", WITHIN_S)
    assert infer(server, "halves") == (200, 3.0)
    log = server.stderr()
    assert "loaded model 'halves'" in log
    assert "reloaded model 'halves'" not in log  # the half never served
