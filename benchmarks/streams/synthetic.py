"""Step-wise batching of a synthetic model with a GPU-like step cost (fixed + per sequence),
long-tailed lengths, 1-128 closed-loop streams: carpool's StepBatcher against one sequence
at a time, static batching (a loop of ours; Ray Serve's ``@serve.batch`` over an async
generator; LitServe's batched streaming, over HTTP beside ``carpool serve``) and the offline
limit; a lone stream's first output, carpool's own cost per sequence-step, a burst of long
prompts, 10,000 cancellations. docs/benchmarks/streams.md."""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
from typing import Any

import aiohttp

from benchmarks.harness import Figures, common, run
from benchmarks.harness import processes as _process
from benchmarks.streams import _cancel, _http_systems, _probes
from benchmarks.streams._models import Prompted, Synthetic, lengths, step_seconds
from benchmarks.streams._systems import (
    RayStatic,
    StaticLoop,
    closed_loop,
    jobs,
    serial_outputs_per_s,
)
from carpool.steps.batcher import StepBatcher

CLIENTS = (1, 8, 32, 128)
MEAN_LENGTH, MAX_LENGTH = 64, 512


def parser() -> argparse.ArgumentParser:
    p = common.base_parser(__doc__, default_cpus="0", default_repeats=1)
    p.add_argument("--fixed-ms", type=float, default=10.0, help="a step's fixed cost (10)")
    p.add_argument("--per-ms", type=float, default=0.3, help="a step's cost per sequence (0.3)")
    p.add_argument("--max-sequences", type=int, default=32, help="carpool's and Ray's (32)")
    p.add_argument("--window", type=float, default=None, help="seconds measured per run (8)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument(
        "--server-cpus", default="1", help="the HTTP systems' servers' CPUs (1; '' unpinned)"
    )
    p.add_argument("--cancel-streams", type=int, default=None, help="(10000; quick 1000)")
    return p


def measure(args: argparse.Namespace) -> Figures:
    cpus = common.pin(common.parse_cpus(args.cpus))
    repeats = args.repeats or 1
    window = args.window or (0.6 if args.quick else 8.0)
    warmup = 0.3 if args.quick else 2.0
    fixed, per, most = args.fixed_ms / 1000, args.per_ms / 1000, args.max_sequences
    offline = most / step_seconds(fixed, per, most)
    common.header(
        "streams.synthetic",
        {
            "cpus": cpus,
            "step": f"{args.fixed_ms} ms + {args.per_ms} ms/seq",
            "max_sequences": most,
            "window_s": window,
            "repeats": repeats,
        },
    )
    figures = Figures()
    sizes = lengths(4096, MEAN_LENGTH, MAX_LENGTH, args.seed)
    model = Synthetic(fixed, per)

    serial = common.median(serial_outputs_per_s(model, jobs(sizes), window) for _ in range(repeats))
    rates: dict[tuple[str, int], list[float]] = {}
    occupancy: list[float] = []
    exact = True
    statics: list[RayStatic] = []

    async def loops() -> None:
        nonlocal exact
        async with StepBatcher[Any, int](model, max_sequences=most) as batcher:
            for _, clients in itertools.product(range(repeats), CLIENTS):
                before = batcher.stats().step_sizes
                loop = await closed_loop(batcher.stream, clients, jobs(sizes), warmup, window)
                after = batcher.stats().step_sizes
                rates.setdefault(("carpool", clients), []).append(loop.outputs_per_s)
                if clients == CLIENTS[-1]:
                    occupancy.append(_mean_size(before, after) / most)
                static = StaticLoop(model, most)
                held = await closed_loop(
                    static.open, clients, jobs(sizes), warmup, window, static.halt
                )
                rates.setdefault(("static", clients), []).append(held.outputs_per_s)
                ray = RayStatic(model, most, 0.005)
                statics.append(ray)  # its queue's task lives until the loop ends
                rays = await closed_loop(ray.open, clients, jobs(sizes), warmup, window, ray.halt)
                rates.setdefault(("ray", clients), []).append(rays.outputs_per_s)
                exact = exact and loop.exact and held.exact and rays.exact
                print(
                    f"  {clients:4d} streams: carpool {loop.outputs_per_s:8.1f}  "
                    f"static {held.outputs_per_s:8.1f}  ray {rays.outputs_per_s:8.1f} outputs/s"
                )

    asyncio.run(loops())
    http = _over_http(args, sizes, warmup, window)
    rows = []
    figures.add("serial_outputs_per_s", serial, "outputs/s")
    for clients in CLIENTS:
        ours = common.median(rates[("carpool", clients)])
        static = common.median(rates[("static", clients)])
        ray = common.median(rates[("ray", clients)])
        figures.add(f"carpool_outputs_per_s_{clients}", ours, "outputs/s")
        figures.add(f"static_outputs_per_s_{clients}", static, "outputs/s")
        figures.add(f"ray_outputs_per_s_{clients}", ray, "outputs/s")
        rows.append(
            (
                str(clients),
                common.fmt_num(serial, 1),
                common.fmt_num(ray, 1),
                common.fmt_num(static, 1),
                common.fmt_num(ours, 1),
                common.fmt_num(offline, 1),
            )
        )
    print()
    print(common.table(["streams", "serial", "ray", "static", "carpool", "offline"], rows))
    figures.add("offline_limit_outputs_per_s", offline, "outputs/s")
    top = CLIENTS[-1]
    saturated = common.median(rates[("carpool", top)])
    figures.at_least("carpool_over_offline_limit", saturated / offline, 0.9)
    figures.at_least("carpool_over_static", saturated / common.median(rates[("static", top)]), 2)
    figures.add("carpool_over_ray", saturated / common.median(rates[("ray", top)]), "x")
    figures.at_least("mean_active_over_max", common.median(occupancy), 0.9)
    figures.check("outputs_exact", exact)
    _report_http(figures, http)

    ours_ms, direct_ms = asyncio.run(_lone(model, most, 10 if args.quick else 100))
    figures.add("lone_first_output_ms", ours_ms, "ms")
    figures.add("serial_first_output_ms", direct_ms, "ms")
    figures.at_most("lone_first_output_minus_serial_ms", ours_ms - direct_ms, 1, "ms")

    costs, cpu_costs = [], []
    for _ in range(1 if args.quick else 5):  # a shared box is noisy: the median of five
        cost = _probes.own_cost(top, most, 200 if args.quick else 3000, args.seed)
        costs.append(cost.us_per_sequence_step)
        cpu_costs.append(cost.cpu_us_per_sequence_step)
        print(
            f"  own cost: {cost.sequence_steps} sequence-steps in {cost.wall_s:.2f} s, "
            f"{cost.model_s:.3f} s of it the model's: {cost.us_per_sequence_step:.2f} us each "
            f"({cost.cpu_us_per_sequence_step:.2f} us of CPU)"
        )
    figures.at_most("own_us_per_sequence_step", common.median(costs), 5, "us")
    figures.add("own_cpu_us_per_sequence_step", common.median(cpu_costs), "us")

    prompted = Prompted(fixed, per, per / 6)
    arrive = functools.partial(
        _probes.burst,
        prompted,
        max_sequences=most,
        active=16,
        arrivals=4 if args.quick else 8,
        prompt=256 if args.quick else 1024,
        before_s=0.4 if args.quick else 2.0,
    )
    chunked, whole = arrive(step_tokens=4 * most), arrive(step_tokens=None)
    for name, b in (("chunked", chunked), ("unchunked", whole)):
        print(
            f"  burst, {name}: p99 gap {b.p99_before_ms:.1f} ms before, "
            f"{b.p99_during_ms:.1f} ms during ({b.during_s:.2f} s)"
        )
    figures.at_most("burst_p99_gap_during_over_before", chunked.ratio, 2)
    figures.add("burst_p99_gap_during_over_before_unchunked", whole.ratio, "x")

    streams = args.cancel_streams or (1000 if args.quick else 10_000)
    outcome = _cancel.cancellations(streams, 256, most, args.seed)
    print(
        f"  cancellations: {streams} streams, "
        + ", ".join(f"{way} {n}" for way, n in sorted(outcome.ways.items()))
    )
    figures.check("cancel_slots_freed", outcome.slots_freed)
    figures.check("cancel_outputs_exact", outcome.exact)
    figures.check("cancel_counts_add_up", outcome.counts_add_up)
    return figures


HttpRates = dict[tuple[str, int], tuple[float, bool]]  # (system, streams) -> outputs/s, exact


def _over_http(
    args: argparse.Namespace, sizes: list[int], warmup: float, window: float
) -> HttpRates:
    """carpool serve's ``generate_stream`` and LitServe (when its venv is there), each a
    server pinned to ``--server-cpus``, the same closed loops over aiohttp from here."""
    cpus = common.parse_cpus(args.server_cpus) if args.server_cpus else None
    costs = args.fixed_ms, args.per_ms, args.max_sequences
    servers = {"carpool_http": _http_systems.carpool_server(cpus, *costs)}
    litserve = _http_systems.litserve_server(cpus, *costs, 5.0)  # Ray's wait, 5 ms
    if litserve is None:
        print(f"  litserve: not run, no venv ({_http_systems.SETUP_LITSERVE} makes it)")
    else:
        servers["litserve"] = litserve
    openers = {"carpool_http": _http_systems.carpool_opener,
               "litserve": _http_systems.litserve_opener}  # fmt: skip
    rates: HttpRates = {}

    async def loops() -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            for clients in CLIENTS:
                for name, server in servers.items():
                    opener = openers[name](session, server.base)
                    loop = await closed_loop(opener, clients, jobs(sizes), warmup, window)
                    rates[name, clients] = loop.outputs_per_s, loop.exact
                    async for _ in opener((-1, 1)):  # LitServe ends a batch its clients left
                        pass  # only when its longest member ends: the next cell waits for it
                print(
                    f"  {clients:4d} streams over HTTP: "
                    + "  ".join(f"{n} {rates[n, clients][0]:8.1f}" for n in servers)
                    + " outputs/s"
                )

    try:
        _process.wait_all(servers.values())
        asyncio.run(loops())
    finally:
        for server in servers.values():
            server.stop()
    return rates


def _report_http(figures: Figures, rates: HttpRates) -> None:
    """Each HTTP system's outputs/s a streams count; carpool over LitServe at saturation."""
    systems = sorted({name for name, _ in rates})
    for name in systems:
        for clients in CLIENTS:
            figures.add(f"{name}_outputs_per_s_{clients}", rates[name, clients][0], "outputs/s")
    top = CLIENTS[-1]
    if "litserve" in systems:
        ratio = rates["carpool_http", top][0] / rates["litserve", top][0]
        figures.at_least("carpool_http_over_litserve", ratio, 2)
    figures.check("http_outputs_exact", all(exact for _, exact in rates.values()))


async def _lone(model: Synthetic, most: int, rounds: int) -> tuple[float, float]:
    async with StepBatcher[Any, int](model, max_sequences=most) as batcher:
        return await _probes.first_output_ms(batcher, model, rounds)


def _mean_size(before: dict[int, int], after: dict[int, int]) -> float:
    steps = {n: after.get(n, 0) - before.get(n, 0) for n in after}
    count = sum(steps.values())
    return sum(n * c for n, c in steps.items()) / count if count else 0.0


if __name__ == "__main__":
    raise SystemExit(run(measure, parser()))
