"""The catalog: every model a command line can serve, loaded again by name from disk."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from carpool.errors import ConfigError
from carpool.loading import Catalog

CODE = "def model(x):\n    return x + {}\n"


def write(folder: Path, offset: int = 1) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.py"
    path.write_text(CODE.format(offset))
    return path


def answer(catalog: Catalog, name: str) -> float:
    model = catalog.load(name)
    return float(np.asarray(model.fn(np.zeros((1, 1), np.float32)))[0, 0])


def test_a_folder_added_after_the_start_can_be_loaded(tmp_path: Path) -> None:
    write(tmp_path / "a")
    catalog = Catalog([str(tmp_path)])
    assert catalog.names() == ["a"]
    write(tmp_path / "b", 5)
    assert catalog.names() == ["a", "b"]
    assert answer(catalog, "b") == 5.0


def test_every_load_reads_the_model_file_again_never_a_stale_pyc(tmp_path: Path) -> None:
    path = write(tmp_path / "a", 1)
    catalog = Catalog([str(tmp_path)])
    assert answer(catalog, "a") == 1.0
    stat = path.stat()
    path.write_text(CODE.format(2))  # the same size, then the same mtime
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert answer(catalog, "a") == 2.0
    assert not (tmp_path / "a" / "__pycache__").exists()


def test_a_load_takes_its_overrides_over_every_other_setting(tmp_path: Path) -> None:
    write(tmp_path / "a")
    (tmp_path / "a" / "carpool.toml").write_text("max_batch_size = 4\nworkers = 2\n")
    catalog = Catalog(
        [str(tmp_path)], flags={"max_wait_ms": 2.0}, file_models={"a": {"max_batch_size": 6}}
    )
    model = catalog.load("a")
    assert (model.batching.max_batch_size, model.batching.workers) == (6, 2)
    assert model.batching.max_wait_ms == 2.0
    model = catalog.load("a", {"max_batch_size": 3, "max_wait_ms": 1.0})
    assert (model.batching.max_batch_size, model.batching.max_wait_ms) == (3, 1.0)


def test_load_failures_name_the_model_and_the_reason(tmp_path: Path) -> None:
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "model.py").write_text("raise RuntimeError('no weights')\n")
    write(tmp_path / "a")
    catalog = Catalog([str(tmp_path)])
    with pytest.raises(ConfigError, match="RuntimeError: no weights"):
        catalog.load("broken")
    with pytest.raises(ConfigError, match="no model named 'nope' in the model repository"):
        catalog.load("nope")
    with pytest.raises(ConfigError, match="'a': max_batch_size must be"):
        catalog.load("a", {"max_batch_size": -1})
    models, failures = catalog.load_all()
    assert [m.name for m in models] == ["a"]
    assert [(f.name, f.version) for f in failures] == [("broken", "1")]


def test_load_some_loads_the_named_folders_and_every_other_target(tmp_path: Path) -> None:
    write(tmp_path / "a")
    write(tmp_path / "b")
    catalog = Catalog([str(tmp_path), "demo"])
    assert [m.name for m in catalog.load_some(["b"])] == ["demo", "b"]
    assert catalog.names() == ["a", "b", "demo"]
    assert catalog.load("demo").name == "demo"  # a target's model, by its name
    with pytest.raises(ConfigError, match=r"--load-model 'c': no such model folder .*\['a', 'b'\]"):
        catalog.load_some(["c"])


def test_response_cache_is_turned_on_by_name(tmp_path: Path) -> None:
    write(tmp_path / "a")
    write(tmp_path / "b")
    catalog = Catalog([str(tmp_path)], response_cache=["b"])
    models, _ = catalog.load_all()
    assert {m.name: m.response_cache for m in models} == {"a": False, "b": True}
    catalog = Catalog([str(tmp_path)], file_models={"a": {"response_cache": True}})
    assert catalog.load("a").response_cache is True
    with pytest.raises(ConfigError, match=r"--response-cache names models \['c'\]"):
        Catalog([str(tmp_path)], response_cache=["c"]).load_all()
