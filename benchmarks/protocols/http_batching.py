"""carpool serve against plain uvicorn calling the same numpy MLP once per request, over v2
REST JSON and binary, loaded by carpool bench: batching must pay at many clients (goal: >=
2.5x req/s at 64) and cost next to nothing at one (goal: p50 within 0.5 ms); an instant
endpoint (a canned answer) shows the client's ceiling. See docs/benchmarks/protocols.md.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from benchmarks.harness import Figures, common, run
from benchmarks.harness import processes as _process

MODEL = "mlp"
SERVERS = ("carpool", "plain", "instant")
ENCODINGS = ("json", "binary")
CONCURRENCY = "1,8,64,256"
NEEDED = ("aiohttp", "orjson", "uvicorn", "httptools", "uvloop", "threadpoolctl", "rich")
Results = dict[tuple[str, str, int], list[dict[str, Any]]]  # (server, encoding, clients)


def start_servers(
    cores: _process.Cores, plain_threads: int = 1, only: tuple[str, ...] = SERVERS
) -> dict[str, _process.Server]:
    """The servers named in ``only``, started in parallel, pinned, ready."""
    servers: dict[str, _process.Server] = {}
    try:
        if "carpool" in only:
            servers["carpool"] = _process.carpool_serve(
                "benchmarks.harness.http_models:mlp", "--max-batch-size", "32", cpus=cores.server
            )
        if "plain" in only:
            servers["plain"] = _process.uvicorn(
                "benchmarks.harness.http_models:plain_app",
                cpus=cores.server,
                PLAIN_THREADS=str(plain_threads),
            )
        if "instant" in only:
            servers["instant"] = _process.uvicorn(
                "benchmarks.harness.http_models:instant_app", cpus=cores.server
            )
        _process.wait_all(servers.values())
    except BaseException:
        for server in servers.values():
            server.stop()
        raise
    return servers


def check(server: _process.Server, compare: bool) -> str:
    """'ok', or what is wrong with the server's answers to three rows in each encoding."""
    import numpy as np

    from benchmarks.harness import http_models

    rows = np.random.default_rng(1).standard_normal((3, 1, 512)).astype(np.float32)
    problems = []
    for encoding in ENCODINGS:
        for x in rows:
            try:
                got = _process.infer(
                    server, MODEL, {"INPUT0": ("FP32", x)}, binary=encoding == "binary"
                )
            except OSError as exc:
                problems.append(f"{encoding}: {exc}")
                continue
            want = http_models.model(x)
            if got.shape != want.shape or (
                compare and not np.allclose(got, want, rtol=1e-4, atol=1e-4)
            ):
                problems.append(f"{encoding}: wrong output (shape {list(got.shape)})")
    return "ok" if not problems else "; ".join(problems)


def model_ms() -> list[float]:
    """The model's own cost on this (the client's) core: median ms at 1 and 32 rows."""
    import numpy as np

    from benchmarks.harness import http_models

    out = []
    for rows in (1, 32):
        x = np.random.default_rng(2).standard_normal((rows, 512)).astype(np.float32)
        times = []
        for i in range(35 if rows == 1 else 20):
            t0 = time.perf_counter()
            http_models.model(x)
            if i >= 5:  # the first calls warm up
                times.append(time.perf_counter() - t0)
        out.append(common.median(times) * 1e3)
    return out


def schedule(
    concurrencies: list[int], rounds: int, quick: bool
) -> list[tuple[list[int], int, int]]:
    """One repeat's runs: (concurrencies of one ``carpool bench`` run, round, rounds).
    ``--quick`` runs every concurrency in one run per server."""
    if quick:
        return [(concurrencies, 0, 1)]
    plan = []
    for c in concurrencies:
        n = rounds if c == 1 else 1
        plan += [([c], k, n) for k in range(n)]
    return plan


def load(
    args: argparse.Namespace, servers: dict[str, _process.Server], cores: _process.Cores
) -> Results:
    """Every repeat's runs, carpool and plain back to back (alternating), then instant."""
    results: Results = {}
    plan = schedule(args.concurrency, args.latency_rounds, args.quick)
    for r in range(args.repeats):
        for group, k, rounds in plan:
            short = group == [1]  # a latency round: shorter, so rounds interleave finely
            warmup = min(args.warmup, 0.3) if short else args.warmup
            duration = max(args.duration / 3, 0.2) if short else args.duration
            for encoding in args.encodings:
                pair = ["carpool", "plain"] if (r * rounds + k) % 2 == 0 else ["plain", "carpool"]
                order = pair + (["instant"] if k == 0 and not args.no_ceiling else [])
                for name in order:
                    bench = _process.carpool_bench(
                        servers[name],
                        MODEL,
                        group,
                        warmup=warmup,
                        duration=duration,
                        cpus=cores.client,
                        flags=("--encoding", encoding),
                    )
                    where = f"repeat {r + 1}/{args.repeats}" + (f".{k + 1}" if rounds > 1 else "  ")
                    for row in bench.rows():
                        results.setdefault((name, encoding, row["clients"]), []).append(row)
                        print(f"  {where}  {encoding:6s} {name:8s} {progress(row, name)}")
    return results


def progress(row: dict[str, Any], name: str) -> str:
    """One run's figures on one line (mean batch: carpool only)."""
    batch = f"  batch {row['mean_batch']:5.1f}" if name == "carpool" else ""
    errors = f"  ERRORS {row['errors']}" if row["errors"] else ""
    return (
        f"c={row['clients']:<3d} {row['throughput']:8.0f} req/s  p50 {row['p50_ms']:7.2f} ms"
        f"  p99 {row['p99_ms']:7.2f} ms  srv CPU {row['server_cpu']:4.0%}{batch}{errors}"
    )


# ------------------------------------------------------------------------------ report


def _med(results: Results, key: tuple[str, str, int], field: str) -> float:
    return common.median(r[field] for r in results.get(key, []))


def _paired(results: Results, enc: str, c: int, field: str) -> float:
    """Median over the back-to-back (carpool, plain) pairs: req/s ratio, or p50 difference."""
    pairs = zip(
        results.get(("carpool", enc, c), []), results.get(("plain", enc, c), []), strict=False
    )
    if field == "ratio":
        return common.median(a["throughput"] / b["throughput"] for a, b in pairs if b["throughput"])
    return common.median(a["p50_ms"] - b["p50_ms"] for a, b in pairs)


def report_ceiling(results: Results, concurrencies: list[int], encodings: list[str]) -> Figures:
    """The instant endpoint's table; its req/s per encoding and client count."""
    fmt = common.fmt_num
    figures = Figures()
    print("client ceiling: the instant endpoint (canned answer, no model), medians")
    rows = []
    for enc in encodings:
        for c in concurrencies:
            k = ("instant", enc, c)
            rows.append(
                [enc, c, fmt(_med(results, k, "throughput")), fmt(_med(results, k, "p50_ms"), 2),
                 fmt(_med(results, k, "p99_ms"), 2), f"{_med(results, k, 'server_cpu'):.0%}"]
            )  # fmt: skip
            figures.add(
                f"rest_{enc}_instant_req_per_s_{c}", _med(results, k, "throughput"), "req/s"
            )
    print(common.table(["enc", "clients", "req/s", "p50 ms", "p99 ms", "server CPU"], rows))
    print()
    return figures


def report(results: Results, concurrencies: list[int], encodings: list[str]) -> Figures:
    """The carpool/plain table, and its figures per encoding and client count; the goals."""
    fmt = common.fmt_num
    figures = Figures()
    print("carpool serve vs plain uvicorn (same model, same client), medians over repeats")
    rows = []
    errors = 0
    for enc in encodings:
        for c in concurrencies:
            kc, kp = ("carpool", enc, c), ("plain", enc, c)
            errors += sum(r["errors"] for k in (kc, kp) for r in results.get(k, []))
            rows.append([
                enc, c, fmt(_med(results, kc, "throughput")), fmt(_med(results, kp, "throughput")),
                f"{_paired(results, enc, c, 'ratio'):.2f}x",
                fmt(_med(results, kc, "p50_ms"), 2), fmt(_med(results, kp, "p50_ms"), 2),
                f"{_paired(results, enc, c, 'p50'):+.2f}",
                fmt(_med(results, kc, "p99_ms"), 2), fmt(_med(results, kp, "p99_ms"), 2),
                fmt(_med(results, kc, "mean_batch"), 1),
                f"{_med(results, kc, 'server_cpu'):.0%}/{_med(results, kp, 'server_cpu'):.0%}",
                sum(r["errors"] for k in (kc, kp) for r in results.get(k, [])),
            ])  # fmt: skip
            for server, key in (("carpool", kc), ("plain", kp)):
                name = f"rest_{enc}_{server}"
                figures.add(f"{name}_req_per_s_{c}", _med(results, key, "throughput"), "req/s")
                figures.add(f"{name}_p50_ms_{c}", _med(results, key, "p50_ms"), "ms")
                figures.add(f"{name}_p99_ms_{c}", _med(results, key, "p99_ms"), "ms")
            figures.add(f"rest_{enc}_mean_batch_{c}", _med(results, kc, "mean_batch"), "rows")
    headers = ["enc", "clients", "carpool req/s", "plain req/s", "ratio", "carpool p50",
               "plain p50", "Δp50 ms", "carpool p99", "plain p99", "mean batch",
               "srv CPU c/p", "errors"]  # fmt: skip
    print(common.table(headers, rows))
    print("  (ratio, Δp50: medians over carpool/plain pairs measured back to back; medians over")
    print("   repeats otherwise; latencies in ms; mean batch: carpool's /metrics over the window;")
    print("   srv CPU: share of one core the server used while loaded)")
    print()
    print("targets")
    for enc in encodings:
        tag = "" if enc == "json" else "  (binary: for information)"
        for c in concurrencies:  # the goals are JSON's at 64 clients and at 1
            ratio, d = _paired(results, enc, c, "ratio"), _paired(results, enc, c, "p50")
            if enc == "json" and c == 64:
                figures.at_least(f"rest_{enc}_carpool_over_plain_{c}", ratio, 2.5)
            else:
                figures.add(f"rest_{enc}_carpool_over_plain_{c}", ratio, "x")
            if enc == "json" and c == 1:
                figures.at_most(f"rest_{enc}_p50_ms_carpool_minus_plain_{c}", d, 0.5, "ms")
            else:
                figures.add(f"rest_{enc}_p50_ms_carpool_minus_plain_{c}", d, "ms")
        if 64 in concurrencies:
            ratio = _paired(results, enc, 64, "ratio")
            print(f"  [{enc}] 64 clients: carpool/plain throughput = {ratio:.2f}x "
                  f"(target >= 2.5x: {common.verdict(ratio, 2.5)}){tag}")  # fmt: skip
        if 1 in concurrencies:
            d = _paired(results, enc, 1, "p50")
            ok = common.verdict(d, 0.5, higher_is_better=False)
            print(f"  [{enc}] 1 client: p50 carpool - plain = {d:+.3f} ms "
                  f"(target <= +0.5 ms: {ok}){tag}")  # fmt: skip
    figures.add("errors", int(errors))
    return figures


# ------------------------------------------------------------------------------ main


def parser() -> argparse.ArgumentParser:
    p = common.base_parser(__doc__, default_cpus="0,1", default_repeats=3)
    p.add_argument(
        "--concurrency",
        default=None,
        help=f"client counts (default {CONCURRENCY}; 1,64 with --quick)",
    )
    p.add_argument(
        "--encodings", default=None, help="json, binary or both (default both; json with --quick)"
    )
    p.add_argument("--warmup", type=float, default=None, help="seconds per run (default 1)")
    p.add_argument(
        "--duration", type=float, default=None, help="measured seconds per run (default 3)"
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
        default=4,
        help="alternating carpool/plain rounds per repeat at 1 client, "
        "each a third of --duration (default 4)",
    )
    return p


def settle(args: argparse.Namespace) -> None:
    """The defaults that depend on ``--quick``, filled in."""
    quick = args.quick
    args.concurrency = [
        int(c) for c in (args.concurrency or ("1,64" if quick else CONCURRENCY)).split(",")
    ]
    args.encodings = (args.encodings or ("json" if quick else "json,binary")).split(",")
    args.repeats = args.repeats or (1 if quick else 3)
    args.warmup = args.warmup if args.warmup is not None else (0.2 if quick else 1.0)
    args.duration = args.duration if args.duration is not None else (0.4 if quick else 3.0)


def measure(args: argparse.Namespace) -> Figures:
    settle(args)
    missing = common.missing_modules(NEEDED)
    if missing:
        raise ModuleNotFoundError(
            f"lacks {', '.join(missing)}: install carpool's server and bench extras, "
            "e.g.  python -m pip install -e '.[server,bench]'"
        )
    cores = _process.split_cpus(args.cpus)
    _process.pin_self(cores.client)  # the orchestrator mostly waits: keep it off the servers'
    figures = Figures()
    servers: dict[str, _process.Server] = {}
    try:
        servers = start_servers(cores, args.plain_threads)
        one, many = model_ms()
        figures.add("model_ms_1_row", one, "ms")
        figures.add("model_ms_32_rows", many, "ms")
        common.header(
            "carpool serve vs plain uvicorn over HTTP (KServe v2), MLP 512->2048x3->512",
            {
                "cpus": str(cores),
                "client": "carpool bench",
                "repeats": args.repeats,
                "window": f"{args.warmup:g}s warm-up + {args.duration:g}s measured",
                "plain_threads": args.plain_threads,
                "model_ms(1,32 rows)": f"{one:.2f},{many:.2f}",
            },
        )
        for name, server in servers.items():
            verdict = check(server, compare=name != "instant")
            print(f"  check {name:8s}: {verdict}")
            figures.check(f"{name}_answers_ok", verdict == "ok")
        print()
        if figures.failed_checks():
            return figures
        results = load(args, servers, cores)
        print()
        if not args.no_ceiling:
            figures.update(report_ceiling(results, args.concurrency, args.encodings))
        figures.update(report(results, args.concurrency, args.encodings))
    finally:
        for server in servers.values():
            server.stop()
    return figures


if __name__ == "__main__":
    raise SystemExit(run(measure, parser()))
