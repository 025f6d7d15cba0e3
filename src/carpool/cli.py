"""The ``carpool`` command: flags in, calls into the library out; no logic of its own. Every
option also reads an environment variable (``CARPOOL_`` + its name), which the flag overrides,
so containers are configured without rewriting the command line."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import TYPE_CHECKING, Any, get_args, get_type_hints

from carpool.bench.flags import add_bench_command
from carpool.engine.options import BatcherOptions
from carpool.envflags import add_flag, parse_bool
from carpool.ipc.lifelines import keep_title_room
from carpool.model import Batching, Model
from carpool.server.config import ServerConfig

if TYPE_CHECKING:
    from carpool.bench.flags import Commands

_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


_SERVE_DESCRIPTION = (
    "Serve one or more models over the KServe v2 Open Inference Protocol (REST and gRPC), with "
    "dynamic batching behind every model. Works with tritonclient, perf_analyzer and KServe. "
    "With no TARGET, serves the built-in 'demo' model."
)

_SERVE_EPILOG = (
    "TARGET is 'module:attr' naming a batched function (stacked batch in, one row out per "
    "row), a torch.nn.Module or a carpool.Model; a model file (model.onnx, a TorchScript "
    "model.pt), named after its stem; a model repository folder with one subfolder per model "
    "(its file and an optional carpool.toml); or a built-in: 'demo', 'minilm'. Batching flags "
    "apply to every model and override the config file's [models.NAME] tables, which override "
    "a model folder's carpool.toml, which overrides what the model itself declares."
)

Flag = tuple[str, Callable[[str], Any], str]  # name, type, help; the variable is CARPOOL_ + name

# The settings that are flags, in the order --help lists them: where to listen (then --name,
# --config and the declared --input/--output tensors), a model's settings, the server's. Each
# is one field that states its type, default and help (carpool.engine.options.option): of
# BatcherOptions (the batcher's options), else of Batching or Model, else of ServerConfig.
_WHERE_SETTINGS = ("host", "port", "grpc_port")
_MODEL_SETTINGS = (
    "max_batch_size",
    "max_wait_ms",
    "policy",
    "latency_slo_ms",
    "workers",
    "runner",
    "ray_address",
    "batch_timeout_ms",
    "max_queue_size",
    "default_timeout_ms",
    "openai",
    "max_rows_per_request",
    "max_batch_tokens",
)
_SERVER_SETTINGS = (
    "max_body_bytes",
    "max_client_batch_size",
    "drain_timeout_s",
    "metrics_need_key",
    "ssl_certfile",
    "ssl_keyfile",
    "header_timeout_s",
    "body_timeout_s",
    "limit_concurrency",
    "frontends",
    "grpc_max_concurrent_rpcs",
    "model_control_mode",
    "repository_poll_secs",
    "repository_poll_settle_secs",
    "cache_size",
    "prefix_cache_size",
    "log_level",
    "log_format",
    "access_log",
)
_RECORDS = (BatcherOptions, Batching, Model, ServerConfig)


def _setting_flag(name: str) -> Flag:
    """``name``'s flag, as its field states it: the annotated type (the first of bool, int,
    float or str in it), the help, and the default (true/false for a bool) or what the help
    shows for it."""
    record, spec = next(
        (record, spec)
        for record in _RECORDS
        for spec in fields(record)
        if spec.name == name and "help" in spec.metadata
    )
    hint = get_type_hints(record)[name]
    kinds = get_args(hint) or (hint,)
    convert = parse_bool if bool in kinds else next(k for k in kinds if k in (int, float, str))
    shown = spec.default if spec.metadata["shown"] is None else spec.metadata["shown"]
    if isinstance(shown, bool):
        shown = str(shown).lower()
    text = spec.metadata["help"] if shown is None else f"{spec.metadata['help']} [{shown}]"
    return spec.metadata["flag"] or "--" + name.replace("_", "-"), convert, text


_WHERE_FLAGS: tuple[Flag, ...] = (
    *(_setting_flag(name) for name in _WHERE_SETTINGS),
    ("--name", str, "model name for a single TARGET (default: attr or file stem)"),
    ("--config", str, "TOML file with [server] and [models.NAME] tables"),
)
_SETTING_FLAGS = tuple(_setting_flag(name) for name in _MODEL_SETTINGS + _SERVER_SETTINGS)
_SERVER_DEFAULTS = {s.name: s.default for s in fields(ServerConfig) if "help" in s.metadata}
# The server's settings by the name argparse gives their flags' values.
_SERVER_KEYS = {
    _setting_flag(name)[0].lstrip("-").replace("-", "_"): name
    for name in _WHERE_SETTINGS + _SERVER_SETTINGS
}

_TENSOR_HELP = {
    "input": "declare an input of a single TARGET, e.g. INPUT0:FP32:256 (repeat for several); "
    "requests that do not match get a 400",
    "output": "declare an output of a single TARGET, e.g. OUTPUT0:FP32:8 (repeat for several)",
}

API_KEY_ENV = "CARPOOL_API_KEY"  # comma-separated; from a Secret, out of sight of `ps`
# Repeatable flags that name models, each with its variable (comma-separated names).
_NAME_LISTS = {
    "--load-model": "with --model-control-mode explicit: a repository model to load at "
    "start (repeat for several); the others load on request",
    "--response-cache": "answer this model's repeated requests from the response cache "
    "(repeat for several; also [models.NAME] response_cache = true)",
}


def _add_serve(commands: Commands) -> None:
    serve = commands.add_parser(
        "serve",
        help="serve models over the KServe v2 / Triton HTTP and gRPC protocols, batching requests",
        description=_SERVE_DESCRIPTION,
        epilog=_SERVE_EPILOG,
    )
    serve.add_argument("targets", nargs="*", metavar="TARGET", help="models to serve")
    for flag, convert, text in _WHERE_FLAGS:
        add_flag(serve, flag, convert, None, text)
    for kind in ("input", "output"):
        serve.add_argument(
            f"--{kind}",
            action="append",
            default=[],
            metavar="NAME:DATATYPE:DIMS",
            help=_TENSOR_HELP[kind],
        )
    for flag, convert, text in _SETTING_FLAGS:
        add_flag(serve, flag, convert, None, text)
    for flag, text in _NAME_LISTS.items():
        env = "CARPOOL_" + flag.lstrip("-").replace("-", "_").upper()
        serve.add_argument(flag, action="append", metavar="NAME", help=f"{text} (env {env})")
    serve.add_argument(  # by hand: repeatable, and its variable holds a list
        "--api-key",
        action="append",
        metavar="KEY",
        help="require this key on every route but health (and /metrics): "
        "'Authorization: Bearer KEY' or 'x-api-key: KEY'; repeat for several "
        f"(env {API_KEY_ENV}; comma-separated; unlike the flag, not shown by ps)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="carpool",
        description="Dynamic request batching for ML model inference.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_serve(commands)
    add_bench_command(commands)
    _add_demo(commands)
    return parser


def _add_demo(commands: Commands) -> None:
    demo = commands.add_parser(
        "demo",
        help="batch concurrent requests through the built-in model, in process",
        description="Send single-row requests from many concurrent callers through a "
        "carpool.Batcher around a built-in numpy MLP, compare with one model call per "
        "request, and check every caller got exactly its own row.",
    )
    add_flag(demo, "--requests", int, 2000, "requests to send")
    add_flag(demo, "--concurrency", int, 64, "concurrent callers")
    size = BatcherOptions.__dataclass_fields__["max_batch_size"]
    add_flag(demo, "--max-batch-size", int, size.default, size.metadata["help"])


def _serve(args: argparse.Namespace) -> int:
    """Flags and the config file -> :class:`~carpool.server.config.ServerConfig` -> serve;
    a config that cannot be used is one line on stderr and exit status 2."""
    from carpool.errors import ConfigError
    from carpool.loading import Catalog, LoadFailure, parse_tensor, read_config_file
    from carpool.server.serve import serve

    try:
        file: dict[str, Any] = read_config_file(args.config) if args.config else {}
        server = _server_settings(file, args)
    except ConfigError as exc:
        return _refuse(exc)
    try:
        catalog = Catalog(
            args.targets,
            name=args.name,
            flags={k: getattr(args, k) for k in _MODEL_SETTINGS if getattr(args, k) is not None},
            file_models=file.get("models", {}),
            inputs=[parse_tensor(t) for t in args.input],
            outputs=[parse_tensor(t) for t in args.output],
            response_cache=_names(args.response_cache, "--response-cache"),
        )
        mode = server.get("model_control_mode", _SERVER_DEFAULTS["model_control_mode"])
        load = _names(args.load_model, "--load-model")
        given = "--load-model" if args.load_model is not None else "CARPOOL_LOAD_MODEL"
        if load and mode != "explicit":
            raise ConfigError(f"{given} applies to --model-control-mode explicit")
        unavailable: tuple[LoadFailure, ...] = ()
        if mode == "explicit":
            models = catalog.load_some(load, given=given)
        else:
            models, unavailable = catalog.load_all()
        if mode != "none":
            server["catalog"] = catalog
        config = ServerConfig(models=models, unavailable=unavailable, **server)
    except ConfigError as exc:
        return _refuse(exc)
    except TypeError as exc:
        return _refuse(f"config file [server]: {exc}")
    return serve(config)


def _server_settings(file: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The config file's [server] table, the flags over it; logging configured from them
    now, so that loading the models logs as asked (bad values are refused later, by
    ``ServerConfig``). A key setting that holds no key is a ConfigError here."""
    from carpool.errors import ConfigError
    from carpool.server.telemetry.logs import configure_logging

    server = dict(file.get("server", {}))
    for flag, key in _SERVER_KEYS.items():
        value = getattr(args, flag)
        if value is not None:
            server[key] = value
    if "api_keys" in server and not server["api_keys"]:
        raise ConfigError(
            "the config file's [server] api_keys is empty, which would serve every route "
            "to anyone; give it a key, or leave api_keys out to serve without keys"
        )
    # Read once and taken out of the environment, so that no child process (a model
    # worker, Ray's, the resource tracker) inherits the key; the processes' titles keep
    # their room first (setproctitle writes into the environment's memory, and finds none
    # once the last variable is taken out).
    keep_title_room()
    from_env = os.environ.pop(API_KEY_ENV, None)
    if from_env is not None and not args.api_key:
        keys = [k.strip() for k in from_env.split(",") if k.strip()]
        if not keys:
            raise ConfigError(
                f"{API_KEY_ENV} is set but holds no key (empty, blank or only commas), which "
                "would serve every route to anyone; give it a key, or unset it to serve "
                "without keys"
            )
        server["api_keys"] = tuple(keys)
    elif args.api_key:
        server["api_keys"] = tuple(key.strip() for key in args.api_key)
    given = {**_SERVER_DEFAULTS, **server}
    level, log_format = str(given["log_level"]), given["log_format"]
    if level.lower() in _LOG_LEVELS and log_format in ("text", "json"):  # else: refused below
        configure_logging(level, bool(given["access_log"]), str(log_format))
    return server


def _names(given: list[str] | None, flag: str) -> tuple[str, ...]:
    """A repeatable flag's names, else its variable's (comma-separated); none is empty."""
    from carpool.errors import ConfigError

    env = "CARPOOL_" + flag.lstrip("-").replace("-", "_").upper()
    if given is None:
        value = os.environ.get(env)
        if value is None:
            return ()
        given = value.split(",")
        flag = env
    names = tuple(name.strip() for name in given)
    if not all(names):
        raise ConfigError(f"{flag} names a model with an empty name; give its name")
    return names


def _refuse(problem: object) -> int:
    print(f"carpool serve: {problem}", file=sys.stderr)
    return 2


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
