"""Processes for the benchmarks (not a benchmark itself): servers, ``carpool bench`` runs
and child scripts, each pinned to its cores.

Owns: which cores the servers and the load generator get (``--cpus``); a free port; a
process's CPU seconds; a server started pinned, waited on until ``/v2/health/ready``
answers and stopped as one process group; one ``carpool bench --json`` run pinned to the
client's cores, its report loaded (:class:`carpool.bench.report.data.Report`) with the server's
CPU share over it; this process's model worker processes; one v2 inference to check a
server's answers; a child script answering JSON (once, or one line per command line). It
measures nothing itself and prints nothing.

Imports carpool's bench report and request encoder where they are used, so a script that
only runs children (overhead.py) needs neither; no numpy at import time.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from benchmarks.harness import common as _bench

if TYPE_CHECKING:  # imported where used: overhead.py runs without carpool's bench extra
    from carpool.bench.report.data import Report

REPO, SRC = _bench.REPO, _bench.SRC

READY_S = 60.0  # a server importing torch on a busy 2-core box takes tens of seconds
STOP_S = 15.0  # carpool serve drains in-flight requests on SIGTERM; then SIGKILL
UVICORN_FLAGS = (  # carpool serve's own uvicorn settings, for the plain servers
    "--http", "httptools", "--loop", "uvloop", "--no-access-log", "--no-server-header",
    "--log-level", "warning",
)  # fmt: skip


# ------------------------------------------------------------------------------ cores


@dataclass(frozen=True)
class Cores:
    """Where the servers (and offline model runs) and the load generator run."""

    server: frozenset[int] | None
    client: frozenset[int] | None

    def __str__(self) -> str:
        if not self.server or not self.client:
            return "not pinned"
        return f"servers on CPU {_cpus(self.server)}, client on CPU {_cpus(self.client)}"


def split_cpus(spec: str) -> Cores:
    """``--cpus``: the lowest CPU listed for the servers, the highest for the client;
    ``none`` (or CPUs this process may not use) leaves everything unpinned."""
    cpus = _bench.parse_cpus(spec)
    if not cpus:
        return Cores(None, None)
    return Cores(frozenset({min(cpus)}), frozenset({max(cpus)}))


def _cpus(cpus: Iterable[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def pin_self(cpus: frozenset[int] | None) -> None:
    """Pin this process (an orchestrator that mostly sleeps: keep it off the servers')."""
    if cpus:
        os.sched_setaffinity(0, cpus)


def pin_child(cpus: frozenset[int] | None) -> Any:
    """A ``preexec_fn``: the child pinned to ``cpus``, and stopped with its parent."""

    def setup() -> None:  # runs in the child, before exec
        try:  # stopped if the orchestrator dies without cleaning up (Linux)
            ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
        if cpus:
            os.sched_setaffinity(0, cpus)

    return setup


def child_env(**extra: str) -> dict[str, str]:
    """This environment with the repo and its ``src/`` on ``PYTHONPATH`` (``benchmarks.*``
    and carpool importable) and no ``CARPOOL_*`` variables: every setting of a run is on
    its command line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARPOOL_")}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), str(SRC), env.get("PYTHONPATH", "")) if p
    )
    env.update(extra)
    return env


# ------------------------------------------------------------------------------ measures


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (nan where unavailable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def total_cpu_seconds(pids: Iterable[int]) -> float:
    """CPU seconds used so far by this process and the processes ``pids``; one that is
    gone (or unreadable) counts nothing."""
    total = time.process_time()
    for pid in pids:
        seconds = cpu_seconds(pid)
        if not math.isnan(seconds):
            total += seconds
    return total


def worker_pids() -> list[int]:
    """This process's live model worker processes (children running multiprocessing's
    spawn: ``runner="process"``; ``carpool-worker ...`` once setproctitle renamed them)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        worker = b"spawn_main" in cmdline or cmdline.startswith(b"carpool-worker ")
        if int(fields[1]) == os.getpid() and fields[0] != "Z" and worker:
            found.append(int(proc.name))
    return found


# ------------------------------------------------------------------------------ servers


class Server:
    """One server process: its own process group, pinned, its output kept for errors."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        port: int,
        cpus: frozenset[int] | None,
        env: Mapping[str, str] | None = None,
        ready_path: str = "/v2/health/ready",  # another server's readiness route
    ) -> None:
        self.name = name
        self.base = f"http://127.0.0.1:{port}"
        self.ready_path = ready_path
        self._log: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            list(argv),
            cwd=REPO,
            env=dict(env) if env is not None else child_env(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: stopped as one
            preexec_fn=pin_child(cpus),
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def url(self, model: str) -> str:
        return f"{self.base}/v2/models/{model}"

    def wait_ready(self, timeout: float = READY_S) -> None:
        """Until ``ready_path`` (``/v2/health/ready``) answers 200; ``RuntimeError`` with
        the server's output when it exits or is not ready in time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}):\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.base + self.ready_path, timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} not ready after {timeout:g} s:\n{self.tail()}")

    def tail(self, n: int = 3000) -> str:
        self._log.flush()
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-n:]

    def stop(self) -> None:
        """SIGTERM to the process group (carpool serve drains), SIGKILL after ``STOP_S``."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if not self._log.closed:
            self._log.close()


def carpool_serve(
    target: str, *flags: str, cpus: frozenset[int] | None, name: str | None = None
) -> Server:
    """``python -m carpool serve TARGET FLAGS`` on a free port, no access log, gRPC off
    unless ``FLAGS`` give a ``--grpc-port`` (its default, 8001, would let only one server
    start)."""
    port = free_port()
    argv = [sys.executable, "-m", "carpool", "serve", target, "--port", str(port),
            "--access-log", "false", "--log-level", "warning", "--grpc-port", "0",
            *flags]  # fmt: skip
    return Server(name or f"carpool serve {target}", argv, port, cpus)


def uvicorn(app: str, *, cpus: frozenset[int] | None, **env: str) -> Server:
    """``python -m uvicorn APP`` with carpool serve's uvicorn settings, on a free port."""
    port = free_port()
    argv = [sys.executable, "-m", "uvicorn", app, "--port", str(port), *UVICORN_FLAGS]
    return Server(f"uvicorn {app}", argv, port, cpus, child_env(**env))


def wait_all(servers: Iterable[Server], timeout: float = READY_S) -> None:
    """Wait until every server is ready (they start in parallel)."""
    for server in servers:
        server.wait_ready(timeout)


# ------------------------------------------------------------------------------ load


@dataclass(frozen=True)
class BenchRun:
    """One ``carpool bench`` run: its report, and the server's CPU over the loaded
    seconds (warm-up + window of every step) as a share of one core."""

    report: Report
    server_cpu: float

    def rows(self) -> list[dict[str, Any]]:
        """Each step's figures, flat: clients, req/s (answers in the window), p50/p99 ms,
        mean batch (carpool's ``/metrics``; nan for other servers), server CPU share,
        errors."""
        nan = float("nan")
        return [
            {
                "clients": int(step.load.value),
                "throughput": step.throughput_rps,
                "p50_ms": step.latency.p50 if step.latency else nan,
                "p99_ms": step.latency.p99 if step.latency else nan,
                "mean_batch": step.server.batch_size_mean if step.server else nan,
                "server_cpu": self.server_cpu,
                "errors": sum(step.errors.values()),
            }
            for step in self.report.steps
        ]


def carpool_bench(
    server: Server,
    model: str,
    concurrency: Sequence[int],
    *,
    warmup: float,
    duration: float,
    cpus: frozenset[int] | None,
    flags: Sequence[str] = (),
    target: str | None = None,
    rate: float | None = None,
) -> BenchRun:
    """``python -m carpool bench URL --concurrency C,... --json FILE`` pinned to ``cpus``:
    closed loop, one step per concurrency (``rate``: one open-loop step at that many
    requests/s instead). ``target``: another TARGET on ``server`` than its
    v2 model URL (``grpc://...``, ``.../v1/embeddings``). ``RuntimeError`` with its stderr if
    it fails."""
    from carpool.bench.report.data import Report

    with tempfile.TemporaryDirectory(prefix="carpool-bench-") as folder:
        out = Path(folder) / "report.json"
        load = (
            ["--rate", f"{rate:g}"] if rate else ["--concurrency", ",".join(map(str, concurrency))]
        )
        argv = [sys.executable, "-m", "carpool", "bench", target or server.url(model),
                *load, "--warmup", f"{warmup:g}",
                "--duration", f"{duration:g}", "--json", str(out), *flags]  # fmt: skip
        cpu0 = cpu_seconds(server.pid)
        done = subprocess.run(
            argv,
            cwd=REPO,
            env=child_env(COLUMNS="120"),
            capture_output=True,
            text=True,
            timeout=60 + 3 * len(concurrency) * (warmup + duration),
            preexec_fn=pin_child(cpus),
        )
        cpu1 = cpu_seconds(server.pid)
        if done.returncode != 0:
            raise RuntimeError(
                f"carpool bench exited {done.returncode}: {(done.stderr or done.stdout)[-2000:]}"
            )
        report = Report.load(out)
    loaded_s = len(concurrency) * (warmup + duration)  # the server idles otherwise
    return BenchRun(report, (cpu1 - cpu0) / loaded_s)


def infer(server: Server, model: str, inputs: Mapping[str, Any], *, binary: bool) -> Any:
    """One v2 inference (request encoded by ``carpool bench``'s own encoder): the first
    output as a float32 array. ``inputs``: name -> (datatype, array with the batch axis)."""
    import numpy as np

    from carpool.bench.targets.payload import HEADER_LENGTH, InputSpec, RequestSpec, encode

    spec = RequestSpec(tuple(InputSpec(n, dt, a.shape) for n, (dt, a) in inputs.items()))
    body, headers = encode({n: a for n, (_, a) in inputs.items()}, spec, binary=binary)
    request = urllib.request.Request(server.url(model) + "/infer", data=body, headers=headers)
    with urllib.request.urlopen(request, timeout=60) as r:
        data, split = r.read(), r.headers.get(HEADER_LENGTH)
    doc = json.loads(data[: int(split)] if split else data)
    out = doc["outputs"][0]
    if split is None:
        return np.asarray(out["data"], np.float32).reshape(out["shape"])
    size = out["parameters"]["binary_data_size"]
    return np.frombuffer(data[int(split) : int(split) + size], "<f4").reshape(out["shape"])


# ------------------------------------------------------------------------------ children


def run_json(script: Path, args: Sequence[str], cpus: Iterable[int] | None, timeout: float) -> Any:
    """Run ``python script args...`` pinned to ``cpus``; its last stdout line, as JSON."""
    proc = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=pin_child(frozenset(cpus) if cpus else None),
        env=os.environ.copy(),
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"child {' '.join(args)} failed (rc={proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    return json.loads(lines[-1])


class Worker:
    """A child script, pinned, that answers one JSON line per JSON command line (its
    model stays loaded between commands, so its runs interleave with others')."""

    def __init__(self, script: Path, cpus: frozenset[int] | None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=script.parent,
            env=child_env(),
            preexec_fn=pin_child(cpus),
        )

    def ask(self, cmd: str, **spec: Any) -> Any:
        """Send ``{"cmd": cmd, **spec}``; the answer, or ``RuntimeError`` with its error."""
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"cmd": cmd, **spec}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{cmd}: worker exited ({self.proc.wait()})")
        reply = json.loads(line)
        if isinstance(reply, dict) and "error" in reply:
            raise RuntimeError(f"{cmd}: {reply['error']}")
        return reply

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.close()  # end of commands: the worker returns
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
