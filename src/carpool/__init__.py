"""carpool: dynamic request batching for model inference, each caller given its own rows."""

from importlib.metadata import version as _version

from carpool.collation.collate import Collator, Handler
from carpool.collation.padding import Padding
from carpool.compat import InferenceBatcher, batch_inference
from carpool.decorator import BatchedFunction, batch
from carpool.engine.batcher import Batcher
from carpool.engine.stats import BatcherStats, Percentiles
from carpool.errors import (
    BatcherClosed,
    BatchSizeMismatch,
    BatchTimeout,
    BlockingCallOnLoop,
    CarpoolError,
    CollationError,
    ConfigError,
    ConfigTypeError,
    DeadlineExceeded,
    ModelExit,
    Overloaded,
    QueueFull,
    SharedMemoryFull,
    WorkerDied,
    WorkerPoolClosed,
    WorkerStartError,
)
from carpool.model import Batching, Model, Tensor
from carpool.policies.adaptive import AdaptivePolicy
from carpool.policies.base import (
    Admission,
    Dispatch,
    DispatchReason,
    EagerPolicy,
    FixedPolicy,
    Policy,
    PolicyHooks,
    QueueView,
    WaitUntil,
)
from carpool.policies.cost import CostCurve, CostModel
from carpool.steps.batcher import StepBatcher
from carpool.steps.model import StepModel
from carpool.steps.stats import StepSnapshot
from carpool.steps.stream import Stream
from carpool.stepwise import StepwiseModel

__version__ = _version("carpool")  # written once, in pyproject.toml

__all__ = [
    # the engine
    "Batcher",
    "batch",
    "BatchedFunction",
    "BatcherStats",
    "Percentiles",
    "Collator",
    "Handler",
    # step-wise models: sequences that join and leave a batch at every step
    "StepModel",
    "StepBatcher",
    "Stream",
    "StepSnapshot",
    "StepwiseModel",
    # serving: a model with a declared signature
    "Model",
    "Tensor",
    "Batching",
    "Padding",
    # policies: write your own with decide(view, now)
    "Policy",
    "PolicyHooks",
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
    "SharedMemoryFull",
    "Overloaded",
    "DeadlineExceeded",
    "BatcherClosed",
    "CollationError",
    "BatchSizeMismatch",
    "ConfigError",
    "ConfigTypeError",
    "BlockingCallOnLoop",
    "WorkerDied",
    "ModelExit",
    "BatchTimeout",
    "WorkerStartError",
    "WorkerPoolClosed",
    # the classic manual API
    "InferenceBatcher",
    "batch_inference",
]
