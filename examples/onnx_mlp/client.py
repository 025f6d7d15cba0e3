"""Send concurrent requests to the served ONNX MLP and check each answer against onnxruntime.

Requests of 1 to 4 rows go out at once from several threads through Triton's own HTTP client
(one client per thread: a client is not thread-safe), so the server batches them; every
answer must match onnxruntime running ``model.onnx`` directly on that request alone. The
model's statistics then show how many rows shared how many model calls.
Usage, from the repository root: ``python examples/onnx_mlp/client.py [--model model]``.
"""

from __future__ import annotations

import argparse
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import tritonclient.http as httpclient

PATH = Path(__file__).with_name("model.onnx")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="127.0.0.1:8000", help="the server's host:port")
    parser.add_argument("--model", default="model", help="the served name (the file's stem)")
    parser.add_argument("--requests", type=int, default=64, help="how many to send")
    parser.add_argument("--threads", type=int, default=16, help="how many at once")
    args = parser.parse_args()

    metadata = httpclient.InferenceServerClient(args.url).get_model_metadata(args.model)
    [features] = metadata["inputs"]
    [logits] = metadata["outputs"]
    width = features["shape"][1]  # the shape is [-1, 64]: batch dimension first
    rng = np.random.default_rng(1)
    requests = [
        rng.standard_normal((1 + i % 4, width)).astype(np.float32) for i in range(args.requests)
    ]
    local = threading.local()

    def infer(x: np.ndarray) -> np.ndarray:
        if not hasattr(local, "client"):
            local.client = httpclient.InferenceServerClient(args.url)
        tensor = httpclient.InferInput(features["name"], list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=True)
        wanted = httpclient.InferRequestedOutput(logits["name"], binary_data=True)
        result = local.client.infer(args.model, [tensor], outputs=[wanted])
        return result.as_numpy(logits["name"])

    with ThreadPoolExecutor(args.threads) as pool:
        answers = list(pool.map(infer, requests))

    session = ort.InferenceSession(str(PATH), providers=["CPUExecutionProvider"])
    for x, answer in zip(requests, answers, strict=True):
        [expected] = session.run(None, {features["name"]: x})
        # A batch may round differently in the last bit than one request alone.
        np.testing.assert_allclose(answer, expected, rtol=1e-5, atol=1e-6)

    stats = httpclient.InferenceServerClient(args.url).get_inference_statistics(args.model)
    counts = stats["model_stats"][0]
    print(
        f"{len(requests)} requests, {sum(len(x) for x in requests)} rows: every answer matches "
        f"onnxruntime run directly. Since the server started: {counts['inference_count']} rows "
        f"in {counts['execution_count']} model calls."
    )


if __name__ == "__main__":
    main()
