"""The ``carpool`` command: flags in, calls into the library out; no logic of its own."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="carpool",
        description="Dynamic request batching for ML model inference.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    demo = commands.add_parser(
        "demo",
        help="batch concurrent requests through the built-in model and show what happened",
        description="Send single-row requests from many concurrent callers through a "
        "carpool.Batcher around a built-in numpy MLP, compare with one model call per "
        "request, and check every caller got exactly its own row.",
    )
    demo.add_argument(
        "--requests",
        type=int,
        default=_env_int("CARPOOL_DEMO_REQUESTS", 2000),
        help="requests to send (env CARPOOL_DEMO_REQUESTS; default %(default)s)",
    )
    demo.add_argument(
        "--concurrency",
        type=int,
        default=_env_int("CARPOOL_DEMO_CONCURRENCY", 64),
        help="concurrent callers (env CARPOOL_DEMO_CONCURRENCY; default %(default)s)",
    )
    demo.add_argument(
        "--max-batch-size",
        type=int,
        default=_env_int("CARPOOL_MAX_BATCH_SIZE", 32),
        help="rows per model call at most (env CARPOOL_MAX_BATCH_SIZE; default %(default)s)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        from carpool.demo import run_demo

        return run_demo(args.requests, args.concurrency, args.max_batch_size)
    raise AssertionError(f"unhandled command {args.command!r}")  # argparse refuses others
