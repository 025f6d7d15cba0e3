"""carpool.backends.torch: nn.Modules and TorchScript files served through the batcher."""

from __future__ import annotations

import asyncio
import re
import sys
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from carpool import Batching, Model, Tensor
from carpool.backends.torch import torch_model

ROWS = (1, 2, 3, 3, 2, 1)  # concurrent requests; 12 rows fill one batch exactly
ONE_BATCH = Batching(max_batch_size=sum(ROWS), max_wait_ms=30_000, policy="fixed")


class Affine(nn.Module):
    """A seeded linear layer and a ReLU: each output row depends on its input row alone."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


class Probe(nn.Module):
    """Returns its input, and records what ``forward`` saw."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, Any] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen = {
            "pointer": x.data_ptr(),
            "inference_mode": torch.is_inference_mode_enabled(),
            "training": self.training,
        }
        return x


class Mix(nn.Module):
    """Two inputs of different dtypes, so swapping them cannot go unnoticed."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * 10 + b.float()


class Split(nn.Module):
    """Several outputs of several dtypes, as a tuple or as a dict."""

    def __init__(self, as_dict: bool) -> None:
        super().__init__()
        self.as_dict = as_dict

    def forward(self, x: torch.Tensor) -> Any:
        total, positive, half = x.sum(dim=1, keepdim=True), x > 0, x.half()
        if self.as_dict:
            return {"positive": positive, "total": total, "half": half, "brain": x.bfloat16()}
        return total, positive, half


def rows(n: int, seed: int, width: int = 4) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).standard_normal((n, width)).astype(np.float32)


async def infer_all(model: Model, values: list[dict[str, Any]]) -> tuple[list[Any], int]:
    async with model.batcher() as b:
        results = await asyncio.gather(*(b.infer_many(v) for v in values))
        return list(results), b.stats().batches


def compiled(how: str) -> torch.jit.ScriptModule:
    """Affine as TorchScript (which torch deprecates; the files still need serving)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"`torch\.jit\.\w+` is deprecated", DeprecationWarning)
        if how == "script":
            return torch.jit.script(Affine())
        return torch.jit.trace(Affine(), torch.ones(1, 4))


def save_affine(path: Path, how: str) -> Path:
    compiled(how).save(str(path))
    return path


@pytest.mark.parametrize("how", ["module", "script", "trace"])
async def test_concurrent_requests_share_a_batch_and_get_their_own_rows(
    tmp_path: Path, how: str
) -> None:
    source: nn.Module | Path = (
        Affine() if how == "module" else save_affine(tmp_path / "affine.pt", how)
    )
    model = torch_model(source, batching=ONE_BATCH, device="cpu")
    assert model.name == "affine"
    assert model.platform == ("pytorch" if how == "module" else "pytorch_libtorch")
    requests = [rows(n, seed) for seed, n in enumerate(ROWS)]

    results, batches = await infer_all(model, [{"INPUT0": x} for x in requests])

    assert batches == 1 < len(requests)
    reference = Affine().eval()
    for x, result in zip(requests, results, strict=True):
        assert list(result) == ["OUTPUT0"]
        assert result["OUTPUT0"].dtype == np.float32
        with torch.inference_mode():
            expected = reference(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(result["OUTPUT0"], expected, rtol=1e-6, atol=1e-6)


async def test_several_inputs_reach_forward_in_declared_order() -> None:
    model = torch_model(
        Mix(),
        inputs=[Tensor("a", "FP32", (4,)), Tensor("b", "INT64", (4,))],
        outputs=[Tensor("mixed", "FP32", (4,))],
        batching=ONE_BATCH,
    )
    values = [
        # keys in the other order: the declaration decides forward's argument order
        {"b": np.full((n, 4), i, np.int64), "a": np.full((n, 4), i / 10, np.float32)}
        for i, n in enumerate(ROWS)
    ]

    results, batches = await infer_all(model, values)

    assert batches == 1
    for i, (n, result) in enumerate(zip(ROWS, results, strict=True)):
        np.testing.assert_allclose(result["mixed"], np.full((n, 4), 2.0 * i, np.float32))


@pytest.mark.parametrize("as_dict", [False, True])
async def test_several_outputs_come_back_by_declared_name(as_dict: bool) -> None:
    outputs = [
        Tensor("total", "FP32", (1,)),
        Tensor("positive", "BOOL", (4,)),
        Tensor("half", "FP16", (4,)),
    ]
    if as_dict:
        outputs.append(Tensor("brain", "BF16", (4,)))
    model = torch_model(
        Split(as_dict), inputs=[Tensor("x", "FP32", (4,))], outputs=outputs, batching=ONE_BATCH
    )
    requests = [rows(n, seed) for seed, n in enumerate(ROWS)]

    results, batches = await infer_all(model, [{"x": x} for x in requests])

    assert batches == 1
    for x, result in zip(requests, results, strict=True):
        assert sorted(result) == sorted(t.name for t in outputs)
        np.testing.assert_allclose(result["total"], x.sum(axis=1, keepdims=True), rtol=1e-6)
        np.testing.assert_array_equal(result["positive"], x > 0)
        np.testing.assert_array_equal(result["half"], x.astype(np.float16))
        if as_dict:  # numpy has no bfloat16: BF16 comes back as float32, as the server holds it
            assert result["brain"].dtype == np.float32
            np.testing.assert_array_equal(result["brain"], torch.from_numpy(x).bfloat16().float())


def test_a_writable_contiguous_batch_reaches_forward_without_a_copy() -> None:
    probe = Probe()
    model = torch_model(probe, device="cpu")
    batch = rows(3, seed=0)

    out = model.fn(batch)

    assert probe.seen["pointer"] == batch.__array_interface__["data"][0]
    assert np.shares_memory(out, batch)  # and the output comes back without one either


@pytest.mark.parametrize("kind", ["read-only", "strided", "big-endian"])
def test_other_batches_are_copied_first_without_a_warning(kind: str) -> None:
    probe = Probe()
    model = torch_model(probe, device="cpu")
    batch = rows(3, seed=0, width=8)
    if kind == "read-only":
        batch.setflags(write=False)
    elif kind == "strided":
        batch = batch[:, ::2]
    else:
        batch = batch.astype(">f4")

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = model.fn(batch)

    assert probe.seen["pointer"] != batch.__array_interface__["data"][0]
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, batch)


def test_torch_tensors_are_taken_as_they_are() -> None:
    probe = Probe()
    batch = torch.arange(6.0).reshape(2, 3)

    out = torch_model(probe, device="cpu").fn(batch)

    assert probe.seen["pointer"] == batch.data_ptr()
    np.testing.assert_array_equal(out, batch.numpy())


def test_forward_runs_in_eval_and_inference_mode() -> None:
    probe = Probe()
    assert probe.training

    torch_model(probe, device="cpu").fn(rows(1, seed=0))

    assert probe.seen == {
        "pointer": probe.seen["pointer"],
        "inference_mode": True,
        "training": False,
    }
    assert not torch.is_inference_mode_enabled()  # only inside forward


def test_names_platform_device_and_threads(tmp_path: Path) -> None:
    scripted = compiled("script")
    assert torch_model(scripted).name == "affine"
    assert torch_model(scripted).platform == "pytorch_libtorch"
    assert torch_model(Affine(), name="scorer", version="3").name == "scorer"
    assert torch_model(save_affine(tmp_path / "ranker.pt", "script")).name == "ranker"
    net = Affine()
    torch_model(net)
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert net.linear.weight.device.type == expected
    before = torch.get_num_threads()
    try:
        torch_model(Affine(), threads=1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "missing.pt"
    with pytest.raises(ValueError, match=re.escape(f"TorchScript file '{path}' not found; check")):
        torch_model(path)


@pytest.mark.parametrize("content", ["not a zip", "state dict"])
def test_a_file_that_is_not_torchscript_is_refused(tmp_path: Path, content: str) -> None:
    path = tmp_path / "weights.pt"
    if content == "state dict":
        torch.save(Affine().state_dict(), path)
    else:
        path.write_bytes(b"not a model")
    with pytest.raises(ValueError, match=re.escape(f"'{path}' is not a TorchScript file (")) as e:
        torch_model(str(path))
    assert str(e.value).endswith(
        "); save one with torch.jit.script(module).save(path), or serve the nn.Module itself"
    )


def test_devices_that_do_not_exist_are_refused() -> None:
    with pytest.raises(ValueError, match=r"^unknown torch device 'gpu'; use e\.g\. 'cpu', 'cuda'"):
        torch_model(Affine(), device="gpu")
    with pytest.raises(ValueError, match=r"^torch device 'cuda:99' is not available here \("):
        torch_model(Affine(), device="cuda:99")


def test_objects_that_are_not_modules_are_refused() -> None:
    with pytest.raises(
        ValueError,
        match=r"^torch_model needs an nn\.Module or the path of a TorchScript file, got function$",
    ):
        torch_model(lambda x: x)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^threads must be an int >= 1, got 0$"):
        torch_model(Affine(), threads=0)


def test_without_torch_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    net = Affine()
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match=re.escape("pip install 'carpool[torch]'")):
        torch_model(net)


def test_outputs_declared_after_loading_are_named_in_order() -> None:
    # The server declares a TorchScript file's signature after loading it (flags, carpool.toml).
    x = rows(2, seed=0)
    model = replace(
        torch_model(Split(as_dict=False)), outputs=[Tensor("t"), Tensor("p"), Tensor("h")]
    )
    got = model.batched_fn()({"INPUT0": x})
    assert list(got) == ["t", "p", "h"]
    # torch and numpy each sum a row with a kernel picked for the CPU, in an order of their
    # own; the second row here is 2.0770066 or 2.0770068 depending on that order.
    np.testing.assert_allclose(got["t"], x.sum(axis=1, keepdims=True), rtol=1e-6)
    np.testing.assert_array_equal(got["p"], x > 0)


def test_declared_output_count_must_match() -> None:
    x = rows(2, seed=0)
    with pytest.raises(
        ValueError,
        match=re.escape("the module returned 3 output(s), but outputs declares 2: ['a', 'b']"),
    ):
        torch_model(Split(as_dict=False), outputs=[Tensor("a"), Tensor("b")]).fn(x)
    late = replace(torch_model(Split(as_dict=False)), outputs=[Tensor("a"), Tensor("b")])
    with pytest.raises(TypeError, match=re.escape("returned 3 outputs; it declares ['a', 'b']")):
        late.batched_fn()({"INPUT0": x})


def test_inputs_declared_after_loading_reach_forward_in_declared_order() -> None:
    a, b = np.full((1, 4), 2.0, np.float32), np.ones((1, 4), np.int64)
    model = replace(torch_model(Mix()), inputs=[Tensor("a"), Tensor("b", "INT64")])
    got = model.batched_fn()({"b": b, "a": a})  # a client may send them in any order
    np.testing.assert_array_equal(got["OUTPUT0"], a * 10 + b)
