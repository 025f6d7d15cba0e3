"""carpool: dynamic request batching for ML model inference.

Requests arrive one at a time; carpool holds them for a short window or until a batch is
full, runs the model once on the stacked batch, and hands each caller exactly its own row.
"""

from carpool.batcher import Batcher
from carpool.collate import Collator
from carpool.compat import InferenceBatcher, batch_inference
from carpool.cost import CostCurve, CostModel
from carpool.decorator import batch
from carpool.errors import (
    BatcherClosed,
    BatchSizeMismatch,
    CarpoolError,
    CollationError,
    DeadlineExceeded,
    Overloaded,
    QueueFull,
)
from carpool.model import Batching, Model, Tensor
from carpool.policy import (
    AdaptivePolicy,
    Admission,
    Dispatch,
    DispatchReason,
    EagerPolicy,
    FixedPolicy,
    Policy,
    QueueView,
    WaitUntil,
)
from carpool.stats import BatcherStats, Percentiles

__version__ = "0.1.0"

__all__ = [
    # the engine
    "Batcher",
    "batch",
    "BatcherStats",
    "Percentiles",
    "Collator",
    # serving: a model with a declared signature
    "Model",
    "Tensor",
    "Batching",
    # policies: write your own with decide(view, now)
    "Policy",
    "QueueView",
    "Dispatch",
    "WaitUntil",
    "DispatchReason",
    "EagerPolicy",
    "FixedPolicy",
    # adaptive batching: a latency objective, a learned cost model, early rejection
    "AdaptivePolicy",
    "Admission",
    "CostModel",
    "CostCurve",
    # errors
    "CarpoolError",
    "QueueFull",
    "Overloaded",
    "DeadlineExceeded",
    "BatcherClosed",
    "CollationError",
    "BatchSizeMismatch",
    # the classic manual API
    "InferenceBatcher",
    "batch_inference",
]
