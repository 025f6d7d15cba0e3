"""The conversations of ``benchmarks.streams.chat``: distinct user questions (deterministic,
thousands of them, so no cell repeats another's prompt), alone or after one fixed system
prompt of about 300 tokens; written as carpool bench's and aiperf's input files."""

from __future__ import annotations

import json
import random
from pathlib import Path

SETS = ("unrelated", "shared")
PER_CELL = 400  # distinct questions a cell cycles through: more than any cell sends
WARMUP = "Write a short story about a small robot who learns to paint the night sky."

# ~300 SmolLM2 tokens (counted with the GGUF's tokenizer: docs/benchmarks/chat.md).
SYSTEM = (
    "You are Atlas, the support assistant of Northwind Outfitters, a company that sells "
    "hiking, climbing and camping equipment online and in twelve stores across the country. "
    "Answer every question in plain, friendly English, in short paragraphs, without lists "
    "unless the customer asks for one. Never invent order numbers, prices, stock levels or "
    "delivery dates: when you do not know, say so and offer to connect the customer with a "
    "person. Our return policy: unused items may be returned within sixty days with the "
    "receipt, used items within thirty days if they are defective; sale items are final. "
    "Shipping is free above fifty dollars and takes three to five working days; express "
    "shipping costs twelve dollars and takes one to two working days. Members of the "
    "Northwind Club earn one point per dollar spent and get a ten dollar voucher for every "
    "two hundred points. Repairs of tents, jackets and backpacks are free for the first year "
    "and take about two weeks. When a customer asks about safety in the mountains, remind "
    "them to check the weather forecast, tell someone where they are going, carry water, a "
    "map and a headlamp, and turn back when conditions get worse. When a customer is upset, "
    "apologise once, stay calm, and focus on what can be done next. Keep answers under one "
    "hundred words unless the customer asks for more detail, and end each answer by asking "
    "whether there is anything else you can help with today."
)

_TOPICS = (
    "photosynthesis", "the water cycle", "black holes", "compound interest", "volcanoes",
    "the immune system", "machine learning", "plate tectonics", "the French Revolution",
    "electric cars", "honey bees", "the stock market", "rainbows", "vaccines", "the moon",
    "recycling", "ocean tides", "the internet", "earthquakes", "coffee roasting",
    "the printing press", "solar panels", "glaciers", "chess openings", "bread baking",
    "the Roman Empire", "jazz music", "coral reefs", "airplanes", "the human heart",
    "democracy", "bird migration", "batteries", "the Great Wall of China", "tornadoes",
    "mushrooms", "the Olympic Games", "sleep", "public transport", "the periodic table",
    "wind turbines", "dinosaurs", "the violin", "deserts", "cheese making", "satellites",
    "rain forests", "the alphabet", "bicycles", "lighthouses",
)  # fmt: skip
_ASKS = (
    "Explain {t} to {a}.", "Write a short story about {t} for {a}.",
    "Describe how {t} works, as you would to {a}.", "Tell {a} three facts about {t}.",
    "Write a poem about {t} that {a} would enjoy.", "Why does {t} matter? Answer for {a}.",
    "Give {a} a short history of {t}.", "What would surprise {a} about {t}?",
    "Compare {t} with something familiar to {a}.", "Write a short lesson on {t} for {a}.",
)  # fmt: skip
_AUDIENCES = (
    "a child", "a teenager", "a farmer", "a sailor", "a nurse", "a painter",
    "a retired teacher", "a visitor from another planet", "a busy manager", "a grandmother",
)  # fmt: skip


def questions() -> list[str]:
    """Every distinct question (5000), in a fixed shuffled order."""
    every = [ask.format(t=t, a=a) for t in _TOPICS for ask in _ASKS for a in _AUDIENCES]
    random.Random(34).shuffle(every)
    return every


def conversation(prompt_set: str, question: str) -> list[dict[str, str]]:
    """One conversation's messages: the question, after the shared system prompt or not."""
    user = {"role": "user", "content": question}
    if prompt_set == "shared":
        return [{"role": "system", "content": SYSTEM}, user]
    if prompt_set == "unrelated":
        return [user]
    raise ValueError(f"unknown prompt set {prompt_set!r}: one of {SETS}")


def cell_questions(cell: int) -> list[str]:
    """The ``cell``-th slice of :func:`questions` (cells of a run never share one)."""
    every = questions()
    start = (cell * PER_CELL) % len(every)
    return (every + every)[start : start + PER_CELL]


def write_bench(path: Path, prompt_set: str, cell: int) -> Path:
    """``carpool bench --input-data``'s file: a ``{"messages": [...]}`` per line."""
    lines = [json.dumps({"messages": conversation(prompt_set, q)}) for q in cell_questions(cell)]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_aiperf(folder: Path, prompt_set: str, cell: int) -> tuple[Path, Path | None]:
    """aiperf's ``single_turn`` file (a ``{"text": question}`` per line) and, for the shared
    set, the system prompt's file (its ``--system-prompt-file``)."""
    inputs = folder / "turns.jsonl"
    inputs.write_text("\n".join(json.dumps({"text": q}) for q in cell_questions(cell)) + "\n")
    conversation(prompt_set, "")  # an unknown set is refused here too
    if prompt_set != "shared":
        return inputs, None
    system = folder / "system.txt"
    system.write_text(SYSTEM)
    return inputs, system
