"""The torch engine's matrix products, ``x @ weight.T`` for a step's packed tokens: fp32 by
numpy's BLAS, or integers by fbgemm (``torch._int_mm`` where torch has no fbgemm)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

from carpool.backends.cpu_features import cpu_features

__all__ = ["Fp32Linear", "Int8Linear"]


class Fp32Linear:
    """``x @ weight.T`` in fp32, by numpy's BLAS (OpenBLAS): on AMD EPYC (AVX2) it ran a
    decode step in 0.68-0.76x the time torch's MKL took, 1 to 32 sequences
    (``benchmarks.streams.engines``). The weight is read as [in, out] memory: no copy when
    it is stored so (``load_weights`` stores them so), one when it is not (a tied head)."""

    def __init__(self, weight: torch.Tensor) -> None:
        self._weight = np.ascontiguousarray(weight.t().numpy())

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(np.matmul(x.numpy(), self._weight))


class Int8Linear:
    """``x @ weight.T`` in integers: the weight in 7 bits with one scale per output row, ``x``
    in 8 with one scale per token, so a token's result never depends on its batch neighbours,
    and every product is exact on any CPU: u8 x s7 pairs stay under the 16-bit bound where
    AVX2 without VNNI saturates (``vpmaddubsw``). fbgemm runs it where torch has it (x86 with
    AVX2): 2.4x fp32's decode step at 16 sequences on AMD EPYC; elsewhere ``torch._int_mm``."""

    def __init__(self, weight: torch.Tensor, *, fbgemm: bool | None = None) -> None:
        weight = weight.contiguous()  # [out, in] rows (load_weights stores [in, out])
        self._scale = weight.abs().amax(dim=1).clamp(min=1e-12) / _WEIGHT_LEVELS
        quantized = (weight / self._scale[:, None]).round().to(torch.int8)
        self._fbgemm = _has_fbgemm() if fbgemm is None else fbgemm
        if self._fbgemm:
            self._packed = _fbgemm_pack(quantized, self._scale)
            # one more row spanning [-128/127, 1]: fbgemm's per-batch activation range is
            # then always that, its scale 1/127 and zero point 128, whoever shares the batch
            self._span = torch.zeros(1, weight.shape[1])
            self._span[0, :2] = torch.tensor([1.0, -128 / 127])
        else:
            self._weight = quantized.t()  # [in, out] as a transposed view: _int_mm's fastest

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # clamped in place: the peak costs 6.9 us a call, not 14.5 (AMD EPYC, one row)
        peak = x.abs().amax(dim=1, keepdim=True).clamp_(min=1e-12)
        if self._fbgemm:
            rows = torch.cat([x / peak, self._span])
            product: torch.Tensor = torch.ops.quantized.linear_dynamic(rows, self._packed, False)
            return product[:-1] * peak
        quantized = (x * (127 / peak)).round_().to(torch.int8)
        return torch._int_mm(quantized, self._weight) * (peak / 127) * self._scale


_WEIGHT_LEVELS = 63  # 7-bit weights: 255 x 63 x 2 fits the 16 bits vpmaddubsw sums pairs in


def _has_fbgemm() -> bool:
    """Whether torch's fbgemm kernels run here (x86 with AVX2; absent on arm)."""
    return "fbgemm" in torch.backends.quantized.supported_engines and "avx2" in cpu_features().flags


def _fbgemm_pack(quantized: torch.Tensor, scale: torch.Tensor) -> Any:
    """The weight ([out, in] int8) prepacked for fbgemm, one scale per output row."""
    rows = quantized.shape[0]
    with warnings.catch_warnings():  # quantized tensors are deprecated; torch is pinned
        warnings.simplefilter("ignore", UserWarning)
        weight = torch._make_per_channel_quantized_tensor(
            quantized, scale.double(), torch.zeros(rows, dtype=torch.long), 0
        )
    return torch.ops.quantized.linear_prepack(weight, None)
