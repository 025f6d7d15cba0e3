"""What every child process carpool starts does first: die with its parent, and say in
``ps`` what it is. Used by model replicas (:mod:`carpool.runners.replica_process`) and the
server's front ends (:mod:`carpool.server.frontends.zygote`). Linux's ``prctl`` where there is one;
elsewhere a watcher thread and no title. Stdlib only; nothing runs at import.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import signal
import threading
import time

__all__ = ["die_with_parent", "keep_title_room", "set_title"]

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15


def die_with_parent(parent: int) -> None:
    """Exit when process ``parent`` dies, even if it is SIGKILLed while this one is busy."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
            if os.getppid() != parent:  # it died before prctl took effect
                os._exit(1)
            return
    except (OSError, AttributeError):
        pass
    watcher = threading.Thread(target=_watch_parent, args=(parent,), daemon=True)
    watcher.start()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def keep_title_room() -> None:
    """Have setproctitle take, now, the memory it writes titles into (the command line's
    and the environment's), before the environment changes: once the last variable is
    taken out (``CARPOOL_API_KEY``, scrubbed), it finds no room and every later
    :func:`set_title` leaves ``ps`` showing the command line."""
    try:
        importlib.import_module("setproctitle").getproctitle()
    except ImportError:
        pass


def set_title(title: str, short: str) -> None:
    """Name the process for ``ps``: ``title`` through setproctitle when installed (the
    whole title in ``ps aux``), and ``short`` as the kernel's 15-byte name (``ps -e``,
    ``top``)."""
    try:
        setproctitle = importlib.import_module("setproctitle")
        setproctitle.setproctitle(title)
    except ImportError:
        pass
    try:
        libc = ctypes.CDLL(None)
        libc.prctl(PR_SET_NAME, short.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass
