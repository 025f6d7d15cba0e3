"""The public surface is a decision: changing it must change this test."""

import carpool
import carpool.errors


def test_public_api() -> None:
    assert set(carpool.__all__) == {
        "Batcher",
        "batch",
        "BatchedFunction",
        "BatcherStats",
        "Percentiles",
        "Collator",
        "Handler",
        "Model",
        "Tensor",
        "StepModel",
        "StepBatcher",
        "Stream",
        "StepSnapshot",
        "StepwiseModel",
        "Batching",
        "Padding",
        "Policy",
        "PolicyHooks",
        "QueueView",
        "Dispatch",
        "WaitUntil",
        "DispatchReason",
        "EagerPolicy",
        "FixedPolicy",
        "AdaptivePolicy",
        "Admission",
        "CostModel",
        "CostCurve",
        "CarpoolError",
        "QueueFull",
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
        "SharedMemoryFull",
        "BatchTimeout",
        "WorkerStartError",
        "WorkerPoolClosed",
        "InferenceBatcher",
        "batch_inference",
    }
    for name in carpool.__all__:
        assert getattr(carpool, name).__module__.startswith("carpool.")


def test_errors_are_re_exported() -> None:
    for name in carpool.errors.__all__:
        assert getattr(carpool, name) is getattr(carpool.errors, name)
