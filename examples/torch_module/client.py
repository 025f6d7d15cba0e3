"""Send concurrent requests to the served example and check each answer against the module.

Requests of 1 to 3 rows go out at once from several threads through Triton's own HTTP client
(one client per thread: a client is not thread-safe), so the server batches them; every
answer must equal ``TinyMLP`` run directly on that request alone. The model's statistics
then show how many rows shared how many model calls. Usage, from the repository root:
``python3 -m examples.torch_module.client [--model tinymlp]``.
"""

from __future__ import annotations

import argparse
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import tritonclient.http as httpclient
from examples.torch_module.model import FEATURES, TinyMLP


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="127.0.0.1:8000", help="the server's host:port")
    parser.add_argument(
        "--model", default="tinymlp", help="tinymlp for ...model:served, model for the others"
    )
    parser.add_argument("--requests", type=int, default=96, help="how many to send")
    parser.add_argument("--threads", type=int, default=16, help="how many at once")
    args = parser.parse_args()

    rng = np.random.default_rng(1)
    requests = [
        rng.standard_normal((1 + i % 3, FEATURES)).astype(np.float32) for i in range(args.requests)
    ]
    local = threading.local()

    def infer(x: np.ndarray) -> np.ndarray:
        if not hasattr(local, "client"):
            local.client = httpclient.InferenceServerClient(args.url)
        tensor = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=True)
        wanted = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
        return local.client.infer(args.model, [tensor], outputs=[wanted]).as_numpy("OUTPUT0")

    with ThreadPoolExecutor(args.threads) as pool:
        answers = list(pool.map(infer, requests))

    reference = TinyMLP().eval()
    for x, answer in zip(requests, answers, strict=True):
        with torch.inference_mode():
            expected = reference(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(answer, expected, rtol=1e-5, atol=1e-6)

    client = httpclient.InferenceServerClient(args.url)
    stats = client.get_inference_statistics(args.model)["model_stats"][0]
    print(
        f"{len(requests)} requests, {sum(len(x) for x in requests)} rows: every answer equals "
        f"TinyMLP run directly. Since the server started: {stats['inference_count']} rows "
        f"in {stats['execution_count']} model calls."
    )


if __name__ == "__main__":
    main()
