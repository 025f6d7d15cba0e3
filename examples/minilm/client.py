"""Embed a few sentences with the ``minilm`` model behind ``carpool serve minilm``.

Sends the sentences as one BYTES tensor of shape [rows, 1] through Triton's own HTTP client
and prints their cosine similarities. The embeddings are unit length, so a dot product is
the cosine. Usage: ``python examples/minilm/client.py [--url 127.0.0.1:8000]``.
"""

from __future__ import annotations

import argparse

import numpy as np
import tritonclient.http as httpclient

SENTENCES = [
    "A man is playing a guitar.",
    "Someone plays an acoustic guitar on stage.",
    "The stock market fell sharply today.",
    "Shares dropped at the opening bell.",
    "Ein Mann spielt Gitarre. 🎸",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="127.0.0.1:8000", help="the server's host:port")
    parser.add_argument("--model", default="minilm", help="the served model's name")
    args = parser.parse_args()

    client = httpclient.InferenceServerClient(args.url)
    text = httpclient.InferInput("TEXT", [len(SENTENCES), 1], "BYTES")
    text.set_data_from_numpy(
        np.array([[s.encode("utf-8")] for s in SENTENCES], dtype=object), binary_data=True
    )
    wanted = httpclient.InferRequestedOutput("EMBEDDING", binary_data=True)
    embeddings = client.infer(args.model, [text], outputs=[wanted]).as_numpy("EMBEDDING")
    if embeddings is None:
        raise SystemExit("the server returned no EMBEDDING output")

    similarity = embeddings @ embeddings.T
    lines = [f"embeddings: {embeddings.shape[0]} x {embeddings.shape[1]} float32", ""]
    for i, sentence in enumerate(SENTENCES):
        scores = "  ".join(f"{similarity[i, j]:5.2f}" for j in range(len(SENTENCES)))
        lines.append(f"[{i}] {scores}   {sentence}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
