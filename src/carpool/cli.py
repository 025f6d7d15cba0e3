"""The ``carpool`` command: flags in, calls into the library out; no logic of its own.

Every option also reads an environment variable (``CARPOOL_`` + its name), which the flag
overrides, so containers can be configured without rewriting the command line.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from carpool.envflags import add_flag, parse_bool

_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _add_serve(commands: Any) -> None:
    serve = commands.add_parser(
        "serve",
        help="serve models over the KServe v2 / Triton HTTP protocol, batching requests",
        description="Serve one or more models over the KServe v2 Open Inference Protocol "
        "(REST), with dynamic batching behind every model. Works with tritonclient, "
        "perf_analyzer and KServe. With no TARGET, serves the built-in 'demo' model.",
        epilog="TARGET is 'module:attr' naming a batched function (stacked batch in, one "
        "row out per row), a torch.nn.Module or a carpool.Model; a model file (model.onnx, "
        "a TorchScript model.pt), named after its stem; a model repository folder with one "
        "subfolder per model (its file and an optional carpool.toml); or a built-in: "
        "'demo', 'minilm'. Batching flags apply to every model and override the config "
        "file's [models.NAME] tables, which override a model folder's carpool.toml, which "
        "overrides what the model itself declares.",
    )
    serve.add_argument("targets", nargs="*", metavar="TARGET", help="models to serve")
    add_flag(serve, "--host", str, None, "address to listen on [127.0.0.1]")
    add_flag(serve, "--port", int, None, "port to listen on [8000]")
    add_flag(
        serve, "--name", str, None, "model name for a single TARGET (default: attr or file stem)"
    )
    add_flag(serve, "--config", str, None, "TOML file with [server] and [models.NAME] tables")
    serve.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME:DATATYPE:DIMS",
        help="declare an input of a single TARGET, e.g. INPUT0:FP32:256 (repeat for several); "
        "requests that do not match get a 400",
    )
    serve.add_argument(
        "--output",
        action="append",
        default=[],
        metavar="NAME:DATATYPE:DIMS",
        help="declare an output of a single TARGET, e.g. OUTPUT0:FP32:8 (repeat for several)",
    )
    add_flag(serve, "--max-batch-size", int, None, "rows per model call at most [32]")
    add_flag(serve, "--max-wait-ms", float, None, "longest deliberate wait for a batch [5.0]")
    add_flag(serve, "--policy", str, None, "batching policy: eager, fixed or adaptive [eager]")
    add_flag(
        serve,
        "--latency-slo-ms",
        float,
        None,
        "latency objective of --policy adaptive: it batches for it, and answers 503 at once "
        "to requests predicted to miss it",
    )
    add_flag(serve, "--workers", int, None, "batches run at once per model [1]")
    add_flag(serve, "--max-queue-size", int, None, "rows allowed to wait; then 503 [no limit]")
    add_flag(
        serve,
        "--default-timeout-ms",
        float,
        None,
        "queue timeout for requests that send none; then 503 [none]",
    )
    add_flag(serve, "--max-body-bytes", int, None, "largest request body; then 413 [67108864]")
    add_flag(serve, "--drain-timeout", float, None, "seconds to finish requests on SIGTERM [30]")
    add_flag(serve, "--log-level", str, None, "debug, info, warning or error [info]")
    add_flag(serve, "--log-format", str, None, "text, or json for one object per line [text]")
    add_flag(serve, "--access-log", parse_bool, None, "log every request (true/false) [true]")


def _list_of(convert: Callable[[str], Any], name: str) -> Callable[[str], list[Any]]:
    """A comma-separated list flag (``1,8,64``); numpy is imported only when it is used."""

    def parse(text: str) -> list[Any]:
        from carpool.bench.load import parse_list

        try:
            return list(parse_list(text, convert))
        except (TypeError, ValueError):
            raise ValueError(text) from None

    parse.__name__ = name
    return parse


_BENCH_DESCRIPTION = """\
Measure a model under load: throughput, latency percentiles, errors by kind and, when the
target is carpool, what the batcher did (mean batch size, batch sizes, queue-wait share).

TARGET is a model on any KServe v2 server (carpool, Triton, MLServer, KServe):
http://HOST:PORT/v2/models/NAME; or a model run in this process through its own batcher,
to measure batching without HTTP: anything `carpool serve` takes (module:attr, a model
file, demo, minilm).

Load modes, each a list of steps run one after another:
  --concurrency N,...  closed loop: N callers, each sends its next request when answered
  --rate R,...         open loop: Poisson arrivals at R requests/s; latency runs from the
                       scheduled send time, so queueing is never hidden by a slow client
  --trace FILE         open loop: replay the send times (seconds, first CSV column)
Each step warms up (--warmup, not recorded), then runs --duration seconds or --requests N.
Requests are generated from the model's v2 metadata (random, --seed), or read from
--input-data (JSONL) or, for BYTES inputs, --strings."""

_BENCH_EPILOG = """\
examples:
  carpool bench http://127.0.0.1:8000/v2/models/demo --concurrency 1,8,64,256
  carpool bench http://127.0.0.1:8000/v2/models/demo --rate 500,1000 --slo-ms 20 --json a.json
  carpool bench demo --concurrency 16 --requests 2000          # the batcher alone, no HTTP
  carpool bench demo --sweep-batching --max-batch-size 8,16,32 --max-wait-ms 0,2,5 \\
      --policy fixed --concurrency 64 --p99-budget-ms 20
  carpool bench URL --trace arrivals.csv --client-processes 2 --plot run.png
  carpool bench --compare a.json b.json --plot compare.png

Errors never stop a run: they are counted by kind (HTTP status, or the exception's type).
Exit status: 0 when the run completed (even with counted errors), 2 on a usage error.
Every option also reads an environment variable, CARPOOL_BENCH_ + its name."""


def _add_bench(commands: Any) -> None:
    bench = commands.add_parser(
        "bench",
        help="measure throughput and latency of a v2 server's model, or of a batcher",
        description=_BENCH_DESCRIPTION,
        epilog=_BENCH_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )

    ints, floats = _list_of(int, "integer list"), _list_of(float, "number list")
    bench.add_argument(
        "target", nargs="?", metavar="TARGET", help="model URL, or in-process model to measure"
    )
    groups: dict[str, list[tuple[str, Callable[[str], Any], str, str]]] = {
        "load": [
            ("--concurrency", ints, "N,...", "closed loop: callers per step [1,8,64,256]"),
            ("--rate", floats, "R,...", "open loop: Poisson arrivals, requests/s per step"),
            ("--trace", str, "FILE", "open loop: replay send times (s) from this CSV"),
            ("--duration", float, "S", "measured seconds per step [5]"),
            ("--requests", int, "N", "measured requests per step, instead of --duration"),
            ("--warmup", float, "S", "seconds of unrecorded load before each step [1]"),
            ("--seed", int, "N", "seed of generated requests and arrival times [0]"),
        ],
        "requests": [
            ("--input-data", str, "FILE", "JSONL file of requests to send, cycled"),
            ("--strings", str, "FILE", "text file: one string per line for BYTES inputs"),
            ("--rows", int, "N", "rows (batch dimension) per request [1]"),
            ("--distinct", int, "N", "distinct requests generated and cycled through [64]"),
            ("--encoding", str, "json|binary", "HTTP bodies: json, or v2 binary tensors [json]"),
        ],
        "client": [
            ("--client-processes", int, "N", "load generator processes sharing the load [1]"),
            ("--connections", int, "N", "open loop: keep-alive connections in all [256]"),
            ("--timeout", float, "S", "HTTP: seconds before a request is a TimeoutError [30]"),
        ],
        "batching (in-process TARGET only)": [
            ("--max-batch-size", ints, "N[,...]", "rows per model call (a list to sweep)"),
            ("--max-wait-ms", floats, "MS[,...]", "longest wait for a batch (a list to sweep)"),
            ("--policy", str, "NAME", "batching policy, as carpool serve takes it"),
            ("--workers", int, "N", "batches run at once"),
            ("--max-queue-size", int, "N", "rows allowed to wait; then QueueFull"),
            ("--p99-budget-ms", float, "MS", "the best sweep setting keeps p99 within this"),
        ],
        "output": [
            ("--slo-ms", float, "MS", "also report goodput: answers within MS, per second"),
            ("--json", str, "FILE", "write the report to this file"),
            ("--plot", str, "FILE", "draw the report (or the --compare reports) to this PNG"),
            ("--label", str, "TEXT", "the run's name in --compare tables and plots [file stem]"),
        ],
    }
    added = {}
    for title, flags in groups.items():
        added[title] = group = bench.add_argument_group(title)
        for name, convert, metavar, text in flags:
            add_flag(group, name, convert, None, text, prefix="CARPOOL_BENCH_", metavar=metavar)
    added["requests"].add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME:DIMS",
        help="dims of one row of an input with -1 in its metadata, e.g. INPUT0:256 or "
        "ids:1,128 (repeat for several)",
    )
    added["batching (in-process TARGET only)"].add_argument(
        "--sweep-batching",
        action="store_true",
        help="one step (the first --concurrency or --rate) per --max-batch-size x "
        "--max-wait-ms setting, each with a fresh batcher; prints the best setting",
    )
    added["output"].add_argument(
        "--compare",
        nargs="+",
        metavar="REPORT",
        help="compare reports written by --json (no TARGET): a table, and a plot with --plot",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="carpool",
        description="Dynamic request batching for ML model inference.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_serve(commands)
    _add_bench(commands)
    demo = commands.add_parser(
        "demo",
        help="batch concurrent requests through the built-in model, in process",
        description="Send single-row requests from many concurrent callers through a "
        "carpool.Batcher around a built-in numpy MLP, compare with one model call per "
        "request, and check every caller got exactly its own row.",
    )
    add_flag(demo, "--requests", int, 2000, "requests to send")
    add_flag(demo, "--concurrency", int, 64, "concurrent callers")
    add_flag(demo, "--max-batch-size", int, 32, "rows per model call at most")
    return parser


def _serve(args: argparse.Namespace) -> int:
    from carpool.errors import ConfigError
    from carpool.loading import parse_tensor, read_config_file, resolve_models
    from carpool.server.config import ServerConfig
    from carpool.server.serve import configure_logging, serve

    try:
        file: dict[str, Any] = read_config_file(args.config) if args.config else {}
    except ConfigError as exc:
        print(f"carpool serve: {exc}", file=sys.stderr)
        return 2
    server = dict(file.get("server", {}))
    for key in ("host", "port", "max_body_bytes", "log_level", "log_format", "access_log"):
        value = getattr(args, key)
        if value is not None:
            server[key] = value
    if args.drain_timeout is not None:
        server["drain_timeout_s"] = args.drain_timeout
    level, log_format = str(server.get("log_level", "info")), server.get("log_format", "text")
    if level.lower() in _LOG_LEVELS and log_format in ("text", "json"):  # else: refused below
        configure_logging(level, bool(server.get("access_log", True)), str(log_format))
    flags = {
        key: getattr(args, key)
        for key in ("max_batch_size", "max_wait_ms", "policy", "workers", "max_queue_size",
                    "default_timeout_ms", "latency_slo_ms")
        if getattr(args, key) is not None
    }  # fmt: skip
    try:
        models, unavailable = resolve_models(
            args.targets,
            name=args.name,
            flags=flags,
            file_models=file.get("models", {}),
            inputs=[parse_tensor(t) for t in args.input],
            outputs=[parse_tensor(t) for t in args.output],
        )
        config = ServerConfig(models=models, unavailable=unavailable, **server)
    except ConfigError as exc:
        print(f"carpool serve: {exc}", file=sys.stderr)
        return 2
    except TypeError as exc:
        print(f"carpool serve: config file [server]: {exc}", file=sys.stderr)
        return 2
    return serve(config)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "bench":
        from carpool.bench.command import main as bench

        return bench(args)
    if args.command == "demo":
        from carpool.tour import run_demo

        return run_demo(args.requests, args.concurrency, args.max_batch_size)
    raise AssertionError(f"unhandled command {args.command!r}")  # argparse refuses others
