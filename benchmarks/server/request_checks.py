"""What issue 19's per-request checks cost an ordinary request, in us: each timed alone on
the real functions (``timeit``, best of ``--repeats``), beside the step it guards.

    python -m benchmarks.server.request_checks [--quick]
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
from tritonclient.grpc import service_pb2 as pb

from benchmarks.harness import Figures, common, run
from carpool.server.grpc.wire import read_infer_request
from carpool.server.inference import admission
from carpool.server.lifecycle.registry import ServerCounts
from carpool.server.messages import InferInput, InferRequest
from carpool.server.rest import json_arrays
from carpool.server.rest.bodies import request_headers

GOAL_US = 2.0
HEADERS = [
    (b"host", b"127.0.0.1:8000"),
    (b"user-agent", b"python-requests/2.32"),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept", b"*/*"),
    (b"connection", b"keep-alive"),
    (b"content-type", b"application/json"),
    (b"content-length", b"4123"),
]


def _json_body() -> bytes:
    data = np.random.default_rng(0).random(512).round(4).tolist()
    entry = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 512], "data": data}
    return orjson.dumps({"inputs": [entry]})


def _grpc_message() -> bytes:
    message = pb.ModelInferRequest(model_name="identity")
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 512])
    message.raw_input_contents.append(np.ones(512, dtype=np.float32).tobytes())
    return bytes(message.SerializeToString())


def _text_request() -> InferRequest:
    text = np.array([b"a sixteen-byte t"], dtype=object).reshape(1, 1)
    return InferRequest(None, {}, (InferInput("TEXT", "BYTES", (1, 1), text, {}),), None, False)


Check = tuple[str, str, Callable[[], Any], str, Callable[[], Any] | None, bool]


def _checks() -> list[Check]:
    """(figure, check, a call that makes it, the step it guards, that step's call, whether
    the call makes the step too: then the check costs the difference)."""
    body, message, text = _json_body(), _grpc_message(), _text_request()
    scope = {"headers": HEADERS}
    counts = ServerCounts()
    return [
        ("headers_twice_us", "headers sent twice", lambda: request_headers(scope),
         "dict(headers)", lambda: dict(HEADERS), True),
        ("json_array_cut_us", "JSON array cut: size test", lambda: json_arrays.lift(body),
         "orjson.loads(body)", lambda: orjson.loads(body), False),
        ("grpc_walk_us", "gRPC walk: size test", lambda: read_infer_request(message),
         "protobuf parse", lambda: pb.ModelInferRequest.FromString(message), True),
        ("preprocess_size_test_us", "preprocess thread: size test",
         lambda: admission.reaches(text, 4096), "", None, False),
        ("server_count_us", "server's own count", lambda: counts.record("http", 200), "",
         None, False),
    ]  # fmt: skip


def _best_us(call: Callable[[], Any], repeats: int, number: int) -> float:
    return min(timeit.repeat(call, number=number, repeat=repeats)) / number * 1e6


def parser() -> argparse.ArgumentParser:
    return common.base_parser(__doc__, default_cpus="0", default_repeats=7)


def measure(args: argparse.Namespace) -> Figures:
    common.pin(common.parse_cpus(args.cpus))
    repeats = args.repeats or (1 if args.quick else 7)
    number = 2_000 if args.quick else 20_000
    common.header("issue 19's checks, us per request", {"cpus": args.cpus})
    figures = Figures()
    rows, added = [], 0.0
    empty = _best_us(lambda: None, repeats, number)  # a call's own cost
    for figure, name, call, base_name, base, includes_base in _checks():
        base_us = _best_us(base, repeats, number) if base is not None else empty
        cost = _best_us(call, repeats, number) - (base_us if includes_base else empty)
        rows.append([name, f"{cost:.2f}", base_name, f"{base_us - empty:.2f}" if base else ""])
        figures.add(figure, cost, "us")
        added += max(cost, 0.0)
    print(common.table(["check", "us", "beside", "us"], rows, left=1))
    figures.at_most("checks_together_us", added, GOAL_US, "us")
    return figures


if __name__ == "__main__":
    raise SystemExit(run(measure, parser()))
