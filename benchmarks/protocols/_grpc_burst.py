"""grpc_batching's client: a warm-up call, then BURSTS times CALLS calls at once over ``grpc``
(tritonclient.grpc.aio, one channel) or ``rest`` (tritonclient.http.aio, binary tensors),
each answer checked; prints ``{"calls": N}``.
``python benchmarks/protocols/_grpc_burst.py PROTOCOL ADDRESS MODEL CALLS BURSTS``
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import numpy as np
import tritonclient.grpc.aio as grpc_aio
import tritonclient.http.aio as http_aio

DIM = 4  # benchmarks.harness.grpc_models.DIM


async def bursts(protocol: str, address: str, model: str, calls: int, repeat: int) -> int:
    lib: Any = grpc_aio if protocol == "grpc" else http_aio
    client = (
        grpc_aio.InferenceServerClient(address)
        if protocol == "grpc"
        else http_aio.InferenceServerClient(address, conn_limit=calls)
    )
    x = np.arange(DIM, dtype=np.float32).reshape(1, DIM)

    async def call() -> None:
        tensor = lib.InferInput("INPUT0", [1, DIM], "FP32")
        if protocol == "grpc":
            tensor.set_data_from_numpy(x)
        else:
            tensor.set_data_from_numpy(x, binary_data=True)
        result = await client.infer(model, [tensor])
        if not np.array_equal(result.as_numpy("OUTPUT0"), x * 2):
            raise RuntimeError(f"wrong answer from {model} over {protocol}")

    try:
        await call()
        for _ in range(repeat):
            await asyncio.gather(*(call() for _ in range(calls)))
    finally:
        await client.close()
    return 1 + calls * repeat


def main() -> None:
    protocol, address, model, calls, repeat = sys.argv[1:6]
    sent = asyncio.run(bursts(protocol, address, model, int(calls), int(repeat)))
    print(json.dumps({"calls": sent}))


if __name__ == "__main__":
    main()
