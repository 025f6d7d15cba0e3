"""A replica's process: it loads the model once, then runs batch after batch for its parent, a
:class:`~carpool.runners.processes.ProcessReplicas`. Started with ``spawn``, it dies with its
parent (``PR_SET_PDEATHSIG``, else a watch of ``getppid()``); the messages it exchanges are
listed on :func:`replica_main`."""

from __future__ import annotations

import os
import pickle
import signal
import sys
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from carpool.errors import call_model
from carpool.ipc.lifelines import die_with_parent, set_title
from carpool.ipc.transport import Attached, Channel, decode, lay_out
from carpool.runners.replicas import load_replica

__all__ = ["replica_main"]


def replica_main(
    ends: tuple[Connection, Connection],
    spec: bytes,
    warmup: bytes | None,
    title: str,
    parent: int,
) -> None:
    """The replica process's target: load, warm up, report, serve until told to stop or
    the parent is gone. ``ends`` are this side's pipes of a :class:`Channel`; ``spec`` and
    ``warmup`` come pickled so that a spec that cannot be unpickled here is reported as a
    load failure with its reason.

    Messages (tuples over the pipe), parent -> replica: ``("run", inputs, out_name)``,
    ``("out", out_name)`` after a ``grow``, ``("stop",)``. Replica -> parent: ``("ready", pid)``,
    ``("failed", reason, traceback)``, ``("ok", outputs)``, ``("grow", nbytes)``,
    ``("error", pickled_exception, traceback)``. ``inputs``/``outputs`` are transport headers.
    """
    conn = Channel(*ends)
    die_with_parent(parent)
    _set_title(title)
    # Ctrl-C, and a SIGTERM sent to the whole process group (``kill -- -PGID``, an init
    # system), reach the replicas too: the parent drains, then stops them itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    loaded = load_replica(spec, warmup, decode=pickle.loads)
    if loaded.fn is None:
        conn.send(("failed", loaded.failure, loaded.trace))
        sys.exit(1)
    conn.send(("ready", os.getpid()))
    _serve(conn, loaded.fn)


def _serve(conn: Channel, fn: Callable[[Any], Any]) -> None:
    inputs, outputs = Attached(), Attached()
    while True:
        try:
            message = conn.receive()
        except (EOFError, OSError):  # the parent is gone
            break
        try:
            if message[0] != "run" or not _run(conn, fn, message, inputs, outputs):
                break
        except (EOFError, OSError):  # the parent went away mid-batch
            break
    inputs.close()
    outputs.close()


def _run(
    conn: Channel, fn: Callable[[Any], Any], message: Any, inputs: Attached, outputs: Attached
) -> bool:
    """Run one batch and answer; False when the parent stopped the replica meanwhile. The
    arrays it viewed in the arenas are dropped on return, before they may be replaced."""
    _, (in_name, tree), out_name = message
    try:
        laid = lay_out(call_model(fn, decode(tree, inputs.buf(in_name))))
        if laid.nbytes > len(outputs.buf(out_name)):
            conn.send(("grow", laid.nbytes))
            reply = conn.receive()
            if reply[0] != "out":
                return False
            out_name = reply[1]
        laid.write(outputs.buf(out_name))
        conn.send(("ok", (out_name, laid.tree)))  # pickles first: a bad output raises here
    except Exception as exc:  # the model's error goes back to its caller
        conn.send(("error", _pickled(exc), traceback.format_exc()))
    return True


def _pickled(exc: Exception) -> bytes:
    """The model's exception, pickled; one that does not survive the trip becomes a
    RuntimeError with its type and message."""
    try:
        data = pickle.dumps(exc)
        pickle.loads(data)
        return data
    except Exception:  # any pickling failure falls back the same way
        name = type(exc).__qualname__
        return pickle.dumps(RuntimeError(f"{name}: {exc}"))


def _set_title(title: str) -> None:
    name = title.removeprefix("carpool-worker ")
    set_title(title, f"carpool {name}" if len(name) <= 7 else name)  # the kernel keeps 15
