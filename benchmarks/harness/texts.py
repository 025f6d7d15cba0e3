"""``benchmarks.embeddings.peers``' texts (not a benchmark itself): deterministic English-looking
sentences from a fixed word list and a seed, nothing downloaded.

Two sets: **short** (5 to 15 words) and **long** (100 to 200 words). Every word of the list is
one WordPiece token in all-MiniLM-L6-v2's vocabulary (``_backends.WORDS``), so a text of n
words is n + 3 tokens with the full stop, [CLS] and [SEP]: short texts are 8-18 tokens, long
ones 103-203, under the model's 256-token limit (nothing is truncated). Imported by the
orchestrator and by the offline worker alike, so both see the very same texts. Pure Python.
"""

from __future__ import annotations

import random
from pathlib import Path

from benchmarks.harness import backends as _backends

# name -> (fewest words, most words, seed)
SETS: dict[str, tuple[int, int, int]] = {"short": (5, 15, 20), "long": (100, 200, 21)}
LABELS = {"short": "short texts (5-15 words)", "long": "long texts (100-200 words)"}


def texts(name: str, n: int) -> list[str]:
    """The first ``n`` texts of set ``name`` (``short`` or ``long``): each call gives the same
    list, and a longer list starts with a shorter one."""
    lo, hi, seed = SETS[name]
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(_backends.WORDS) for _ in range(rng.randint(lo, hi))]
        out.append(" ".join(words).capitalize() + ".")
    return out


def check_texts() -> list[str]:
    """The texts every server's embeddings are compared on: two of each set."""
    return texts("short", 2) + texts("long", 2)


def write(path: Path, lines: list[str]) -> Path:
    """One text per line: ``carpool bench --strings`` sends them in order, cycled."""
    path.write_text("".join(f"{t}\n" for t in lines))
    return path
