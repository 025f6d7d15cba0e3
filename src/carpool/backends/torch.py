"""PyTorch models (an ``nn.Module`` or a TorchScript file) as a :class:`carpool.Model`: the numpy
<-> torch crossing, without a copy where numpy allows. torch is imported only when
:func:`torch_model` is called, so ``import carpool`` never pays for it."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from carpool.model import Batching, Model, Tensor

if TYPE_CHECKING:
    import torch

__all__ = ["torch_model"]


def torch_model(
    module: torch.nn.Module | str | os.PathLike[str],
    *,
    name: str | None = None,
    version: str = "1",
    inputs: Sequence[Tensor] | None = None,
    outputs: Sequence[Tensor] | None = None,
    batching: Batching | None = None,
    device: str | None = None,
    threads: int | None = None,
) -> Model:
    """A :class:`Model` that runs ``module`` on each stacked batch.

    ``module`` is an ``nn.Module`` (a ``ScriptModule`` too) or the path of a TorchScript file,
    loaded with ``torch.jit.load``. It is put in ``eval()`` mode and moved to ``device``
    (default: ``"cuda"`` when available, else ``"cpu"``) once, here; every batch then runs
    under ``torch.inference_mode()``. Its inputs are passed to ``forward`` positionally, in
    the order ``inputs`` declares them. torch cannot tell a module's signature, so
    ``inputs=None`` takes one input of whatever requests send. ``forward`` may return a
    tensor (the one output), a tuple or list of tensors (the declared ``outputs``, in order),
    or a dict of tensors by output name. ``name`` defaults to the file's stem, or the
    module's class name in lower case.

    ``threads`` sets torch's intra-op thread count, which is process-wide: it applies to every
    torch model in the process, not this one alone.

    Raises ``ImportError`` when torch is not installed, and ``ValueError`` for a missing or
    non-TorchScript file, an unknown or unavailable device, a ``threads`` below 1, or a
    ``module`` that is neither an ``nn.Module`` nor a path.
    """
    try:
        import torch
    except ImportError as exc:
        raise ImportError(
            "carpool's torch backend needs PyTorch: pip install 'carpool[torch]'"
        ) from exc

    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be an int >= 1, got {threads!r}")
        torch.set_num_threads(threads)
    target = _device(device)
    net, default_name = _module(module, target)
    net.eval()
    return Model(
        _runner(net, target, inputs, outputs),
        name=name if name is not None else default_name,
        version=version,
        inputs=inputs,
        outputs=outputs,
        batching=batching if batching is not None else Batching(),
        platform="pytorch_libtorch" if isinstance(net, torch.jit.ScriptModule) else "pytorch",
    )


def _module(
    module: torch.nn.Module | str | os.PathLike[str], device: torch.device
) -> tuple[torch.nn.Module, str]:
    """The module on ``device`` (loaded first when given a path), and its default name: the
    file's stem, or the class name in lower case."""
    import torch

    if isinstance(module, str | os.PathLike):
        path = Path(module)
        return _load(path, device), path.stem
    if isinstance(module, torch.nn.Module):
        net = module.to(device)
        # A ScriptModule's class is RecursiveScriptModule; original_name is the one written.
        return net, getattr(net, "original_name", type(net).__name__).lower()
    raise ValueError(
        f"torch_model needs an nn.Module or the path of a TorchScript file, got "
        f"{type(module).__name__}"
    )


def _device(device: str | None) -> torch.device:
    """The device to run on, checked now so that a typo fails at startup, not per request."""
    import torch

    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        target = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(
            f"unknown torch device {device!r}; use e.g. 'cpu', 'cuda' or 'cuda:1' ({exc})"
        ) from None
    try:
        torch.empty(0, device=target)
    # A CPU-only torch asserts when asked for CUDA; other missing backends raise RuntimeError.
    except (AssertionError, RuntimeError) as exc:
        raise ValueError(
            f"torch device {device!r} is not available here ({exc}); use device='cpu'"
        ) from None
    return target


def _load(path: Path, device: torch.device) -> torch.nn.Module:
    """The TorchScript module saved at ``path``, loaded straight onto ``device``."""
    import torch

    if not path.is_file():
        raise ValueError(f"TorchScript file {str(path)!r} not found; check the path")
    try:
        with warnings.catch_warnings():
            # torch deprecates TorchScript (torch.jit.*) in favour of torch.export. Serving a
            # .pt file is what the operator asked for; nothing at serve time can act on that.
            warnings.filterwarnings(
                "ignore", r"`torch\.jit\.load` is deprecated", category=DeprecationWarning
            )
            module: torch.nn.Module = torch.jit.load(path, map_location=device)  # type: ignore[no-untyped-call]
    except RuntimeError as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(
            f"{str(path)!r} is not a TorchScript file ({first_line}); save one with "
            "torch.jit.script(module).save(path), or serve the nn.Module itself"
        ) from None
    return module


def _runner(
    net: torch.nn.Module,
    device: torch.device,
    inputs: Sequence[Tensor] | None,
    outputs: Sequence[Tensor] | None,
) -> Callable[[Any], Any]:
    """The batched function: numpy batch in, ``forward`` under inference mode, numpy out."""
    import torch

    input_names = [t.name for t in inputs] if inputs is not None else None
    output_names = [t.name for t in outputs] if outputs is not None else None

    def run(batch: Any) -> Any:
        args = [_to_tensor(value, device) for value in _arguments(batch, input_names)]
        with torch.inference_mode():
            result = net(*args)
        return _named(result, output_names)

    return run


def _arguments(batch: Any, input_names: list[str] | None) -> list[Any]:
    """``forward``'s positional arguments: the inputs in their declared order."""
    if not isinstance(batch, Mapping):
        return [batch]
    if input_names is None:  # carpool.Model hands a dict over in its declared order
        return list(batch.values())
    if any(key not in batch for key in input_names):
        raise ValueError(
            f"the batch holds inputs {sorted(batch)}, but torch_model was built with "
            f"inputs {input_names}; declare them when calling torch_model(inputs=...)"
        )
    return [batch[key] for key in input_names]


def _to_tensor(value: Any, device: torch.device) -> torch.Tensor:
    """An input on ``device``, sharing the array's memory where numpy allows it."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    array = np.asarray(value)
    # from_numpy shares memory, but warns on a read-only array (the server's decoded
    # request bytes) and refuses strided or byte-swapped ones: copy those first.
    if not (array.flags.writeable and array.flags.c_contiguous and array.dtype.isnative):
        array = np.array(array, dtype=array.dtype.newbyteorder("="), order="C")
    tensor: torch.Tensor = torch.from_numpy(array).to(device, non_blocking=True)
    return tensor


def _named(result: Any, output_names: list[str] | None) -> Any:
    """``forward``'s result as the Model takes it: one array, a tuple, or arrays by name."""
    if isinstance(result, Mapping):
        return {key: _to_numpy(value, f"output {key!r}") for key, value in result.items()}
    values = list(result) if isinstance(result, tuple | list) else [result]
    if output_names is None and len(values) > 1:  # the Model names them, in its order
        return tuple(_to_numpy(value, f"output {i}") for i, value in enumerate(values))
    if output_names is not None and len(values) != len(output_names):
        raise ValueError(
            f"the module returned {len(values)} output(s), but outputs declares "
            f"{len(output_names)}: {output_names}"
        )
    if len(values) == 1:  # left unnamed: the Model names its single output
        return _to_numpy(values[0], "its output")
    return {
        key: _to_numpy(value, f"output {key!r}")
        for key, value in zip(output_names or (), values, strict=True)
    }


def _to_numpy(value: Any, what: str) -> np.ndarray[Any, Any]:
    """One output tensor as a numpy array on the CPU; ``what`` names it in the error."""
    import torch

    if not isinstance(value, torch.Tensor):
        raise TypeError(f"the module returned {what} as {type(value).__name__}, not a tensor")
    if value.dtype == torch.bfloat16:
        value = value.float()  # numpy has no bfloat16; carpool holds BF16 as float32
    array: np.ndarray[Any, Any] = value.detach().cpu().numpy()
    return array
