"""Export a small seeded MLP (64 -> 256 -> 256 -> 10) from PyTorch to ONNX, for carpool serve.

Writes ``examples/onnx_mlp/model.onnx`` (not committed) with a dynamic first axis on its
input and output, which is what lets carpool batch requests for it: a graph with a fixed
first axis is served with batching off. Uses torch's TorchScript-based exporter
(``dynamo=False``), which needs no package beyond torch and onnx.
Usage, from the repository root: ``python examples/onnx_mlp/export.py``.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

PATH = Path(__file__).with_name("model.onnx")
FEATURES, HIDDEN, CLASSES = 64, 256, 10
OPSET = 17  # runs on every onnxruntime carpool[onnx] allows (>= 1.17)


def main() -> None:
    torch.manual_seed(0)
    mlp = nn.Sequential(
        nn.Linear(FEATURES, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, CLASSES),
    ).eval()
    with warnings.catch_warnings():
        # torch 2.9+ calls the TorchScript exporter legacy; the dynamo one needs onnxscript.
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            mlp,
            (torch.zeros(1, FEATURES),),
            str(PATH),
            dynamo=False,
            input_names=["features"],
            output_names=["logits"],
            dynamic_axes={"features": {0: "batch"}, "logits": {0: "batch"}},
            opset_version=OPSET,
        )
    print(f"saved {PATH}")


if __name__ == "__main__":
    main()
