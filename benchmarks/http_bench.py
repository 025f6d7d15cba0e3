"""`carpool serve` vs a plain uvicorn endpoint, over HTTP, for the same numpy MLP.

What: two real servers, side by side in one run, each in its own process pinned to one core
(default CPU 0), and a load generator in a third process pinned to the other core (CPU 1):

  * carpool:  ``python -m carpool serve benchmarks.http_models:mlp --max-batch-size 32
    --access-log false`` (KServe v2 REST; eager policy, one model worker);
  * plain:    ``python -m uvicorn benchmarks.http_models:plain_app`` -- a minimal ASGI app
    with the same v2 request/response shapes that calls the same model once per request in
    a thread: no batching. Same uvicorn settings as carpool's: httptools, uvloop, no access
    log, no server header;
  * instant:  the same wire format answered with a canned response and no model: the
    ceiling of the load generator (plus uvicorn), printed to show that the client is not
    the bottleneck.

The model (``http_models.py``): float32 MLP 512 -> 2048 -> 2048 -> 2048 -> 512, ReLU,
fixed-seed weights, numpy with ONE BLAS thread (threadpoolctl inside the server process).

Load: closed loop, 1/8/64/256 concurrent clients (aiohttp on uvloop, one keep-alive
connection per client), one 512-float row per request, as v2 JSON (``"data": [...]``) and
as v2 binary (JSON header + ``Inference-Header-Content-Length`` + 2,048 raw bytes, output
asked back binary -- what tritonclient sends with binary_data=True). Every step warms up,
then measures a fixed window: throughput = responses completed in the window / window;
p50/p99 over the latencies of those responses. Steps are interleaved (for each repeat, for
each concurrency, for each encoding: carpool and plain back to back, the first of the two
alternating, then instant), repeated (default 3) and reported as medians; the ratio and
Δp50 are medians over the back-to-back (carpool, plain) pairs. At 1 client each repeat is
``--latency-rounds`` (4) shorter rounds, so drift on a shared machine hits both servers
alike. After each carpool step the client reads carpool's
``/metrics`` (before and after the window) and reports the window's mean batch size.
Every server's answer is checked against the model computed locally before any timing.

Targets (JSON): at 64 clients carpool req/s / plain req/s >= 2.5; at 1 client
p50(carpool) - p50(plain) <= 0.5 ms. Nothing is asserted; exits 0.

    python benchmarks/http_bench.py                 # ~6 min
    python benchmarks/http_bench.py --quick         # ~10 s: smoke test only
    python benchmarks/http_bench.py --cpus none     # no pinning
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import _bench  # first: one BLAS thread for everything numpy in this process tree

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MODEL_PATH = "/v2/models/mlp/infer"
SERVERS = ("carpool", "plain", "instant")
ENCODINGS = ("json", "binary")


# =======================================================================================
# The load generator (runs in its own process: ``http_bench.py --client``)
# =======================================================================================
def _request_bodies(encoding: str, n: int = 64) -> list[tuple[bytes, dict[str, str]]]:
    """``n`` distinct single-row requests, pre-encoded (the client does no work per row)."""
    import numpy as np
    import orjson

    rng = np.random.default_rng(1)
    rows = rng.standard_normal((n, 512)).astype(np.float32)
    out = []
    for row in rows:
        if encoding == "json":
            doc = {
                "inputs": [{"name": "INPUT0", "shape": [1, 512], "datatype": "FP32", "data": row}]
            }
            body = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
            out.append((body, {"Content-Type": "application/json"}))
        else:
            blob = row.astype("<f4").tobytes()
            doc = {
                "inputs": [
                    {
                        "name": "INPUT0",
                        "shape": [1, 512],
                        "datatype": "FP32",
                        "parameters": {"binary_data_size": len(blob)},
                    }
                ],
                "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
            }
            header = orjson.dumps(doc)
            out.append(
                (
                    header + blob,
                    {
                        "Content-Type": "application/octet-stream",
                        "Inference-Header-Content-Length": str(len(header)),
                    },
                )
            )
    return out


def _decode_output(body: bytes, header_length: str | None) -> Any:
    import numpy as np
    import orjson

    if header_length is None:
        doc = orjson.loads(body)
        (out,) = doc["outputs"]
        return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
    n = int(header_length)
    doc = orjson.loads(body[:n])
    (out,) = doc["outputs"]
    return np.frombuffer(body[n:], dtype=np.float32).reshape(out["shape"])


def _cpu_seconds(pid: int | None) -> float:
    """utime + stime of a process, from /proc (nan where unavailable)."""
    if not pid:
        return float("nan")
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def _batch_counters(text: str) -> tuple[float, float]:
    """(rows, batches) summed over models from carpool's Prometheus text."""
    rows = batches = 0.0
    for line in text.splitlines():
        if line.startswith("carpool_batch_size_sum"):
            rows += float(line.rsplit(" ", 1)[1])
        elif line.startswith("carpool_batch_size_count"):
            batches += float(line.rsplit(" ", 1)[1])
    return rows, batches


async def _client_step(session: Any, spec: dict[str, Any]) -> dict[str, Any]:
    import asyncio

    base = spec["base"]
    url = base + MODEL_PATH
    bodies = _request_bodies(spec["encoding"])
    concurrency = int(spec["concurrency"])
    warmup, duration = float(spec["warmup"]), float(spec["duration"])
    latencies: list[float] = []
    errors: dict[str, int] = {}
    state = {"measuring": False, "stop": False, "t0": 0.0, "t1": 0.0}
    perf = time.perf_counter

    async def worker(k: int) -> None:
        i = k
        while not state["stop"]:
            body, headers = bodies[i % len(bodies)]
            i += 1
            t0 = perf()
            try:
                async with session.post(url, data=body, headers=headers) as resp:
                    await resp.read()
                    status = resp.status
            except Exception as exc:  # counted, and the loop goes on
                status = type(exc).__name__
            t1 = perf()
            if status != 200:
                errors[str(status)] = errors.get(str(status), 0) + 1
            elif state["measuring"] and t1 <= state["t1"]:
                latencies.append(t1 - t0)

    async def metrics() -> tuple[float, float]:
        if not spec.get("metrics"):
            return float("nan"), float("nan")
        async with session.get(base + "/metrics") as resp:
            return _batch_counters(await resp.text())

    tasks = [asyncio.create_task(worker(k)) for k in range(concurrency)]
    await asyncio.sleep(warmup)
    m0 = await metrics()
    cpu0, srv0 = time.process_time(), _cpu_seconds(spec.get("server_pid"))
    state["t0"] = perf()
    state["t1"] = state["t0"] + duration
    state["measuring"] = True
    await asyncio.sleep(duration)
    elapsed = perf() - state["t0"]
    cpu1, srv1 = time.process_time(), _cpu_seconds(spec.get("server_pid"))
    state["measuring"] = False
    m1 = await metrics()
    state["stop"] = True
    await asyncio.gather(*tasks)
    latencies.sort()
    n = len(latencies)
    rows, batches = m1[0] - m0[0], m1[1] - m0[1]
    return {
        "n": n,
        "throughput": n / elapsed,
        "p50_ms": _bench.percentile(latencies, 50) * 1e3,
        "p99_ms": _bench.percentile(latencies, 99) * 1e3,
        "errors": errors,
        "client_cpu": (cpu1 - cpu0) / elapsed,
        "server_cpu": (srv1 - srv0) / elapsed,
        "mean_batch": rows / batches if batches else float("nan"),
    }


async def _client_check(session: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """Each server answers each encoding with the model's own output for that row."""
    import http_models
    import numpy as np

    problems = []
    for encoding in ENCODINGS:
        for body, headers in _request_bodies(encoding, n=3):
            async with session.post(spec["base"] + MODEL_PATH, data=body, headers=headers) as r:
                data = await r.read()
                if r.status != 200:
                    problems.append(f"{encoding}: HTTP {r.status}: {data[:300]!r}")
                    continue
                got = _decode_output(data, r.headers.get("Inference-Header-Content-Length"))
            if encoding == "json":
                row = np.asarray(json.loads(body)["inputs"][0]["data"], np.float32)
            else:
                row = np.frombuffer(
                    body[int(headers["Inference-Header-Content-Length"]) :], np.float32
                )
            want = http_models.model(row.reshape(1, -1))
            if got.shape != want.shape or (
                spec.get("compare", True) and not np.allclose(got, want, rtol=1e-4, atol=1e-4)
            ):
                problems.append(f"{encoding}: wrong output (shape {got.shape})")
    return {"ok": not problems, "problems": problems}


def _client_model_cost() -> dict[str, Any]:
    """The model's own cost on this (client) core, for reference: median ms at 1 and 32 rows."""
    import http_models
    import numpy as np

    out = {}
    for rows in (1, 32):
        x = np.random.default_rng(2).standard_normal((rows, 512)).astype(np.float32)
        for _ in range(5):
            http_models.model(x)
        times = []
        for _ in range(30 if rows == 1 else 15):
            t0 = time.perf_counter()
            http_models.model(x)
            times.append(time.perf_counter() - t0)
        out[str(rows)] = _bench.median(times) * 1e3
    return out


def client_main() -> int:
    """Read one JSON command per stdin line, answer one JSON line on stdout."""
    import asyncio

    import aiohttp

    try:
        import uvloop

        runner: Any = uvloop.run
        loop_name = f"uvloop {uvloop.__version__}"
    except ImportError:
        runner = asyncio.run
        loop_name = "asyncio"

    async def one(spec: dict[str, Any]) -> dict[str, Any]:
        if spec["cmd"] == "hello":
            return {
                "client": f"aiohttp {aiohttp.__version__} + {loop_name}",
                "cpus": _bench.pin(None),
                "model_ms": _client_model_cost(),
            }
        limit = max(1, int(spec.get("concurrency", 1))) + 1  # +1: /metrics never waits
        connector = aiohttp.TCPConnector(limit=limit, limit_per_host=limit)
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(
            connector=connector, timeout=timeout, skip_auto_headers=("User-Agent",)
        ) as session:
            if spec["cmd"] == "check":
                return await _client_check(session, spec)
            return await _client_step(session, spec)

    for line in sys.stdin:
        spec = json.loads(line)
        if spec["cmd"] == "exit":
            break
        try:
            reply = runner(one(spec))
        except Exception as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    return 0


# =======================================================================================
# The orchestrator
# =======================================================================================
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _preexec(cpus: set[int] | None) -> Any:
    def setup() -> None:
        os.setsid()  # own process group: stopped as one
        try:  # and stopped if this orchestrator dies without cleaning up (Linux)
            ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
        if cpus:
            os.sched_setaffinity(0, cpus)

    return setup


class Server:
    """One server process, in its own process group, pinned, its output kept for errors."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        port: int,
        cpus: set[int] | None,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.port = port
        self.base = f"http://127.0.0.1:{port}"
        env = os.environ.copy()
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO), str(_bench.SRC), env.get("PYTHONPATH", "")) if p
        )
        env.update(extra_env or {})
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            argv,
            cwd=REPO,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            preexec_fn=_preexec(cpus),
        )

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} server exited ({self.proc.returncode}):\n" + self.tail()
                )
            try:
                with urllib.request.urlopen(self.base + "/v2/health/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} server not ready after {timeout}s:\n" + self.tail())

    def tail(self, n: int = 3000) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-n:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def start_servers(
    cpus: set[int] | None, plain_threads: int, only: tuple[str, ...] = SERVERS
) -> dict[str, Server]:
    py = sys.executable
    uvicorn_flags = [
        "--http",
        "httptools",
        "--loop",
        "uvloop",
        "--no-access-log",
        "--no-server-header",
        "--log-level",
        "warning",
    ]
    servers: dict[str, Server] = {}
    p = _free_port()
    if "carpool" in only:
        servers["carpool"] = Server(
            "carpool",
            [
                py,
                "-m",
                "carpool",
                "serve",
                "benchmarks.http_models:mlp",
                "--max-batch-size",
                "32",
                "--access-log",
                "false",
                "--log-level",
                "warning",
                "--port",
                str(p),
            ],
            p,
            cpus,
        )
    for name, app in (("plain", "plain_app"), ("instant", "instant_app")):
        if name not in only:
            continue
        p = _free_port()
        servers[name] = Server(
            name,
            [
                py,
                "-m",
                "uvicorn",
                f"benchmarks.http_models:{app}",
                "--port",
                str(p),
                *uvicorn_flags,
            ],
            p,
            cpus,
            {"PLAIN_THREADS": str(plain_threads)},
        )
    for s in servers.values():
        s.wait_ready()
    return servers


class Client:
    def __init__(self, cpus: set[int] | None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--client"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=HERE,
            preexec_fn=_preexec(cpus),
        )

    def ask(self, **spec: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(spec) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"client process exited ({self.proc.wait()})")
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"client: {reply['error']}")
        return reply

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(Exception):
                self._send_exit()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def _send_exit(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"cmd": "exit"}) + "\n")
        self.proc.stdin.close()


def _cpu_split(spec: str) -> tuple[set[int] | None, set[int] | None, str]:
    cpus = _bench.parse_cpus(spec)
    if not cpus:
        return None, None, "not pinned"
    ordered = sorted(cpus)
    server, client = {ordered[0]}, {ordered[-1]}
    return server, client, f"servers on CPU {ordered[0]}, client on CPU {ordered[-1]}"


def _fmt(x: float, digits: int = 0) -> str:
    return _bench.fmt_num(x, digits)


def _missing_modules() -> list[str]:
    import importlib.util

    needed = ("aiohttp", "orjson", "uvicorn", "httptools", "uvloop", "threadpoolctl", "numpy")
    return [m for m in needed if importlib.util.find_spec(m) is None]


def run(args: Any) -> None:
    missing = _missing_modules()
    if missing:
        print(
            f"http_bench: {sys.executable} lacks {', '.join(missing)}: install carpool's server "
            "extra and aiohttp, e.g.  python -m pip install -e '.[server]' aiohttp"
        )
        return
    quick = args.quick
    repeats = args.repeats or (1 if quick else 3)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    if quick and args.concurrency == DEFAULT_CONCURRENCY:
        concurrencies = [1, 64]
    encodings = args.encodings.split(",")
    if args.latency_rounds is None:
        args.latency_rounds = 2 if quick else 4
    warmup = args.warmup if args.warmup is not None else (0.2 if quick else 1.0)
    duration = args.duration if args.duration is not None else (0.4 if quick else 3.0)
    server_cpus, client_cpus, pinning = _cpu_split(args.cpus)
    _bench.pin(client_cpus)  # the orchestrator mostly sleeps; keep it off the servers' core

    servers: dict[str, Server] = {}
    client: Client | None = None
    try:
        servers = start_servers(server_cpus, args.plain_threads)
        client = Client(client_cpus)
        hello = client.ask(cmd="hello")
        _bench.header(
            "carpool serve vs plain uvicorn over HTTP (KServe v2), MLP 512->2048x3->512",
            {
                "cpus": pinning,
                "client": hello["client"],
                "repeats": repeats,
                "window": f"{warmup:g}s warm-up + {duration:g}s measured",
                "plain_threads": args.plain_threads,
                "model_ms(1,32 rows)": "{:.2f},{:.2f}".format(*hello["model_ms"].values()),
            },
        )
        for name in SERVERS:
            check = client.ask(cmd="check", base=servers[name].base, compare=name != "instant")
            print(f"  check {name:8s}: {'ok' if check['ok'] else check['problems']}")
        print()

        results: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
        for r in range(repeats):
            for c in concurrencies:
                # 1 client is a latency comparison: a few short rounds, carpool and plain
                # alternating which goes first, so drift on a shared box hits both alike.
                rounds = args.latency_rounds if c == 1 else 1
                step_warmup = min(warmup, 0.3) if c == 1 else warmup
                step_duration = max(duration / 3, 0.2) if c == 1 else duration
                for k in range(rounds):
                    for enc in encodings:
                        pair = (
                            ["carpool", "plain"]
                            if (r * rounds + k) % 2 == 0
                            else ["plain", "carpool"]
                        )
                        order = pair + (["instant"] if k == 0 and not args.no_ceiling else [])
                        for name in order:
                            srv = servers[name]
                            res = client.ask(
                                cmd="step",
                                base=srv.base,
                                encoding=enc,
                                concurrency=c,
                                warmup=step_warmup,
                                duration=step_duration,
                                metrics=name == "carpool",
                                server_pid=srv.proc.pid,
                            )
                            results.setdefault((name, enc, c), []).append(res)
                            batch = f"  batch {res['mean_batch']:5.1f}" if name == "carpool" else ""
                            errs = f"  ERRORS {res['errors']}" if res["errors"] else ""
                            where = f"repeat {r + 1}/{repeats}" + (
                                f".{k + 1}" if rounds > 1 else "  "
                            )
                            print(
                                f"  {where}  {enc:6s} c={c:<3d} {name:8s}"
                                f" {res['throughput']:8.0f} req/s  p50 {res['p50_ms']:7.2f} ms"
                                f"  p99 {res['p99_ms']:7.2f} ms  cpu srv {res['server_cpu']:4.0%}"
                                f" cli {res['client_cpu']:4.0%}{batch}{errs}"
                            )
        print()
        report(results, concurrencies, encodings, not args.no_ceiling)
    finally:
        if client is not None:
            client.close()
        for s in servers.values():
            s.stop()


def _med(
    results: dict[tuple[str, str, int], list[dict[str, Any]]], key: tuple[str, str, int], field: str
) -> float:
    vals = [r[field] for r in results.get(key, [])]
    return _bench.median(vals)


def _paired(
    results: dict[tuple[str, str, int], list[dict[str, Any]]], enc: str, c: int, fn: Any
) -> float:
    """Median over the (carpool, plain) pairs measured back to back of fn(carpool, plain)."""
    pairs = zip(
        results.get(("carpool", enc, c), []), results.get(("plain", enc, c), []), strict=False
    )
    return _bench.median(fn(a, b) for a, b in pairs)


def _ratio(a: dict[str, Any], b: dict[str, Any]) -> float:
    return a["throughput"] / b["throughput"] if b["throughput"] else float("nan")


def _delta_p50(a: dict[str, Any], b: dict[str, Any]) -> float:
    return float(a["p50_ms"] - b["p50_ms"])


def report(
    results: dict[tuple[str, str, int], list[dict[str, Any]]],
    concurrencies: list[int],
    encodings: list[str],
    ceiling: bool,
) -> None:
    def errors(key: tuple[str, str, int]) -> int:
        return sum(sum(r["errors"].values()) for r in results.get(key, []))

    if ceiling:
        print("client ceiling: the instant endpoint (canned answer, no model), medians")
        rows = []
        for enc in encodings:
            for c in concurrencies:
                k = ("instant", enc, c)
                rows.append(
                    [
                        enc,
                        c,
                        _fmt(_med(results, k, "throughput")),
                        _fmt(_med(results, k, "p50_ms"), 2),
                        _fmt(_med(results, k, "p99_ms"), 2),
                        f"{_med(results, k, 'client_cpu'):.0%}",
                        f"{_med(results, k, 'server_cpu'):.0%}",
                    ]
                )
        print(
            _bench.table(
                ["enc", "clients", "req/s", "p50 ms", "p99 ms", "client CPU", "server CPU"], rows
            )
        )
        print()

    print("carpool serve vs plain uvicorn (same model, same client), medians over repeats")
    rows = []
    for enc in encodings:
        for c in concurrencies:
            kc, kp = ("carpool", enc, c), ("plain", enc, c)
            tc, tp = _med(results, kc, "throughput"), _med(results, kp, "throughput")
            p50c, p50p = _med(results, kc, "p50_ms"), _med(results, kp, "p50_ms")
            err = errors(kc) + errors(kp)
            rows.append(
                [
                    enc,
                    c,
                    _fmt(tc),
                    _fmt(tp),
                    f"{_paired(results, enc, c, _ratio):.2f}x",
                    _fmt(p50c, 2),
                    _fmt(p50p, 2),
                    f"{_paired(results, enc, c, _delta_p50):+.2f}",
                    _fmt(_med(results, kc, "p99_ms"), 2),
                    _fmt(_med(results, kp, "p99_ms"), 2),
                    _fmt(_med(results, kc, "mean_batch"), 1),
                    f"{_med(results, kc, 'server_cpu'):.0%}/{_med(results, kp, 'server_cpu'):.0%}",
                    f"{_med(results, kc, 'client_cpu'):.0%}/{_med(results, kp, 'client_cpu'):.0%}",
                    err,
                ]
            )
    print(
        _bench.table(
            [
                "enc",
                "clients",
                "carpool req/s",
                "plain req/s",
                "ratio",
                "carpool p50",
                "plain p50",
                "Δp50 ms",
                "carpool p99",
                "plain p99",
                "mean batch",
                "srv CPU c/p",
                "cli CPU c/p",
                "errors",
            ],
            rows,
        )
    )
    print("  (ratio, Δp50: medians over carpool/plain pairs measured back to back; medians over")
    print("   repeats otherwise; latencies in ms; mean batch: carpool's /metrics over the window;")
    print("   CPU: share of one core used by the server / the client process in the window)")
    print()

    print("targets")
    for enc in encodings:
        tag = "" if enc == "json" else "  (binary: for information)"
        if 64 in concurrencies:
            ratio = _paired(results, enc, 64, _ratio)
            print(
                f"  [{enc}] 64 clients: carpool/plain throughput = {ratio:.2f}x "
                f"(target >= 2.5x: {_bench.verdict(ratio, 2.5)}){tag}"
            )
        if 1 in concurrencies:
            d = _paired(results, enc, 1, _delta_p50)
            print(
                f"  [{enc}] 1 client: p50 carpool - plain = {d:+.3f} ms "
                f"(target <= +0.5 ms: {_bench.verdict(d, 0.5, higher_is_better=False)}){tag}"
            )


DEFAULT_CONCURRENCY = "1,8,64,256"


def main() -> int:
    if "--client" in sys.argv[1:]:
        return client_main()
    p = _bench.base_parser(__doc__, default_cpus="0,1", default_repeats=3)
    p.add_argument(
        "--concurrency",
        default=DEFAULT_CONCURRENCY,
        help=f"comma-separated client counts (default {DEFAULT_CONCURRENCY})",
    )
    p.add_argument("--encodings", default="json,binary", help="json, binary or both")
    p.add_argument("--warmup", type=float, default=None, help="seconds per step (default 1)")
    p.add_argument(
        "--duration", type=float, default=None, help="measured seconds per step (default 3)"
    )
    p.add_argument(
        "--plain-threads",
        type=int,
        default=1,
        help="threads running the model in the plain server (default 1)",
    )
    p.add_argument("--no-ceiling", action="store_true", help="skip the instant endpoint")
    p.add_argument(
        "--latency-rounds",
        type=int,
        default=None,
        help="alternating carpool/plain rounds per repeat at 1 client, each a "
        "third of --duration (default 4; 2 with --quick)",
    )
    p.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    signal.signal(signal.SIGTERM, _terminate)  # servers are stopped on the way out
    try:
        run(args)
    except (Exception, KeyboardInterrupt) as exc:  # report, never fail the caller
        print(f"\nhttp_bench: {type(exc).__name__}: {exc}", flush=True)
    return 0


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    sys.exit(main())
