"""``http_batching``'s MLP (float32 512 -> 2048 x3 -> 512, ReLU, fixed seed, one BLAS thread)
three ways: ``mlp`` for carpool serve to batch; ``plain_app`` (ASGI, the same v2 JSON and
binary shapes) calling it once per request in a thread; ``instant_app``, a canned answer (the
client's ceiling). From the repository's root: ``carpool serve
benchmarks.harness.http_models:mlp``, ``uvicorn benchmarks.harness.http_models:plain_app``.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # effective only if numpy is not imported yet

import numpy as np  # noqa: E402
import orjson  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from carpool.backends.demo import DemoMLP  # noqa: E402

threadpool_limits(1)  # works even after numpy was imported (carpool imports it first)

IN_DIM = 512
OUT_DIM = 512
DIMS = (IN_DIM, 2048, 2048, 2048, OUT_DIM)
MODEL_NAME = "mlp"


model = DemoMLP(DIMS)  # the same class as carpool's demo model, larger


def _carpool_model() -> Any:
    try:
        import carpool
    except ImportError:  # not installed: use the repo's src/
        import sys
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
        import carpool

    return carpool.Model(
        model,
        name=MODEL_NAME,
        inputs=[carpool.Tensor("INPUT0", "FP32", (IN_DIM,))],
        outputs=[carpool.Tensor("OUTPUT0", "FP32", (OUT_DIM,))],
        batching=carpool.Batching(max_batch_size=32),
        platform="numpy",
    )


def __getattr__(name: str) -> Any:  # PEP 562: ``mlp`` is built on first access, so the
    # plain server never imports carpool
    if name == "mlp":
        value = _carpool_model()
        globals()["mlp"] = value
        return value
    raise AttributeError(name)


# ---------------------------------------------------------------------------------------
# The plain v2 endpoint: decode, run the model on this one request, encode. No batching.
# ---------------------------------------------------------------------------------------
JSON_HEADERS = [(b"content-type", b"application/json")]
HEADER_LENGTH = b"inference-header-content-length"
METADATA = orjson.dumps(  # what carpool bench reads to build its requests
    {
        "name": MODEL_NAME,
        "versions": ["1"],
        "platform": "numpy",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, IN_DIM]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, OUT_DIM]}],
    }
)


def decode_request(body: bytes, header_length: int | None) -> tuple[np.ndarray, bool]:
    """The INPUT0 array ([rows, 512] float32) and whether the outputs go back binary."""
    if header_length is None:
        doc = orjson.loads(body)
        blob = b""
    else:
        doc = orjson.loads(body[:header_length])
        blob = body[header_length:]
    (item,) = doc["inputs"]
    shape = item["shape"]
    if "data" in item:
        x = np.asarray(item["data"], dtype=np.float32).reshape(shape)
    else:
        x = np.frombuffer(blob, dtype=np.float32).reshape(shape)
    binary = bool(doc.get("parameters", {}).get("binary_data_output", False))
    for out in doc.get("outputs") or ():
        if "binary_data" in out.get("parameters", {}):
            binary = bool(out["parameters"]["binary_data"])
    return x, binary


def encode_response(y: np.ndarray, binary: bool) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    out: dict[str, Any] = {"name": "OUTPUT0", "datatype": "FP32", "shape": list(y.shape)}
    header = {"model_name": MODEL_NAME, "model_version": "1", "outputs": [out]}
    if not binary:
        out["data"] = y.ravel()
        return orjson.dumps(header, option=orjson.OPT_SERIALIZE_NUMPY), JSON_HEADERS
    blob = np.ascontiguousarray(y, dtype="<f4").tobytes()
    out["parameters"] = {"binary_data_size": len(blob)}
    text = orjson.dumps(header)
    return text + blob, [
        (b"content-type", b"application/octet-stream"),
        (HEADER_LENGTH, str(len(text)).encode()),
    ]


async def _read_body(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _send(send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _lifespan(receive: Any, send: Any, executor: ThreadPoolExecutor) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            executor.shutdown(wait=True)
            await send({"type": "lifespan.shutdown.complete"})
            return


def _fixed_answer(scope: dict[str, Any]) -> tuple[int, bytes, list[tuple[bytes, bytes]]] | None:
    """The answer to anything but an inference (health, metadata, 404); None for one."""
    path, method = scope["path"], scope["method"]
    if path in ("/v2/health/ready", "/v2/health/live"):
        return 200, b'{"ready":true}', JSON_HEADERS
    if path == f"/v2/models/{MODEL_NAME}" and method == "GET":
        return 200, METADATA, JSON_HEADERS
    if not path.endswith("/infer") or method != "POST":
        return 404, b'{"error":"Not Found"}', JSON_HEADERS
    return None


def _make_app(compute: bool) -> Any:
    # PLAIN_THREADS: threads that run the model (default 1, like carpool's workers=1; with
    # more, numpy calls overlap on the one pinned core and only add contention).
    executor = ThreadPoolExecutor(
        max_workers=int(os.environ.get("PLAIN_THREADS", "1")), thread_name_prefix="model"
    )
    zeros = np.zeros((1, OUT_DIM), np.float32)
    canned = {binary: encode_response(zeros, binary) for binary in (False, True)}

    async def answer(body: bytes, header_length: int | None) -> tuple[bytes, Any]:
        if not compute:  # no decoding, no model: a canned answer of the same size
            return canned[header_length is not None]
        x, binary = decode_request(body, header_length)
        y = await asyncio.get_running_loop().run_in_executor(executor, model, x)
        return encode_response(y, binary)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send, executor)
            return
        if scope["type"] != "http":
            return
        fixed = _fixed_answer(scope)
        if fixed is not None:
            await _send(send, *fixed)
            return
        body = await _read_body(receive)
        lengths = [int(value) for key, value in scope["headers"] if key == HEADER_LENGTH]
        try:
            payload, headers = await answer(body, lengths[-1] if lengths else None)
        except Exception as exc:  # a benchmark server: say what went wrong, as a 400
            await _send(send, 400, orjson.dumps({"error": repr(exc)}), JSON_HEADERS)
            return
        await _send(send, 200, payload, headers)

    return app


plain_app = _make_app(compute=True)
instant_app = _make_app(compute=False)  # reads the body, answers at once
