"""Scale-out on a loopback Ray cluster: carpool's runner="ray" beside Ray Serve's
@serve.batch with 1, 2 and 4 replicas of a 20 ms model, then one actor killed under load.

The model, the load, the kill and the report; the cluster, its CPU seconds and the Serve
application are benchmarks.harness.ray_cluster's. Without Ray Serve it reports nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

import carpool
from benchmarks.harness import Figures, common, run
from benchmarks.harness import ray_cluster as _ray_cluster  # before Ray: its environment
from carpool.bench.callers import closed_window
from carpool.bench.loops import ShareTally, run_share, sleep_until
from carpool.bench.plan import Share, Timing, clock

BATCH_S = 0.020  # the model's time per batch, whatever its size (a GPU-like call)
MAX_BATCH = 32
CALLERS_PER_REPLICA = 4 * MAX_BATCH  # 4 full batches queued per replica: none waits
REPLICAS = (1, 2, 4)
NODES = 4  # head + 3; each offers one carpool actor slot and one Serve replica slot
QUICK_REPLICAS, QUICK_NODES = (1, 2), 2  # --quick: the same scale-out and kill, on 2 nodes
ACTOR_CPUS = 0.25  # the actors sleep; 2 real cores are shared by everything anyway
# Serve: a replica admits every caller it is sent; with less, callers wait in Serve's router
# and its probes, which cost Serve throughput here (try --serve-max-ongoing 64)
MAX_ONGOING = CALLERS_PER_REPLICA
DRAIN_S = 60.0  # after the load stops, every outstanding request must be answered by then

Windows = dict[str, list[tuple[float, float, float]]]  # name -> (rows/s, batch, cores) each


def sleepy(batch: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """20 ms a batch, the GIL released: the replica waits like a GPU call would."""
    time.sleep(BATCH_S)
    return batch * 2


# ------------------------------------------------------------------------------ load


async def closed_loop(
    call: Callable[[np.ndarray[Any, Any]], Awaitable[Any]],
    counts: Callable[[], tuple[float, float]],
    callers: int,
    warmup_s: float,
    seconds: float,
) -> tuple[float, float, float]:
    """Rows/s that ``callers`` closed-loop callers get through ``call`` (every answer that
    arrives in the window counts), the mean batch over the window from ``counts()``
    (cumulative rows, batches), and the cores the cluster and this process kept busy."""
    row = np.ones(4, np.float32)

    async def send(i: int) -> None:
        await call(row)

    window = await closed_window(
        send,
        callers=callers,
        warmup_s=warmup_s,
        seconds=seconds,
        read=lambda: (_ray_cluster.cluster_cpu_seconds(), counts()),
    )
    (cpu0, (rows0, batches0)), (cpu1, (rows1, batches1)) = window.opened, window.closed
    mean = (rows1 - rows0) / (batches1 - batches0) if batches1 > batches0 else float("nan")
    return window.answered_per_s, mean, (cpu1 - cpu0) / window.seconds


def ray_batcher(replicas: int) -> carpool.Batcher:
    return carpool.Batcher(
        sleepy,
        runner="ray",
        workers=replicas,
        max_batch_size=MAX_BATCH,
        name="sleepy",
        runner_options={"num_cpus": ACTOR_CPUS, "resources": {"carpool_slot": 1}},
    )


async def side_by_side(
    replicas: int, handle: Any, repeats: int, warmup_s: float, seconds: float
) -> Windows:
    """``repeats`` windows each of carpool (N actors) and Serve (N replicas), interleaved,
    the first of each pair alternating."""
    callers = CALLERS_PER_REPLICA * replicas
    serve_client = _ray_cluster.ServeClient(handle)
    check = np.full(4, 3.0, np.float32)
    runs: Windows = {"carpool": [], "serve": []}
    async with ray_batcher(replicas) as batcher:
        for out in (await batcher.infer(check), await serve_client(check)):
            if not np.array_equal(out, check * 2):
                raise RuntimeError(f"wrong answer {out!r} to {check!r}")

        def carpool_counts() -> tuple[float, float]:
            stats = batcher.stats()
            return stats.rows, stats.batches

        contenders: dict[str, tuple[Callable[..., Awaitable[Any]], Callable[[], Any]]] = {
            "carpool": (batcher.infer, carpool_counts),
            "serve": (serve_client, serve_client.counts),
        }
        for r in range(repeats):
            order = ("carpool", "serve") if r % 2 == 0 else ("serve", "carpool")
            for name in order:
                call, counts = contenders[name]
                runs[name].append(await closed_loop(call, counts, callers, warmup_s, seconds))
            (c, cb, cc), (s, sb, sc) = runs["carpool"][-1], runs["serve"][-1]
            print(
                f"  N={replicas}  carpool {c:6.0f} rows/s (batch {cb:4.1f}, {cc:.2f} cores)   "
                f"serve {s:6.0f} rows/s (batch {sb:4.1f}, {sc:.2f} cores)"
            )
    return runs


# ------------------------------------------------------------------------------ faults


class Outcomes:
    """Every request of the fault run: sent, and how each ended (a result, a typed carpool
    error, or, a defect, something else); lost = sent less those that ended."""

    def __init__(self, batcher: carpool.Batcher, callers: int) -> None:
        self.batcher = batcher
        self.rows = [np.full(4, float(index), np.float32) for index in range(callers)]
        self.counts: Counter[str] = Counter()
        self.sent = 0

    async def send(self, i: int) -> str | None:
        row = self.rows[i % len(self.rows)]
        self.sent += 1
        try:
            out = await self.batcher.infer(row)
        except carpool.CarpoolError as exc:
            kind = type(exc).__name__
        except Exception as exc:  # not a typed carpool error: a defect, counted apart
            kind = f"untyped {type(exc).__name__}"
        else:
            kind = "answered" if np.array_equal(out, row * 2) else "wrong"
        self.counts[kind] += 1
        return None if kind == "answered" else kind

    def answered(self) -> tuple[int, float]:
        """Answers so far, and when."""
        return self.counts["answered"], time.perf_counter()


async def kill_one(batcher: carpool.Batcher, replicas: int) -> float:
    """SIGKILL one actor's process; the seconds until every actor is up again (polled: the
    workers' state is a thread's, no event)."""
    pool = batcher._replicas  # the RayReplicas behind the batcher: its actors' pids
    assert pool is not None
    victim = pool.stats().replicas[-1].pid
    assert victim is not None
    restarts = batcher.stats().worker_restarts
    os.kill(victim, signal.SIGKILL)
    killed_at = time.perf_counter()
    while True:
        stats = batcher.stats()
        if stats.worker_restarts > restarts and stats.workers_alive == replicas:
            return time.perf_counter() - killed_at
        await asyncio.sleep(0.05)


async def fault_run(replicas: int, warmup_s: float, seconds: float) -> dict[str, Any]:
    """A fresh batcher of ``replicas`` actors under the same load: a fault-free window of
    ``seconds``, then SIGKILL of one actor's process and a window as long. Every request is
    accounted for: a result, a typed error, or (a defect) lost."""
    async with ray_batcher(replicas) as batcher:
        outcomes = Outcomes(batcher, CALLERS_PER_REPLICA * replicas)
        marks, back_after, hung = await under_fault(outcomes, replicas, warmup_s, seconds)
        stats = batcher.stats()
    (a0, t0), (a1, t1), (a2, t2) = marks
    return {
        "fault_free": (a1 - a0) / (t1 - t0),
        "after_kill": (a2 - a1) / (t2 - t1),
        "sent": outcomes.sent,
        "outcomes": dict(outcomes.counts),
        "lost": outcomes.sent - sum(outcomes.counts.values()),
        "hung": hung,
        "back_after": back_after,
        "restarts": stats.worker_restarts,
        "retried": stats.retried_batches,
        "pending": stats.pending,
    }


async def under_fault(
    outcomes: Outcomes, replicas: int, warmup_s: float, seconds: float
) -> tuple[list[tuple[int, float]], float, bool]:
    """The closed loop through a warm-up and two windows of ``seconds``, one actor killed
    between them: the answers as each window opens and closes, the seconds until the actor
    was back (NaN: not within the window), and whether a request hung past DRAIN_S."""
    start = clock()
    end = start + warmup_s + 2 * seconds
    timing = Timing(start, start + warmup_s, end)
    marks: list[tuple[int, float]] = []
    back_after = [float("nan")]

    async def fault() -> None:
        await sleep_until(timing.window)
        marks.append(outcomes.answered())
        await sleep_until(timing.window + seconds)
        marks.append(outcomes.answered())
        async with asyncio.TaskGroup() as group:
            restart = group.create_task(kill_one(outcomes.batcher, replicas))
            await sleep_until(end)
            marks.append(outcomes.answered())
            restart.cancel()  # back by now, or not back at all
        if not restart.cancelled():
            back_after[0] = restart.result()

    share = Share(concurrency=CALLERS_PER_REPLICA * replicas)
    try:  # the load stops at the window's end; then every answer within DRAIN_S
        async with asyncio.timeout_at(end + DRAIN_S), asyncio.TaskGroup() as tg:
            tg.create_task(fault())
            await run_share(outcomes.send, share, timing, ShareTally())
    except TimeoutError:  # some request never came back: counted as lost
        return marks, back_after[0], True
    return marks, back_after[0], False


# ------------------------------------------------------------------------------ report


Runs = dict[int, Windows]  # N -> name -> windows


def report_scale(runs: Runs, figures: Figures) -> float:
    """The side-by-side table, and its figures: per N each system's rows/s, efficiency
    (from 2 on), mean batch and cores, carpool/Serve; carpool's goals. Returns carpool's
    rows/s at the top N."""
    med = {
        (n, name): tuple(common.median(w[i] for w in windows) for i in range(3))
        for n, by_name in runs.items()
        for name, windows in by_name.items()
    }
    rows = []
    for n in runs:
        (c, cb, cc), (s, sb, sc) = med[(n, "carpool")], med[(n, "serve")]
        c1, s1 = med[(1, "carpool")][0], med[(1, "serve")][0]
        rows.append(
            (n, common.fmt_num(c), f"{c / (n * c1):.2f}", f"{cb:.1f}", f"{cc:.2f}",
             common.fmt_num(s), f"{_ratio(s, n * s1):.2f}", f"{sb:.1f}", f"{sc:.2f}",
             f"{_ratio(c, s):.2f}x")
        )  # fmt: skip
    headers = ["replicas", "carpool rows/s", "eff", "batch", "cores",
               "Serve rows/s", "eff", "batch", "cores", "carpool/Serve"]  # fmt: skip
    print(common.table(headers, rows))
    print(
        "  eff = rows/s / (N x rows/s at N=1); batch = mean rows per model call; "
        "cores = CPU of this process and the whole cluster / wall"
    )
    for n in runs:
        for name in ("carpool", "serve"):
            rows_per_s, batch, cores = med[(n, name)]
            figures.add(f"{name}_rows_per_s_{n}", rows_per_s, "rows/s")
            if n > 1:
                eff = _ratio(rows_per_s, n * med[(1, name)][0])
                if name == "carpool":
                    figures.at_least(f"carpool_efficiency_{n}", eff, 0.9)
                else:
                    figures.add(f"serve_efficiency_{n}", eff, "x")
            figures.add(f"{name}_mean_batch_{n}", batch, "rows")
            figures.add(f"{name}_cores_{n}", cores, "cores")
        figures.add(
            f"carpool_over_serve_{n}", _ratio(med[(n, "carpool")][0], med[(n, "serve")][0]), "x"
        )
    top = max(runs)
    batch_ratio = med[(top, "carpool")][1] / med[(1, "carpool")][1]
    figures.at_least(f"carpool_mean_batch_{top}_over_1", batch_ratio, 0.9)
    return med[(top, "carpool")][0]


def _ratio(a: float, b: float) -> float:
    """a / b; NaN where Serve answered nothing in its window (it stalls on a busy box)."""
    return a / b if b else float("nan")


def report_faults(
    fault: dict[str, Any], replicas: int, scale_rows_per_s: float, figures: Figures
) -> None:
    """The fault run's table, and its figures: goodput before and after the kill and their
    ratio (a goal), the actor's time to come back, restarts, retries, requests sent, answered
    and failed; and a check that every request ended (none lost, none hung)."""
    errors = {k: n for k, n in fault["outcomes"].items() if k != "answered"}
    ratio = fault["after_kill"] / fault["fault_free"]
    print(
        common.table(
            ["window", "goodput rows/s", "vs fault-free"],
            [
                ("fault-free", common.fmt_num(fault["fault_free"]), "1.00"),
                ("after kill -9", common.fmt_num(fault["after_kill"]), f"{ratio:.2f}"),
            ],
        )
    )
    print(
        f"  (scale-out median at {replicas} actors: {common.fmt_num(scale_rows_per_s)} rows/s; "
        f"the killed actor was back after {fault['back_after']:.1f} s; "
        f"restarts {fault['restarts']}, batches retried {fault['retried']})"
    )
    print(f"  errors by type: {errors or 'none'}")
    figures.add("fault_free_rows_per_s", fault["fault_free"], "rows/s")
    figures.add("after_kill_rows_per_s", fault["after_kill"], "rows/s")
    figures.at_least("after_kill_over_fault_free", ratio, 0.7)
    figures.add("back_after_s", fault["back_after"], "s")
    figures.add("restarts", fault["restarts"], "actors")
    figures.add("retried_batches", fault["retried"], "batches")
    figures.add("sent", fault["sent"], "requests")
    figures.add("answered", fault["outcomes"].get("answered", 0), "requests")
    figures.add("errors", sum(errors.values()), "requests")
    figures.add("lost", fault["lost"], "requests")
    figures.check("every_request_ended", fault["lost"] == 0 and not fault["hung"])


def parser() -> argparse.ArgumentParser:
    p = common.base_parser(__doc__, default_cpus="none", default_repeats=3)
    p.add_argument(
        "--serve-wait-s",
        type=float,
        default=0.01,  # Ray's own default; under this load batches fill before it expires
        help="Serve's batch_wait_timeout_s (default 0.01)",
    )
    p.add_argument(
        "--serve-max-ongoing",
        type=int,
        default=MAX_ONGOING,
        help=f"Serve's max_ongoing_requests per replica (default {MAX_ONGOING})",
    )
    return p


def measure(args: argparse.Namespace) -> Figures:
    """The cluster's size, the side-by-side scale-out, the kill under load, and the
    processes left once the cluster is down (none expected); no figures without Ray Serve."""
    repeats = args.repeats or (1 if args.quick else 3)
    warmup_s, seconds = (0.5, 1.0) if args.quick else (1.0, 3.0)
    fault_s = 3.0 if args.quick else 30.0
    replicas, nodes = (QUICK_REPLICAS, QUICK_NODES) if args.quick else (REPLICAS, NODES)
    pinned = common.pin(common.parse_cpus(args.cpus))
    common.header(
        "scale-out on a loopback Ray cluster: carpool runner='ray' vs Ray Serve @serve.batch",
        {
            "cpus": pinned,
            "load": f"{os.getloadavg()[0]:.1f}",
            "ray": common.ray_version(),
            "nodes": nodes,
            "model": f"{BATCH_S * 1000:g} ms/batch",
            "max_batch_size": MAX_BATCH,
            "callers": f"{CALLERS_PER_REPLICA}/replica",
            "serve": f"max_ongoing={args.serve_max_ongoing},wait={args.serve_wait_s:g}s",
            "seconds": seconds,
            "repeats": repeats,
        },
    )
    figures = Figures()
    if not common.ray_available():
        print("ray_scale: needs Ray Serve (pip install 'carpool[ray]' 'ray[serve]'); skipped")
        return figures
    from ray import serve

    begin = time.perf_counter()
    cluster = _ray_cluster.start_cluster(nodes)
    try:
        print(f"cluster: {nodes} nodes on 127.0.0.1 up in {time.perf_counter() - begin:.0f} s")
        figures.add("cluster_nodes", len(_ray_cluster.alive_nodes()), "nodes")
        quiet = _ray_cluster.QuietServe()
        logging.getLogger("ray.serve").addFilter(quiet)
        serve.start(proxy_location="Disabled", http_options={"host": "127.0.0.1"})
        runs = {}
        for n in replicas:
            serving = {"wait_s": args.serve_wait_s, "max_ongoing": args.serve_max_ongoing}
            handle = _ray_cluster.deploy_serve(
                sleepy, n, max_batch=MAX_BATCH, num_cpus=ACTOR_CPUS, **serving
            )
            runs[n] = asyncio.run(side_by_side(n, handle, repeats, warmup_s, seconds))
        serve.delete(_ray_cluster.APP)
        print()
        scale = report_scale(runs, figures)
        print(f"Serve's router: {quiet.late_probes} queue-length probes past their deadline")
        figures.add("serve_late_probes", quiet.late_probes, "probes")
        print()
        print(f"kill -9 one of {max(replicas)} actors under load ({fault_s:g} s windows):")
        fault = asyncio.run(fault_run(max(replicas), warmup_s, fault_s))
        report_faults(fault, max(replicas), scale, figures)
    finally:
        left = _ray_cluster.stop_cluster(cluster)
    took = time.perf_counter() - begin
    print(f"Ray and Serve shut down, processes left: {left}; took {took:.0f} s")
    figures.add("processes_left", left, "processes")
    return figures


if __name__ == "__main__":
    raise SystemExit(run(measure, parser()))
