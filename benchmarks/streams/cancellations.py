"""Streams given up at random points, 10,000 a protocol (the library, gRPC's ModelStreamInfer,
SSE's generate_stream), 64 at a time, over a real ``carpool serve``: every slot freed within
one step, ``carpool_active_sequences`` back to 0, every request counted once, every stream
that ran to its end exact. docs/benchmarks/streams.md."""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.harness import Figures, common, run
from benchmarks.harness import processes as _process
from benchmarks.streams import _cancel_clients as clients
from benchmarks.streams._cancel_model import DUMP, MAX_SEQUENCES, MODEL, Counting, Ledger
from carpool.steps.batcher import StepBatcher

PROTOCOLS = ("library", "grpc", "sse")
LABELS = {"grpc": "grpc", "sse": "generate"}  # /metrics' protocol label of each
ZERO_WITHIN_S = 30.0  # how long the scenario waits for the active count to reach 0


def parser() -> argparse.ArgumentParser:
    p = common.base_parser(__doc__, default_cpus="0,1", default_repeats=1)
    p.add_argument("--streams", type=int, default=None, help="per protocol (10000; quick 300)")
    p.add_argument("--concurrent", type=int, default=64, help="streams in flight (64)")
    p.add_argument("--step-ms", type=float, default=10.0, help="a step's cost, slept (10)")
    p.add_argument("--seed", type=int, default=11)
    return p


def measure(args: argparse.Namespace) -> Figures:
    cores = _process.split_cpus(args.cpus)
    _process.pin_self(cores.client)
    streams = args.streams or (300 if args.quick else 10_000)
    step_s = args.step_ms / 1000
    common.header(
        "streams.cancellations",
        {
            "cpus": str(cores),
            "streams": f"{streams} a protocol, {args.concurrent} at a time",
            "model": f"{args.step_ms:g} ms a step, {MAX_SEQUENCES} sequences at most",
        },
    )
    figures = Figures()
    plans = {
        protocol: clients.plan(streams, (i + 1) * streams, step_s, args.seed + i)
        for i, protocol in enumerate(PROTOCOLS)
    }
    _report(figures, "library", *_library(plans["library"], args.concurrent, step_s))
    with tempfile.TemporaryDirectory() as tmp:
        ledger_path = Path(tmp) / "ledger.json"
        server, grpc_address = _serve(cores, step_s, ledger_path)
        try:
            server.wait_ready()
            for protocol in PROTOCOLS[1:]:
                where = grpc_address if protocol == "grpc" else server.base
                result = _over_the_wire(server, protocol, where, plans[protocol], args.concurrent)
                _post(server, {"key": DUMP, "length": 1})  # after the counts were read
                _report(figures, protocol, *result, Ledger.read(ledger_path))
        finally:
            server.stop()
    return figures


def _library(
    planned: list[clients.Planned], concurrent: int, step_s: float
) -> tuple[clients.Outcome, dict[str, Any], Ledger]:
    """The streams through a StepBatcher in this process: its own books after."""
    model = Counting(step_s)

    async def main() -> tuple[clients.Outcome, dict[str, Any]]:
        async with StepBatcher[Any, int](model, max_sequences=MAX_SEQUENCES) as batcher:
            outcome = await clients.run(planned, concurrent, clients.library(batcher))
            left = time.perf_counter()
            while batcher.active or batcher.waiting:
                if time.perf_counter() - left > ZERO_WITHIN_S:
                    break
                await asyncio.sleep(0.001)
            zero_ms = 1e3 * (time.perf_counter() - left)
            s = batcher.stats()
            books = {
                "active": batcher.active + batcher.waiting,
                "zero_ms": zero_ms,
                "ok": s.completed,
                "closed": s.cancelled,
                "balanced": s.completed + s.cancelled == s.submitted and not s.failed,
            }
            return outcome, books

    outcome, books = asyncio.run(main())
    return outcome, books, model.ledger


def _serve(cores: _process.Cores, step_s: float, ledger: Path) -> tuple[_process.Server, str]:
    """``carpool serve`` of the model, REST and gRPC, pinned (not waited on); its gRPC address."""
    port, grpc_port = _process.free_port(), _process.free_port()
    argv = [sys.executable, "-m", "carpool", "serve", "benchmarks.streams._cancel_model:cancel",
            "--port", str(port), "--grpc-port", str(grpc_port), "--access-log", "false",
            "--log-level", "warning"]  # fmt: skip
    env = _process.child_env(
        BENCH_CANCEL_LEDGER=str(ledger), BENCH_CANCEL_STEP_MS=str(step_s * 1000)
    )
    server = _process.Server("carpool serve (cancel)", argv, port, cores.server, env)
    return server, f"127.0.0.1:{grpc_port}"


def _over_the_wire(
    server: _process.Server,
    protocol: str,
    where: str,
    planned: list[clients.Planned],
    concurrent: int,
) -> tuple[clients.Outcome, dict[str, Any]]:
    """The streams over ``protocol`` to ``where``; the server's counts of them (``/metrics``,
    before and after) and how long its active count took to reach 0 once the last client
    left."""
    before = _counts(server, LABELS[protocol])
    outcome = asyncio.run(_streams(protocol, where, planned, concurrent))
    left = time.perf_counter()
    active = _counts(server, LABELS[protocol])["active"]
    while active and time.perf_counter() - left < ZERO_WITHIN_S:
        time.sleep(0.001)
        active = _counts(server, LABELS[protocol])["active"]
    zero_ms = 1e3 * (time.perf_counter() - left)
    after = _counts(server, LABELS[protocol])
    delta = {k: after[k] - before[k] for k in ("ok", "closed", "received", "done")}
    books = {
        "active": active,
        "zero_ms": zero_ms,
        "ok": delta["ok"],
        "closed": delta["closed"],
        "balanced": delta["received"] == delta["done"] and after["failed"] == 0,
    }
    return outcome, books


async def _streams(
    protocol: str, where: str, planned: list[clients.Planned], concurrent: int
) -> clients.Outcome:
    """The streams over gRPC (``where``: host:port) or SSE (``where``: the base URL)."""
    if protocol == "grpc":
        import grpc
        from tritonclient.grpc import service_pb2_grpc as pb_grpc

        async with grpc.aio.insecure_channel(where) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            return await clients.run(planned, concurrent, clients.grpc_streams(stub, MODEL))
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=300, sock_read=60)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(where, timeout=timeout, connector=connector) as s:
        return await clients.run(planned, concurrent, clients.sse_streams(s, MODEL))


_SAMPLE = re.compile(r"^(\w+)\{([^}]*)\} (\S+)$")


def _counts(server: _process.Server, label: str) -> dict[str, float]:
    """The model's counts in ``/metrics``: requests over ``label`` answered in full (ok) and
    given up by their client (closed), the batcher's received and ended, active sequences."""
    with urllib.request.urlopen(server.base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    counts = dict.fromkeys(("ok", "closed", "received", "done", "failed", "active"), 0.0)
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None:
            continue
        name, value = m.group(1), float(m.group(3))
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if labels.get("model") != MODEL:
            continue
        if name == "carpool_requests_total" and labels.get("protocol") == label:
            key = {"success": "ok", "client_closed": "closed"}.get(labels["outcome"], "failed")
            counts[key] += value
        elif name == "carpool_batcher_received_total":
            counts["received"] += value
        elif name == "carpool_batcher_requests_total":
            counts["done"] += value
            counts["failed"] += value if labels["outcome"] in ("failed", "expired") else 0
        elif name == "carpool_active_sequences":
            counts["active"] += value
    return counts


def _post(server: _process.Server, body: dict[str, Any]) -> None:
    import json

    request = urllib.request.Request(
        server.url(MODEL) + "/generate", json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as r:
        r.read()


def _report(
    figures: Figures,
    protocol: str,
    outcome: clients.Outcome,
    books: dict[str, Any],
    ledger: Ledger,
) -> None:
    steps = [ledger.steps_after(key, t) for key, t in outcome.cancelled_at.items()]
    lags = [ledger.delivered_after(key, t) for key, t in outcome.finished_at.items()]
    delivery = sorted(1e3 * lag for lag in lags if lag is not None)
    cancelled = len(outcome.cancelled_at)
    late = sum(1 for n in steps if n > 1)
    print(
        f"  {protocol}: {outcome.streams} streams in {outcome.wall_s:.1f} s, {cancelled} given "
        f"up, {outcome.exact}/{outcome.completed} read to the end exact; server ok "
        f"{books['ok']:g}, closed {books['closed']:g}; active 0 after {books['zero_ms']:.1f} ms; "
        f"steps after a cancel: max {max(steps, default=0)}, {late} over 1 "
        f"({_spread(steps)}); a last output arrived {_quantile(delivery, 0.5):.1f} ms after "
        f"its step (p50), {_quantile(delivery, 0.99):.1f} ms (p99)"
    )
    for error in outcome.errors[:5]:
        print(f"    error: {error}")
    p = protocol
    figures.add(f"{p}_streams", outcome.streams, "streams")
    figures.add(f"{p}_cancelled", cancelled, "streams")
    figures.add(f"{p}_completed_exact", outcome.exact, "streams")
    figures.add(f"{p}_wall_s", outcome.wall_s, "s")
    figures.add(f"{p}_streams_per_s", outcome.streams / outcome.wall_s, "streams/s")
    figures.at_most(f"{p}_max_steps_to_free", max(steps, default=0), 1, "steps")
    figures.add(f"{p}_freed_late", late, "streams")
    figures.add(f"{p}_active_zero_ms", books["zero_ms"], "ms")
    figures.add(f"{p}_delivery_p50_ms", _quantile(delivery, 0.5), "ms")
    figures.add(f"{p}_delivery_p99_ms", _quantile(delivery, 0.99), "ms")
    exact = not outcome.wrong and not outcome.errors and outcome.exact == outcome.completed
    unseen = outcome.streams - int(books["ok"] + books["closed"])
    figures.add(f"{p}_never_reached_server", unseen, "streams")
    figures.check(f"{p}_outputs_exact", exact)
    figures.check(f"{p}_active_back_to_zero", books["active"] == 0)
    # Every stream counted once, as answered or given up, but those given up before their
    # first output that the server never saw (cancelled before their request was read).
    counted = 0 <= unseen <= outcome.early and books["ok"] >= outcome.exact
    figures.check(f"{p}_nothing_lost", counted and books["balanced"])


def _quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile of sorted ``values`` (nan for none)."""
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def _spread(steps: list[int]) -> str:
    """How many cancels took 0, 1, 2, ... steps to free."""
    counts = Counter(steps)
    return ", ".join(f"{n}: {counts[n]}" for n in sorted(counts))


if __name__ == "__main__":
    raise SystemExit(run(measure, parser()))
