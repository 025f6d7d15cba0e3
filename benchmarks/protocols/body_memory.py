"""What one large request costs carpool serve in memory: its peak RSS growth as a multiple of
the body, per way a tensor comes in (REST JSON and binary; gRPC raw, typed and BYTES
contents), a fresh server per request. Goal (issue 19): under 3x (BYTES: information).
Linux only (/proc). See docs/benchmarks/protocols.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import Figures, common, run
from benchmarks.harness import processes as _process
from benchmarks.harness.frontend_check import fetch

MODELS = "benchmarks.protocols._memory_models"
MIB = 1 << 20
GOAL = 3.0
TEXT_BYTES = 16  # each BYTES element's length
WAYS = {  # --ways name: its label, its name in figures, its goal
    "json": ("REST JSON", "rest_json", GOAL),
    "binary": ("REST binary", "rest_binary", GOAL),
    "grpc-raw": ("gRPC raw_input_contents", "grpc_raw", GOAL),
    "grpc-fp32": ("gRPC fp32_contents", "grpc_fp32", GOAL),
    "grpc-bytes": ("gRPC bytes_contents", "grpc_bytes", None),
}


def _json_body(size: int) -> tuple[bytes, float]:
    # Compact decimals, each "0.ddd," (6 bytes): a 1 MiB run repeated to ``size``.
    sample = np.random.default_rng(0).integers(0, 1000, MIB // 6) / 1000
    text = ",".join(f"{x:.3f}" for x in sample)
    copies = max(1, size // (len(text) + 1))
    numbers = ",".join([text] * copies)
    count = sample.size * copies
    doc = b'{"inputs":[{"name":"X","datatype":"FP32","shape":[1,%d],"data":[%s]}]}' % (
        count,
        numbers.encode(),
    )
    return doc, float(np.float32(sample.astype(np.float32).sum(dtype=np.float32))) * copies


def _floats(size: int) -> np.ndarray[Any, Any]:
    return np.ones(size // 4, dtype=np.float32)


def _rest(way: str, size: int) -> Callable[[int], tuple[int, float]]:
    """One REST request, built: sending it gives the body's size and the answer's sum."""
    headers = {"Content-Type": "application/json"}
    if way == "json":
        body, _ = _json_body(size)
    else:
        data = _floats(size)
        entry = {"name": "X", "datatype": "FP32", "shape": [1, data.size]}
        entry["parameters"] = {"binary_data_size": data.nbytes}
        header = json.dumps({"inputs": [entry]}).encode()
        body = header + data.tobytes()
        headers = {
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(len(header)),
        }

    def send(port: int) -> tuple[int, float]:
        base = f"http://127.0.0.1:{port}"
        _, text = fetch(base, "POST", "/v2/models/rowsum/infer", body, headers)
        return len(body), float(json.loads(text)["outputs"][0]["data"][0])

    return send


def _grpc(way: str, size: int) -> Callable[[int], tuple[int, float]]:
    """One gRPC call, built: sending it gives the message's size and the answer's sum."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    request = service_pb2.ModelInferRequest(model_name="texts" if way == "grpc-bytes" else "rowsum")
    tensor = request.inputs.add()
    if way == "grpc-bytes":
        count = size // (TEXT_BYTES + 2)
        tensor.name, tensor.datatype = "T", "BYTES"
        tensor.shape.extend([1, count])
        tensor.contents.bytes_contents.extend([b"x" * TEXT_BYTES] * count)
    else:
        data = _floats(size)
        tensor.name, tensor.datatype = "X", "FP32"
        tensor.shape.extend([1, data.size])
        if way == "grpc-raw":
            request.raw_input_contents.append(data.tobytes())
        else:
            tensor.contents.fp32_contents.extend(data)
    body = request.SerializeToString()
    limit = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]

    def send(port: int) -> tuple[int, float]:
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=limit) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            reply = stub.ModelInfer.with_call(request, timeout=120)[0]
        value = np.frombuffer(reply.raw_output_contents[0], dtype=np.float32)[0]
        return len(body), float(value)

    return send


def _expected(way: str, size: int) -> float:
    if way == "json":
        return _json_body(size)[1]
    if way == "grpc-bytes":
        return float(size // (TEXT_BYTES + 2) * TEXT_BYTES)
    return float(size // 4)


def _memory_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {key} in /proc/{pid}/status")


def one_request(way: str, size: int, cores: _process.Cores) -> tuple[float, float, bool]:
    """One fresh server, one request: (peak RSS growth / body, seconds to the answer, whether
    the answer is right)."""
    http_port, grpc_port = _process.free_port(), _process.free_port()
    argv = [sys.executable, "-m", "carpool", "serve", f"{MODELS}:rowsum",
            f"{MODELS}:texts", "--port", str(http_port), "--grpc-port", str(grpc_port),
            "--max-body-bytes", str(2 * size + MIB), "--access-log", "false",
            "--log-level", "warning"]  # fmt: skip
    server = _process.Server("carpool serve", argv, http_port, cores.server, _process.child_env())
    try:
        send = (_grpc if way.startswith("grpc") else _rest)(way, size)
        server.wait_ready()
        time.sleep(0.5)  # the ready answer's own garbage settles
        Path(f"/proc/{server.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
        before = _memory_kib(server.pid, "VmRSS")
        started = time.perf_counter()
        sent, answer = send(grpc_port if way.startswith("grpc") else http_port)
        took = time.perf_counter() - started
        peak = _memory_kib(server.pid, "VmHWM")
    finally:
        server.stop()
    want = _expected(way, size)
    right = abs(answer - want) <= 1e-3 * max(1.0, abs(want))
    if not right:
        print(f"{way} {size}: the answer is {answer}, not {want}")
    return (peak - before) * 1024 / sent, took, right


def measure(args: argparse.Namespace) -> Figures:
    cores = _process.split_cpus(args.cpus)
    _process.pin_self(cores.client)
    sizes = [1] if args.quick else [int(s) for s in args.sizes.split(",")]
    ways = [w for w in args.ways.split(",") if w]
    unknown = set(ways) - set(WAYS)
    if unknown:
        raise ValueError(f"--ways: unknown {sorted(unknown)}; choose from {','.join(WAYS)}")
    repeats = args.repeats or (1 if args.quick else 3)
    common.header("carpool serve: peak RSS growth per request, x body", {"cpus": str(cores)})
    figures = Figures()
    rows, verdicts, right = [], [], True
    for way in ways:
        label, name, goal = WAYS[way]
        for mib in sizes:
            runs = [one_request(way, mib * MIB, cores) for _ in range(repeats)]
            right = right and all(r[2] for r in runs)
            growth = common.median(r[0] for r in runs)
            took = common.median(r[1] for r in runs)
            rows.append([label, f"{mib} MiB", f"{growth:.2f}x", f"{took * 1000:.0f}"])
            print(f"{label}, {mib} MiB: {growth:.2f}x the body, {took * 1000:.0f} ms", flush=True)
            if goal is None:
                figures.add(f"{name}_growth_over_body_{mib}mib", growth, "x")
            else:
                figures.at_most(f"{name}_growth_over_body_{mib}mib", growth, goal)
                verdicts.append((label, mib, growth, goal))
            figures.add(f"{name}_ms_to_answer_{mib}mib", took * 1000, "ms")
    figures.check("answers_right", right)
    print()
    print(common.table(["way in", "body", "peak RSS growth", "ms to answer"], rows, left=2))
    print()
    for label, mib, growth, goal in verdicts:
        verdict = common.verdict(growth, goal, higher_is_better=False)
        print(f"goal: {label}, {mib} MiB < {goal:g}x the body: {growth:.2f}x {verdict}")
    return figures


def parser() -> argparse.ArgumentParser:
    p = common.base_parser(__doc__, default_cpus="0,1", default_repeats=3)
    p.add_argument("--sizes", default="1,16,64", help="body sizes in MiB [1,16,64]")
    p.add_argument("--ways", default=",".join(WAYS), help=f"ways in [{','.join(WAYS)}]")
    return p


if __name__ == "__main__":
    raise SystemExit(run(measure, parser()))
