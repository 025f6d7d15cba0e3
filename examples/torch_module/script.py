"""Save the example module as TorchScript, to serve the file without its Python code.

Writes ``examples/torch_module/model.pt`` (not committed), which
``carpool serve examples/torch_module/model.pt --input INPUT0:FP32:16 --output OUTPUT0:FP32:4``
serves: a TorchScript file carries no signature, so the command line declares it.
Usage, from the repository root: ``python3 -m examples.torch_module.script``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from examples.torch_module.model import TinyMLP

PATH = Path(__file__).with_name("model.pt")


def main() -> None:
    scripted = torch.jit.script(TinyMLP().eval())
    scripted.save(str(PATH))
    print(f"saved {PATH}")


if __name__ == "__main__":
    main()
