"""Where front-end processes come from: a process forked while the main process is still
single-threaded, which forks each front end on request. Forking the serving main process would
copy a process with threads into one with only the forking thread, whose locks may be held
forever. Stdlib only."""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import socket
from collections.abc import Callable
from typing import Any, NoReturn

from carpool.ipc.lifelines import die_with_parent, set_title

__all__ = ["FrontEndEntry", "Zygote"]

# What a front end runs: its number, its end of the link, and what the main process tells it.
FrontEndEntry = Callable[[int, socket.socket, Any], NoReturn]
_REAP_S = 0.5  # how often it reaps the front ends that ended, when nothing else happens
_MESSAGE = 1 << 20  # bytes: one spawn request (a number and the models that failed)


class Zygote:
    """Forks the zygote now (call it before any thread starts); ``spawn`` asks it for a
    front end that runs ``entry``."""

    def __init__(self, entry: FrontEndEntry) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the zygote
            ours.close()
            _zygote(theirs, entry, parent)
        theirs.close()
        self.pid = pid
        self._sock = ours

    def spawn(self, index: int, message: Any) -> tuple[int, socket.socket]:
        """Front end ``index``, told ``message``: its pid, and the main process's end of
        its link. Blocks for the fork (a few milliseconds)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            socket.send_fds(self._sock, [pickle.dumps((index, message))], [theirs.fileno()])
            answer = self._sock.recv(64)
        finally:
            theirs.close()
        pid = int(answer or 0)
        if pid <= 0:
            ours.close()
            raise RuntimeError("the front ends' zygote process is gone")
        return pid, ours

    def stop(self) -> None:
        """End the zygote and reap it."""
        self._sock.close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def _zygote(sock: socket.socket, entry: FrontEndEntry, parent: int) -> NoReturn:
    die_with_parent(parent)
    set_title("carpool: frontends", "carpool zygote")
    # Ctrl-C and a group's SIGTERM reach it too; it ends when the main process says so.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    me = os.getpid()
    while True:
        _reap()
        if not select.select([sock], [], [], _REAP_S)[0]:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, _MESSAGE, 1)
        except OSError:
            break
        if not data:
            break  # the main process closed its end, or died
        index, message = pickle.loads(data)
        pid = os.fork()
        if pid == 0:
            sock.close()
            die_with_parent(me)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            entry(index, socket.socket(fileno=fds[0]), message)
        for fd in fds:
            os.close(fd)
        sock.send(str(pid).encode())
    _reap()
    os._exit(0)


def _reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
