"""The ``carpool`` command: flags in, calls into the library out; no logic of its own.

Every option also reads an environment variable (``CARPOOL_`` + its name), which the flag
overrides, so containers can be configured without rewriting the command line.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any


class _FromEnv(str):
    """A default read from the environment, so a bad value can be blamed on its variable."""

    env = ""


def _typed(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    def typed(value: str) -> Any:
        try:
            return convert(value)
        except ValueError:
            if isinstance(value, _FromEnv):
                message = f"environment variable {value.env}={str(value)!r} is invalid"
                raise argparse.ArgumentTypeError(message) from None
            name = getattr(convert, "__name__", "value").lstrip("_")
            raise argparse.ArgumentTypeError(f"invalid {name} value: {value!r}") from None

    typed.__name__ = getattr(convert, "__name__", "value")
    return typed


def _flag(
    parser: argparse.ArgumentParser,
    flag: str,
    convert: Callable[[str], Any],
    default: Any,
    help: str,
    **kwargs: Any,
) -> None:
    env = "CARPOOL_" + flag.lstrip("-").replace("-", "_").upper()
    # A string default is converted by argparse only for the command being run, and a bad
    # value becomes a usage error (exit 2) like a bad flag.
    value = os.environ.get(env)
    from_env = None
    if value:
        from_env = _FromEnv(value)
        from_env.env = env
    shown = "" if default is None else f"; default {default}"
    parser.add_argument(
        flag,
        type=_typed(convert),
        default=from_env if from_env is not None else default,
        help=f"{help} (env {env}{shown})",
        **kwargs,
    )


_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(value)


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
    _flag(serve, "--host", str, None, "address to listen on [127.0.0.1]")
    _flag(serve, "--port", int, None, "port to listen on [8000]")
    _flag(serve, "--name", str, None, "model name for a single TARGET (default: attr or file stem)")
    _flag(serve, "--config", str, None, "TOML file with [server] and [models.NAME] tables")
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
    _flag(serve, "--max-batch-size", int, None, "rows per model call at most [32]")
    _flag(serve, "--max-wait-ms", float, None, "longest deliberate wait for a batch [5.0]")
    _flag(serve, "--policy", str, None, "batching policy: eager or fixed [eager]")
    _flag(serve, "--workers", int, None, "batches run at once per model [1]")
    _flag(serve, "--max-queue-size", int, None, "rows allowed to wait; then 503 [no limit]")
    _flag(
        serve,
        "--default-timeout-ms",
        float,
        None,
        "queue timeout for requests that send none; then 503 [none]",
    )
    _flag(serve, "--max-body-bytes", int, None, "largest request body; then 413 [67108864]")
    _flag(serve, "--drain-timeout", float, None, "seconds to finish requests on SIGTERM [30]")
    _flag(serve, "--log-level", str, None, "debug, info, warning or error [info]")
    _flag(serve, "--log-format", str, None, "text, or json for one object per line [text]")
    _flag(serve, "--access-log", _bool, None, "log every request (true/false) [true]")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="carpool",
        description="Dynamic request batching for ML model inference.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_serve(commands)
    demo = commands.add_parser(
        "demo",
        help="batch concurrent requests through the built-in model, in process",
        description="Send single-row requests from many concurrent callers through a "
        "carpool.Batcher around a built-in numpy MLP, compare with one model call per "
        "request, and check every caller got exactly its own row.",
    )
    _flag(demo, "--requests", int, 2000, "requests to send")
    _flag(demo, "--concurrency", int, 64, "concurrent callers")
    _flag(demo, "--max-batch-size", int, 32, "rows per model call at most")
    return parser


def _serve(args: argparse.Namespace) -> int:
    from carpool.server.config import (
        ConfigError,
        ServerConfig,
        parse_tensor,
        read_config_file,
        resolve_models,
    )
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
                    "default_timeout_ms")
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
    if args.command == "demo":
        from carpool.demo import run_demo

        return run_demo(args.requests, args.concurrency, args.max_batch_size)
    raise AssertionError(f"unhandled command {args.command!r}")  # argparse refuses others
