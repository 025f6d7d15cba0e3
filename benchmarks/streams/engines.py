"""SmolLM2's engines, a decode step at a time, in process: milliseconds a step and tokens/s at
1, 16 and 32 sequences for torch-fp32 (numpy's OpenBLAS products), the same with torch's own
products (MKL), int8 where its kernels run fast (x86 with AVX2, VNNI, arm) and llama.cpp;
OpenBLAS over MKL alternating, int8 over fp32 in the same run. docs/benchmarks/llm.md."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.nn import functional

from benchmarks.harness import Figures, common, run
from carpool.backends.generation import Prompt
from carpool.backends.smollm2.served import default_engine
from carpool.steps.model import StepModel

SEQUENCES = (1, 16, 32)


def parser() -> argparse.ArgumentParser:
    p = common.base_parser(__doc__, default_cpus="1", default_repeats=4)
    p.add_argument("--steps", type=int, default=None, help="steps timed per repeat (3)")
    return p


def prompts(count: int) -> list[Prompt]:
    """Chat prompts of ~40 tokens each, greedy, long enough never to end in the run."""
    return [
        Prompt(f"Tell me a long story about the number {i}.", max_tokens=512, temperature=0)
        for i in range(count)
    ]


def ready(engine: StepModel[Prompt, Any, Any], count: int) -> list[Any]:
    """``count`` sequences started and prefilled, so that every step is a decode step."""
    states = engine.start(prompts(count))
    for state in states:
        assert not isinstance(state, BaseException), state
    while owed := [s for s in states if engine.start_cost(s)]:
        engine.prefill(owed, [engine.start_cost(s) for s in owed])
    return states


def with_torch_products(engine: Any) -> Callable[[], None]:
    """Switch a torch-fp32 engine's products to ``torch.nn.functional.linear`` on [out, in]
    weights (the engine before it used numpy's BLAS); returns the switch back."""
    products, head = engine._linears, engine._head

    def torch_linear(product: Any) -> Callable[[torch.Tensor], torch.Tensor]:
        weight = torch.from_numpy(product._weight).t().contiguous()
        return lambda x: functional.linear(x, weight)

    engine._linears = [tuple(torch_linear(p) for p in layer) for layer in products]
    engine._head = torch_linear(head)

    def back() -> None:
        engine._linears, engine._head = products, head

    return back


def timed_steps(
    engine: StepModel[Prompt, Any, Any], states: Sequence[Any], steps: int
) -> list[float]:
    engine.step(states)  # warm
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step(states)
        times.append(time.perf_counter() - start)
    return times


def fp32_side_by_side(figures: Figures, count: int, repeats: int, steps: int) -> float:
    """OpenBLAS against MKL on the same sequences, alternating each repeat; their greedy
    tokens over the run compared too. OpenBLAS's median step, in seconds."""
    from carpool.backends.smollm2.torch_engine import SmolLM2Torch

    engine = SmolLM2Torch(threads=1)
    states = ready(engine, count)
    times: dict[str, list[float]] = {"openblas": [], "mkl": []}
    for _ in range(repeats):
        times["openblas"] += timed_steps(engine, states, steps)
        back = with_torch_products(engine)
        times["mkl"] += timed_steps(engine, states, steps)
        back()
    for name, seconds in times.items():
        report(figures, f"fp32_{name}", count, statistics.median(seconds))
    ratio = statistics.median(times["openblas"]) / statistics.median(times["mkl"])
    figures.add(f"fp32_openblas_over_mkl_{count}", ratio, "x")
    mine = [s.tokens for s in _generate(engine, ready(engine, count), 8)]
    back = with_torch_products(engine)
    theirs = [s.tokens for s in _generate(engine, ready(engine, count), 8)]
    back()
    figures.check(f"fp32_openblas_tokens_equal_mkl_{count}", mine == theirs)
    return statistics.median(times["openblas"])


def _generate(engine: StepModel[Prompt, Any, Any], states: list[Any], steps: int) -> list[Any]:
    for _ in range(steps):
        engine.step(states)
    return states


def other_engine(figures: Figures, name: str, count: int, repeats: int, steps: int) -> float:
    """The engine's median step, in seconds."""
    engine = make(name)
    states = ready(engine, count)
    seconds = statistics.median(
        t for _ in range(repeats) for t in timed_steps(engine, states, steps)
    )
    report(figures, name, count, seconds)
    for state in states:
        engine.free(state)
    return seconds


def make(name: str) -> StepModel[Prompt, Any, Any]:
    if name == "int8":
        from carpool.backends.smollm2.torch_engine import SmolLM2Torch

        return SmolLM2Torch(threads=1, int8=True)
    from carpool.backends.smollm2.llama_engine import SmolLM2Llama

    return SmolLM2Llama(max_sequences=max(SEQUENCES), n_threads=1)


def report(figures: Figures, name: str, count: int, seconds: float) -> None:
    figures.add(f"{name}_ms_per_step_{count}", seconds * 1000, "ms")
    figures.add(f"{name}_tokens_per_s_{count}", count / seconds, "tok/s")
    print(f"  {name} x{count}: {seconds * 1000:.1f} ms/step, {count / seconds:.1f} tok/s")


def measure(args: argparse.Namespace) -> Figures:
    cpus = common.pin(common.parse_cpus(args.cpus))
    torch.set_num_threads(1)
    repeats = args.repeats or (1 if args.quick else 4)
    steps = args.steps or (2 if args.quick else 3)
    counts = SEQUENCES[:2] if args.quick else SEQUENCES
    int8 = default_engine() == "torch"  # where int8's kernels are slow (no AVX2), left out
    common.header(
        "streams.engines",
        {"cpus": cpus, "sequences": counts, "repeats": repeats, "steps": steps, "int8": int8},
    )
    figures = Figures()
    for count in counts:
        fp32 = fp32_side_by_side(figures, count, repeats, steps)
        for name in ("int8", "llama") if int8 else ("llama",):
            seconds = other_engine(figures, name, count, repeats, steps)
            if name == "int8":
                figures.add(f"int8_over_fp32_{count}", seconds / fp32, "x")
    return figures


if __name__ == "__main__":
    raise SystemExit(run(measure, parser()))
