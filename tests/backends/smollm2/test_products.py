"""The torch engine's integer products: exact on any CPU, a row's result its own."""

from __future__ import annotations

import pytest
import torch

from carpool.backends.smollm2.products import Int8Linear


@pytest.mark.parametrize("rows", [1, 5, 16, 40])
def test_int8_products_are_exact_and_alone_on_either_kernel(rows: int) -> None:
    """fbgemm's products (u8 x s7, summed in 16-bit pairs on AVX2) and ``_int_mm``'s agree:
    neither saturates, so both are the exact integer sums; a row's result is the one it gets
    alone, whoever shares its batch."""
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 64, generator=generator)
    x = torch.randn(rows, 64, generator=generator) * torch.logspace(-2, 2, rows)[:, None]
    x[0, :8] = 30.0  # the largest activations against the largest weights: pairs at the bound
    weight[0, :8] = weight.abs().max()
    fbgemm, int_mm = Int8Linear(weight, fbgemm=True), Int8Linear(weight, fbgemm=False)
    together = fbgemm(x)
    assert torch.equal(together, torch.cat([fbgemm(row[None]) for row in x]))
    assert torch.allclose(together, int_mm(x), rtol=1e-5, atol=1e-5 * x.abs().max().item())
    peak = x.abs().amax(1, keepdim=True)
    scale = weight.abs().amax(1) / 63
    sums = (x * 127 / peak).round().double() @ (weight / scale[:, None]).round().double().t()
    exact = (sums * (peak / 127).double() * scale.double()).float()  # the integer sums, scaled
    assert torch.allclose(together, exact, rtol=1e-5, atol=1e-5 * x.abs().max().item())
