"""``carpool serve smollm2``: SmolLM2-135M-Instruct as a step-wise model, text (or chat
``messages``) in, one piece of text out per step with its finish reason and token counts (as
Triton's vLLM backend names them), sampling settings as request parameters, on the engine chosen
(``[models.smollm2] engine``, ``CARPOOL_SMOLLM2_ENGINE``); served over OpenAI's API too.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from functools import partial
from typing import Any

import numpy as np

from carpool.backends.cpu_features import CpuFeatures, cpu_features
from carpool.backends.generation import Message, Piece, Prompt
from carpool.errors import ConfigError
from carpool.model import Batching, Tensor
from carpool.steps.model import StepModel
from carpool.stepwise import StepwiseModel

__all__ = ["ENGINES", "ENGINE_ENV", "default_engine", "prompt_of", "smollm2_model"]

ENGINES = ("torch", "torch-fp32", "llama")  # torch: int8 matrix products
ENGINE_ENV = "CARPOOL_SMOLLM2_ENGINE"
MAX_TOKENS = 4096  # the most one request may ask for (the model's context is 8192)
_PARAMETERS = ("max_tokens", "temperature", "top_p", "seed", "stop", "chat", "messages")
_ROLES = ("system", "user", "assistant")


def smollm2_model(
    engine: str | None = None, *, threads: int = 1, max_sequences: int = 16
) -> StepwiseModel:
    """The served model on ``engine`` (None: the environment's, else torch)."""
    chosen = engine or os.environ.get(ENGINE_ENV) or default_engine()
    if chosen not in ENGINES:
        raise ConfigError(f"smollm2 engine must be one of {list(ENGINES)}, got {chosen!r}")
    return StepwiseModel(
        name="smollm2",
        platform=f"smollm2_{chosen.replace('-', '_')}",
        stepper=partial(_engine, chosen, threads, max_sequences),
        request=prompt_of,
        response=_piece_row,
        whole=_whole_row,
        inputs=[Tensor("text_input", "BYTES", (1,))],
        outputs=[
            Tensor("text_output", "BYTES", (1,)),
            Tensor("finish_reason", "BYTES", (1,)),
            Tensor("num_input_tokens", "INT32", (1,)),
            Tensor("num_output_tokens", "INT32", (1,)),
        ],
        openai=True,  # text generation over /v1/chat/completions and /v1/completions
        batching=Batching(max_batch_size=max_sequences),
        max_sequences=max_sequences,
        step_tokens=max(1024, max_sequences),
    )


def default_engine(features: CpuFeatures | None = None) -> str:
    """``torch`` (integer products) where they run fast: x86 with AVX2 (fbgemm's kernels) and
    CPUs that sum int8 products in 32-bit hardware (VNNI, AMX, arm); else ``torch-fp32``."""
    cpu = features or cpu_features()
    fast = cpu.exact_int8 or (cpu.machine in ("x86_64", "amd64") and "avx2" in cpu.flags)
    return "torch" if fast else "torch-fp32"


def _engine(name: str, threads: int, max_sequences: int) -> StepModel[Prompt, Any, Piece]:
    """The engine itself, built where its replica lives."""
    if name == "llama":
        from carpool.backends.smollm2.llama_engine import SmolLM2Llama

        return SmolLM2Llama(max_sequences=max_sequences, n_threads=threads)
    from carpool.backends.smollm2.torch_engine import SmolLM2Torch

    return SmolLM2Torch(threads=threads, int8=name == "torch")


def prompt_of(row: Mapping[str, np.ndarray[Any, Any]], parameters: Mapping[str, Any]) -> Prompt:
    """A request row and its parameters as a Prompt; ValueError(message, field) refuses."""
    unknown = sorted(set(parameters) - set(_PARAMETERS) - {"priority", "timeout"})
    if unknown:
        raise ValueError(
            f"smollm2 takes the parameters {list(_PARAMETERS)}, not {unknown[0]!r}",
            f"parameters.{unknown[0]}",
        )
    raw = np.asarray(row["text_input"]).reshape(-1)
    if raw.size != 1:
        raise ValueError(f"text_input holds one text, got {raw.size}", "text_input")
    text = raw[0].decode("utf-8", "replace") if isinstance(raw[0], bytes) else str(raw[0])
    messages = _messages(parameters.get("messages"))
    if messages and text:
        raise ValueError("give text_input or messages, not both", "text_input")
    max_tokens = _number(parameters, "max_tokens", 128, int, 1, MAX_TOKENS)
    temperature = _number(parameters, "temperature", 1.0, float, 0.0, 2.0)
    top_p = _number(parameters, "top_p", 1.0, float, 0.0, 1.0)
    if top_p == 0:
        raise ValueError("top_p must be > 0", "parameters.top_p")
    seed = parameters.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"seed must be an int, got {seed!r}", "parameters.seed")
    chat = parameters.get("chat", True)
    if not isinstance(chat, bool):
        raise ValueError(f"chat must be true or false, got {chat!r}", "parameters.chat")
    return Prompt(
        text=text,
        messages=messages,
        chat=chat,
        max_tokens=int(max_tokens),
        temperature=float(temperature),
        top_p=float(top_p),
        seed=seed,
        stop=_stops(parameters.get("stop")),
    )


def _number(
    parameters: Mapping[str, Any], name: str, default: float, kind: type, low: float, high: float
) -> float:
    value = parameters.get(name, default)
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if kind is int and not isinstance(value, int):
        ok = False
    if not ok or not math.isfinite(value) or not low <= value <= high:
        what = "an int" if kind is int else "a number"
        raise ValueError(
            f"{name} must be {what} from {low:g} to {high:g}, got {value!r}", f"parameters.{name}"
        )
    return float(value)


def _messages(value: Any) -> tuple[Message, ...]:
    """``messages``: a chat's turns, a list of ``{"role", "content"}`` (a string parameter
    carries the list as JSON), each role system, user or assistant, each content a string."""
    if value is None:
        return ()
    if isinstance(value, str):
        import json

        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            pass
    if not isinstance(value, list) or not value:
        raise ValueError(
            "messages must be a non-empty list of {role, content}", "parameters.messages"
        )
    turns = []
    for index, turn in enumerate(value):
        ok = isinstance(turn, dict) and set(turn) == {"role", "content"}
        if not ok or turn["role"] not in _ROLES or not isinstance(turn["content"], str):
            raise ValueError(
                f"messages[{index}] must be {{role, content}} with role one of {list(_ROLES)} "
                f"and content a string, got {turn!r}",
                f"parameters.messages[{index}]",
            )
        turns.append(Message(turn["role"], turn["content"]))
    return tuple(turns)


def _stops(value: Any) -> tuple[str, ...]:
    """``stop``: a string or a JSON list of up to 4 (a string parameter carries the list)."""
    if value is None:
        return ()
    if isinstance(value, str) and value.startswith("["):
        import json

        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            pass
    stops = [value] if isinstance(value, str) else value
    if (
        not isinstance(stops, list)
        or not 1 <= len(stops) <= 4
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise ValueError(
            "stop must be a non-empty string or a list of 1 to 4 of them", "parameters.stop"
        )
    return tuple(stops)


def _piece_row(piece: Piece) -> dict[str, np.ndarray[Any, Any]]:
    """One step: its text, its finish reason ("" until the last), the prompt's tokens (on
    the first step, else 0) and the tokens it adds."""
    return _row(piece.text, piece.finish_reason, piece.prompt_tokens, piece.tokens)


def _whole_row(pieces: list[Piece]) -> dict[str, np.ndarray[Any, Any]]:
    """A whole answer: its text, why it ended, the prompt's tokens and the tokens generated."""
    return _row(
        "".join(p.text for p in pieces),
        pieces[-1].finish_reason if pieces else None,
        sum(p.prompt_tokens for p in pieces),
        sum(p.tokens for p in pieces),
    )


def _row(
    text: str, reason: str | None, prompt: int, tokens: int
) -> dict[str, np.ndarray[Any, Any]]:
    return {
        "text_output": np.array([text.encode()], dtype=object),
        "finish_reason": np.array([(reason or "").encode()], dtype=object),
        "num_input_tokens": np.array([prompt], dtype=np.int32),
        "num_output_tokens": np.array([tokens], dtype=np.int32),
    }
