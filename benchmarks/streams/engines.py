"""SmolLM2's engines, a decode step at a time, in process: milliseconds a step and tokens/s at
1, 16 and 32 sequences for torch-fp32 (numpy's OpenBLAS products), the same with torch's own
products (MKL), int8 where its kernels run fast (x86 with AVX2, VNNI, arm) and llama.cpp;
OpenBLAS over MKL alternating, int8 over fp32 in the same run; a lone chat's first token
by the default torch engine with prompt state reuse off and on; and int8 serving 16 chats
that end and join, a tick's prefill and step in one pass or apart. docs/benchmarks/llm.md."""

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
from carpool.steps.replica import StepReplica, Tick

SEQUENCES = (1, 16, 32)
CHURN_CHATS, CHURN_TOKENS = 16, 32  # the chat scenario's 16 conversations and answers
QUESTIONS = (  # unrelated chats: they share only the chat template's opening
    "Explain glaciers to a sailor.",
    "Write a poem about batteries that a child would enjoy.",
    "What is the tallest mountain in Africa?",
    "Give me three tips for sleeping better.",
    "Why is the sky blue?",
    "Describe a cat to someone who has never seen one.",
)


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


def ready(engine: StepModel[Prompt, Any, Any], asked: int | Sequence[Prompt]) -> list[Any]:
    """The prompts (or ``asked`` long ones) started and prefilled in the scheduler's parts, so
    that every step is a decode step."""
    states = engine.start(prompts(asked) if isinstance(asked, int) else asked)
    for state in states:
        assert not isinstance(state, BaseException), state
    while owed := [s for s in states if engine.start_cost(s)]:
        engine.prefill(
            owed, [min(engine.start_cost(s), engine.start_chunk or 1 << 30) for s in owed]
        )
    return list(states)


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


def first_tokens(figures: Figures, repeats: int) -> None:
    """A lone chat's time to its first token (start, prefill, first step) on the default
    torch engine, prompt state reuse off and on alternating (a fresh store, which one chat
    fills first), each chat new to the engine; the median over the repeats' chats."""
    from carpool.backends.smollm2.torch_engine import SmolLM2Torch

    engine = SmolLM2Torch(threads=1, int8=default_engine() == "torch")
    times: dict[str, list[float]] = {"no_reuse": [], "reuse": []}
    reused = 0
    for repeat in range(repeats + 1):  # the first repeat warms
        for kind in times:
            engine.reuse_prefixes(64 << 20 if kind == "reuse" else 0)
            for state in ready(engine, [Prompt("Hello.", max_tokens=1)]):  # the opening
                engine.free(state)
            for question in QUESTIONS:
                prompt = Prompt(f"{question} ({kind} {repeat})", max_tokens=1, temperature=0)
                start = time.perf_counter()
                [state] = ready(engine, [prompt])
                engine.step([state])
                if repeat:
                    times[kind].append(time.perf_counter() - start)
                    reused += state.reused
                engine.free(state)
    for kind, seconds in times.items():
        figures.add(f"first_token_ms_{kind}", statistics.median(seconds) * 1000, "ms")
    ratio = statistics.median(times["reuse"]) / statistics.median(times["no_reuse"])
    figures.add("first_token_reuse_over_no_reuse", ratio, "x")
    figures.add("first_token_reused_tokens", reused / len(times["reuse"]), "tokens")
    print(
        f"  first token: {statistics.median(times['reuse']) * 1000:.1f} ms with reuse, "
        f"{statistics.median(times['no_reuse']) * 1000:.1f} ms without ({ratio:.2f}x)"
    )


def churn(figures: Figures, repeats: int, ticks: int) -> None:
    """The chat scenario in process: 16 conversations in an int8 replica (prompt reuse on),
    ``CHURN_TOKENS`` tokens each, a new one joining as one ends; each tick fused (one weight
    pass for the prefill and the step) against apart (the prefill's pass, then the step's),
    alternating; tokens/s over ``ticks`` ticks after the joins spread; the texts compared."""
    from carpool.backends.smollm2.torch_engine import SmolLM2Torch

    class Apart(SmolLM2Torch):
        prefill_and_step = StepModel.prefill_and_step  # not overridden: the calls apart

    engines = {"fused": SmolLM2Torch(threads=1, int8=True), "apart": Apart(threads=1, int8=True)}
    rates: dict[str, list[float]] = {kind: [] for kind in engines}
    texts: dict[str, list[dict[int, str]]] = {kind: [] for kind in engines}
    for repeat in range(repeats):
        for kind in sorted(engines, reverse=bool(repeat % 2)):
            rate, said = _churn_run(engines[kind], repeat, ticks)
            rates[kind].append(rate)
            texts[kind].append(said)
    for kind, seen in rates.items():
        figures.add(f"int8_churn_tokens_per_s_{kind}", statistics.median(seen), "tok/s")
    ratio = statistics.median(rates["fused"]) / statistics.median(rates["apart"])
    figures.add("int8_churn_fused_over_apart", ratio, "x")
    figures.check("int8_churn_texts_equal", texts["fused"] == texts["apart"])
    print(
        f"  16 chats, joining as they end: {statistics.median(rates['fused']):.1f} tok/s "
        f"fused, {statistics.median(rates['apart']):.1f} apart ({ratio:.2f}x)"
    )


def _churn_run(
    engine: StepModel[Prompt, Any, Any], repeat: int, ticks: int
) -> tuple[float, dict[int, str]]:
    """Tokens/s over ``ticks`` ticks, after 2 x ``CHURN_TOKENS`` ticks of joins spreading
    (one a tick until 16 are aboard); each conversation's text."""
    replica = StepReplica(engine, 64 << 20)  # a fresh prefix store
    said: dict[int, str] = {}
    warm, made, start = 2 * CHURN_TOKENS, 0, 0.0
    for tick in range(warm + ticks):
        room = CHURN_CHATS - len(replica)
        joining = min(room, 1) if tick < CHURN_CHATS else room
        joins = []
        for sid in range(len(said), len(said) + joining):
            question = f"{QUESTIONS[sid % len(QUESTIONS)]} (chat {sid}, run {repeat})"
            joins.append((sid, Prompt(question, max_tokens=CHURN_TOKENS, temperature=0)))
            said[sid] = ""
        if tick == warm:
            start = time.perf_counter()
        report = replica(Tick(joins=joins))
        assert not report.failed, report.failed
        for sid, piece in report.outputs:
            said[sid] += piece.text
        made += len(report.outputs) if tick >= warm else 0
    seconds = time.perf_counter() - start
    replica.close()
    return made / seconds, said


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
    first_tokens(figures, repeats)
    if int8:
        churn(figures, repeats, 16 if args.quick else 64)
    return figures


if __name__ == "__main__":
    raise SystemExit(run(measure, parser()))
