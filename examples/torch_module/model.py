"""A small PyTorch model for ``carpool serve``, as a module and as a declared carpool.Model.

``model`` is a plain ``nn.Module`` (``carpool serve examples.torch_module.model:model``):
carpool serves it with one input ``INPUT0`` and one output ``OUTPUT0`` of whatever requests
send. ``served`` wraps the same module with :func:`carpool.backends.torch.torch_model` and
declares its signature and batching (``carpool serve examples.torch_module.model:served``),
so metadata is exact and a request of the wrong shape gets a 400 before it queues.
"""

from __future__ import annotations

import torch
from torch import nn

from carpool import Batching, Tensor
from carpool.backends.torch import torch_model

FEATURES, HIDDEN, CLASSES = 16, 64, 4


class TinyMLP(nn.Module):
    """16 floats in, 4 logits out; each output row depends on its own input row only, so
    batching never changes an answer. Weights come from ``seed``: every instance agrees."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):  # seed the weights, not the caller's RNG
            torch.manual_seed(seed)
            self.layers = nn.Sequential(
                nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


model = TinyMLP()

served = torch_model(
    model,
    name="tinymlp",
    inputs=[Tensor("INPUT0", "FP32", (FEATURES,))],
    outputs=[Tensor("OUTPUT0", "FP32", (CLASSES,))],
    batching=Batching(max_batch_size=64, max_wait_ms=2.0),
)
