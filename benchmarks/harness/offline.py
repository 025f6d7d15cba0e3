"""The model alone, in a worker process (not a benchmark itself):
``benchmarks.engine.cpu_backends``' offline side, pinned to the servers' core. It answers
``load``, ``curve`` and ``padding`` command lines (``processes.Worker``), keeping the model
loaded in between, so its blocks interleave with the served runs.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from benchmarks.harness import backends as _backends
from benchmarks.harness import common as _bench

BATCHES = (1, 8, 32, 64)


class Offline:
    """The model alone in this process: its batching curve and, for minilm, padding."""

    def __init__(self) -> None:
        self.calls: dict[int, Callable[[], Any]] = {}
        self.counts: dict[int, int] = {}
        self.model: Any = None

    def load(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Load the model, size each batch size's block to ~target_s, answer the reference
        outputs the servers are checked against."""
        info = self._load_mlp(spec) if spec["model"] == "mlp" else self._load_minilm(spec)
        for b, call in self.calls.items():
            for _ in range(2):  # warm-up
                call()
            t0, k = time.perf_counter(), 0
            while k < 2 or time.perf_counter() - t0 < spec["target_s"] / 3:
                call()
                k += 1
            self.counts[b] = max(1, round(spec["target_s"] / ((time.perf_counter() - t0) / k)))
        return info

    def curve(self, spec: dict[str, Any]) -> dict[str, list[float]]:
        """Seconds per call of each batch size, ``blocks`` blocks each, sizes interleaved."""
        samples: dict[str, list[float]] = {str(b): [] for b in self.calls}
        sizes = list(self.calls)
        for blk in range(spec["blocks"]):
            for b in sizes[blk % len(sizes) :] + sizes[: blk % len(sizes)]:
                call, n = self.calls[b], self.counts[b]
                t0 = time.perf_counter()
                for _ in range(n):
                    call()
                samples[str(b)].append((time.perf_counter() - t0) / n)
        return samples

    def _load_mlp(self, spec: dict[str, Any]) -> dict[str, Any]:
        import numpy as np
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        session = ort.InferenceSession(spec["onnx"], options, providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(3)
        for b in BATCHES:
            x = rng.standard_normal((b, _backends.MLP_DIMS[0])).astype(np.float32)
            self.calls[b] = partial(session.run, None, {_backends.MLP_INPUT: x})
        rows = np.asarray(spec["check"], np.float32)
        ref = [session.run(None, {_backends.MLP_INPUT: row[None]})[0][0].tolist() for row in rows]
        return {"ref": ref, "runtime": f"onnxruntime {ort.__version__}, 1 thread"}

    def _load_minilm(self, spec: dict[str, Any]) -> dict[str, Any]:
        import torch

        from carpool.backends.minilm import minilm_model

        model = self.model = minilm_model(threads=1, device="cpu")
        texts = _backends.short_texts(max(BATCHES))
        batches = {b: self.tokens(texts[:b]) for b in BATCHES}
        for b, x in batches.items():
            self.calls[b] = partial(model.fn, x)
        short = batches[max(BATCHES)]["attention_mask"].sum(axis=1)
        return {
            "ref": [model.fn(self.tokens([t]))["EMBEDDING"][0].tolist() for t in spec["check"]],
            "runtime": f"torch {torch.__version__}, {torch.get_num_threads()} thread",
            "short_tokens": [int(short.min()), float(short.mean()), int(short.max())],
        }

    def tokens(self, texts: list[str]) -> dict[str, Any]:
        """minilm's own preprocess (tokenize, pad to the longest) for these texts."""
        import numpy as np

        rows = np.array([[t.encode()] for t in texts], object)
        return dict(self.model.preprocess({"TEXT": rows}))

    def padding(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Padding waste of batching a mixed-length set with and without length buckets, and
        the measured time of running the whole set through the model each way (alternating;
        each way's embeddings kept from its first pass)."""
        import numpy as np

        model = self.model
        if model is None:
            raise RuntimeError("padding needs minilm loaded first")
        from carpool import Padding

        # minilm's former length buckets (it now forms batches by length, without them)
        _bucket = Padding(inputs={"input_ids": 0}, buckets=_backends.BUCKETS).bucket
        texts = _backends.mixed_texts(spec["texts"], hi=spec["longest"])
        ids = [self.tokens([t])["input_ids"][0].tolist() for t in texts]
        lengths = [len(r) for r in ids]
        plans = {
            "no buckets": _backends.plan_batches(lengths, spec["batch"]),
            "buckets": _backends.plan_batches(lengths, spec["batch"], _bucket),
        }
        arrays = {
            way: [_backends.pad_batch([ids[i] for i in b]) for b in plan]
            for way, plan in plans.items()
        }
        width = int(model.output_specs[0].shape[0])
        embeddings = {way: np.zeros((len(texts), width), np.float32) for way in plans}
        times: dict[str, list[float]] = {way: [] for way in plans}
        ways = list(plans)
        for r in range(spec["repeats"]):
            for way in ways if r % 2 == 0 else ways[::-1]:
                t0 = time.perf_counter()
                outputs = [model.fn(arr)["EMBEDDING"] for arr in arrays[way]]
                times[way].append(time.perf_counter() - t0)
                for b, out in zip(plans[way], outputs, strict=True):
                    embeddings[way][b] = out
        return {
            "texts": len(texts),
            "lengths": [min(lengths), float(np.median(lengths)), max(lengths)],
            "real": sum(lengths),
            "buckets": list(_backends.BUCKETS),
            "batch": spec["batch"],
            "ways": {
                way: {
                    "batches": len(plan),
                    "padded": _backends.padded_tokens(lengths, plan),
                    "seconds": _bench.median(times[way]),
                    "runs": len(times[way]),
                }
                for way, plan in plans.items()
            },
            "max_diff": float(np.abs(embeddings["no buckets"] - embeddings["buckets"]).max()),
        }


def main() -> int:
    """Answer ``{"cmd": "load" | "curve" | "padding", ...}`` lines until stdin ends."""
    worker = Offline()
    return _bench.answer_commands(
        {"load": worker.load, "curve": worker.curve, "padding": worker.padding}
    )


if __name__ == "__main__":
    sys.exit(main())
