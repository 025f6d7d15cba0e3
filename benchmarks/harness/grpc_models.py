"""Doubling models at carpool serve's default batching (32 rows, eager): ``double`` costs
nothing, so a batch's size shows how the front end admitted its calls; ``double_2ms`` sleeps
2 ms a batch (the GIL released, as a GPU's would be). From the repository's root: ``carpool
serve benchmarks.harness.grpc_models:double benchmarks.harness.grpc_models:double_2ms``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from carpool import Model, Tensor

DIM = 4
MODEL_S = 0.002  # double_2ms's cost per batch


def _double(batch: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return batch * 2


def _double_2ms(batch: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    time.sleep(MODEL_S)
    return batch * 2


def _model(function: Any, name: str) -> Model:
    return Model(
        function,
        name=name,
        inputs=[Tensor("INPUT0", "FP32", (DIM,))],
        outputs=[Tensor("OUTPUT0", "FP32", (DIM,))],
    )  # carpool serve's default batching (32 rows, eager), as issue 18 measured


double = _model(_double, "double")
double_2ms = _model(_double_2ms, "double_2ms")
