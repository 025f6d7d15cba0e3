"""``carpool bench``'s flags: names, help and ``CARPOOL_BENCH_*`` environment variables, a
contract with scripts and containers; what the values mean is :mod:`carpool.bench.options`'s.
Stdlib and :mod:`carpool.envflags` only, so ``carpool --help`` starts fast."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from carpool.envflags import add_flag

__all__ = ["ENV_PREFIX", "add_bench_command", "parse_list"]

ENV_PREFIX = "CARPOOL_BENCH_"  # CARPOOL_BENCH_CONCURRENCY for --concurrency, ...

T = TypeVar("T")

if TYPE_CHECKING:  # generic only in the stubs
    Commands = argparse._SubParsersAction[argparse.ArgumentParser]  # carpool's add_subparsers()


def parse_list(text: str, convert: Callable[[str], T], *, option: str = "") -> list[T]:
    """``"1,8,64"`` as ``[convert("1"), convert("8"), convert("64")]``; spaces are ignored.

    ``option`` (e.g. ``"--concurrency"``) names the setting in the error. Raises
    ``ValueError`` for an empty list, an empty item, or an item ``convert`` refuses.
    """
    what = f"{option} " if option else ""
    kind = getattr(convert, "__name__", "value")
    example = "1,8,64"
    items = [item.strip() for item in text.split(",")]
    if not text.strip():
        raise ValueError(f"{what}expects a comma-separated list like {example!r}, got nothing")
    out: list[T] = []
    for item in items:
        try:
            if not item:
                raise ValueError("empty")
            out.append(convert(item))
        except (ValueError, TypeError):
            raise ValueError(
                f"{what}expects a comma-separated list of {kind} like {example!r}; "
                f"{item!r} in {text!r} is not one"
            ) from None
    return out


def _list_of(convert: Callable[[str], Any], name: str) -> Callable[[str], list[Any]]:
    """A comma-separated list flag (``1,8,64``); ``name`` is what a bad value is called."""

    def parse(text: str) -> list[Any]:
        try:
            return parse_list(text, convert)
        except (TypeError, ValueError):
            raise ValueError(text) from None

    parse.__name__ = name
    return parse


_INTS, _FLOATS = _list_of(int, "integer list"), _list_of(float, "number list")

_DESCRIPTION = """\
Measure a model under load: throughput, latency percentiles, errors by kind and, when the
target is carpool, what the batcher did (mean batch size, batch sizes, queue-wait share).

TARGET is a model on any KServe v2 server (carpool, Triton, MLServer, KServe):
http://HOST:PORT/v2/models/NAME, or over gRPC grpc://HOST:PORT with --model NAME; an
OpenAI-compatible embeddings endpoint, http://HOST:PORT/v1/embeddings (one text per
request: --strings, or built-in sentences); an OpenAI-compatible chat endpoint streamed,
http://HOST:PORT/v1/chat/completions with --stream; or a model run in this process through its
own batcher, to measure batching without HTTP: anything `carpool serve` takes
(module:attr, a model file, demo, minilm).

Load modes, each a list of steps run one after another:
  --concurrency N,...  closed loop: N callers, each sends its next request when answered
  --rate R,...         open loop: Poisson arrivals at R requests/s; latency runs from the
                       scheduled send time, so queueing is never hidden by a slow client
  --trace FILE         open loop: replay the send times (seconds, first CSV column)
Each step warms up (--warmup, not recorded), then runs --duration seconds or --requests N.
Requests are generated from the model's v2 metadata (random, --seed), or read from
--input-data (JSONL) or, for BYTES inputs, --strings.

With --stream each request is a stream of a step-wise model (generate_stream over HTTP,
ModelStreamInfer over gRPC, OpenAI's /v1/chat/completions, or its step batcher in this
process): the report adds outputs/s, time to first output (TTFO) and time per output (TPO,
between one output and the next). A chat output is a chunk whose delta carries text; the
conversations are --input-data's (JSONL, {"messages": [...]} a line) or a user message per
--strings line."""

_EPILOG = """\
examples:
  carpool bench http://127.0.0.1:8000/v2/models/demo --concurrency 1,8,64,256
  carpool bench http://127.0.0.1:8000/v2/models/demo --rate 500,1000 --slo-ms 20 --json a.json
  carpool bench grpc://127.0.0.1:8001 --model demo --concurrency 1,64
  carpool bench http://127.0.0.1:8000/v1/embeddings --concurrency 64 --strings texts.txt
  carpool bench demo --concurrency 16 --requests 2000          # the batcher alone, no HTTP
  carpool bench demo --sweep-batching --max-batch-size 8,16,32 --max-wait-ms 0,2,5 \\
      --policy fixed --concurrency 64 --p99-budget-ms 20
  carpool bench URL --trace arrivals.csv --client-processes 2 --plot run.png
  carpool bench --compare a.json b.json --plot compare.png
  carpool bench http://127.0.0.1:8000/v2/models/smollm2 --stream --concurrency 1,8 \
      --lengths geometric:64,cap=512 --strings prompts.txt
  carpool bench http://127.0.0.1:8000/v1/chat/completions --stream --concurrency 1,16 \
      --lengths fixed:32 --input-data chats.jsonl

Errors never stop a run: they are counted by kind (HTTP status, gRPC status code, or the
exception's type).
Exit status: 0 when the run completed (even with counted errors), 2 on a usage error.
Every option also reads an environment variable, CARPOOL_BENCH_ + its name."""

_BATCHING = "batching (in-process TARGET only)"

# Help groups, in the order --help shows them: (flag, type, metavar, help) each.
_GROUPS: dict[str, list[tuple[str, Callable[[str], Any], str, str]]] = {
    "load": [
        ("--concurrency", _INTS, "N,...", "closed loop: callers per step [1,8,64,256]"),
        ("--rate", _FLOATS, "R,...", "open loop: Poisson arrivals, requests/s per step"),
        ("--trace", str, "FILE", "open loop: replay send times (s) from this CSV"),
        ("--duration", float, "S", "measured seconds per step [5]"),
        ("--requests", int, "N", "measured requests per step, instead of --duration"),
        ("--warmup", float, "S", "seconds of unrecorded load before each step [1]"),
        ("--seed", int, "N", "seed of generated requests and arrival times [0]"),
    ],
    "requests": [
        ("--input-data", str, "FILE", "JSONL file of requests to send, cycled"),
        (
            "--strings",
            str,
            "FILE",
            "text file: one string per line, for BYTES inputs or /v1/embeddings",
        ),
        ("--rows", int, "N", "rows (batch axis) per request; /v1/embeddings: texts [1]"),
        ("--distinct", int, "N", "distinct requests generated and cycled through [64]"),
        (
            "--repeat-fraction",
            float,
            "F",
            "v2 HTTP and gRPC: the share of requests that repeat one of --distinct; the "
            "rest cycle through --unique others, for a response cache [1]",
        ),
        (
            "--unique",
            int,
            "N",
            "with --repeat-fraction: the others, generated; more than the server's cache "
            "holds, so that each comes back a miss [4096]",
        ),
        (
            "--encoding",
            str,
            "NAME",
            "v2 HTTP: json|binary tensors [json]; /v1/embeddings: "
            "the answers' encoding_format, float|base64 [float]",
        ),
        (
            "--model",
            str,
            "NAME",
            "grpc://HOST:PORT: the model; /v1/embeddings and /v1/chat/completions: the "
            "requests' model [the only one /v1/models lists]",
        ),
    ],
    "streams": [
        (
            "--lengths",
            str,
            "DIST",
            "outputs each stream asks for: fixed:N, uniform:LOW,HIGH or geometric:MEAN[,cap=N], "
            "sent as --length-parameter",
        ),
        ("--length-parameter", str, "NAME", "the request parameter --lengths sets [max_tokens]"),
    ],
    "client": [
        ("--client-processes", int, "N", "load generator processes sharing the load [1]"),
        ("--connections", int, "N", "open loop: keep-alive connections in all [256]"),
        ("--timeout", float, "S", "HTTP: seconds before a request is a TimeoutError [30]"),
    ],
    _BATCHING: [
        ("--max-batch-size", _INTS, "N[,...]", "rows per model call (a list to sweep)"),
        ("--max-wait-ms", _FLOATS, "MS[,...]", "longest wait for a batch (a list to sweep)"),
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


def add_bench_command(commands: Commands) -> argparse.ArgumentParser:
    """Add ``carpool bench`` to ``commands``, the ``add_subparsers()`` of ``carpool``."""
    bench = commands.add_parser(
        "bench",
        help="measure throughput and latency of a v2 server's model, or of a batcher",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_argument(
        "target", nargs="?", metavar="TARGET", help="model URL, or in-process model to measure"
    )
    groups = {}
    for title, flags in _GROUPS.items():
        groups[title] = group = bench.add_argument_group(title)
        for name, convert, metavar, text in flags:
            add_flag(group, name, convert, None, text, prefix=ENV_PREFIX, metavar=metavar)
    _add_switches(groups)
    return bench


def _add_switches(groups: dict[str, argparse._ArgumentGroup]) -> None:
    """The flags with no environment variable: repeated, boolean or many-valued."""
    groups["requests"].add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME:DIMS",
        help="dims of one row of an input with -1 in its metadata, e.g. INPUT0:256 or "
        "ids:1,128 (repeat for several)",
    )
    groups["streams"].add_argument(
        "--stream",
        action="store_true",
        help="each request a stream of a step-wise model: generate_stream for an HTTP model "
        "URL, ModelStreamInfer for grpc://, the step batcher for an in-process model",
    )
    groups[_BATCHING].add_argument(
        "--sweep-batching",
        action="store_true",
        help="one step (the first --concurrency or --rate) per --max-batch-size x "
        "--max-wait-ms setting, each with a fresh batcher; prints the best setting",
    )
    groups["output"].add_argument(
        "--compare",
        nargs="+",
        metavar="REPORT",
        help="compare reports written by --json (no TARGET): a table, and a plot with --plot",
    )
