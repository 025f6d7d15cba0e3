"""Models from files and folders (``carpool.loading.repository``): a repository's model
folders, a folder's model file, version and ``carpool.toml``, and backend options."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from carpool import Model
from carpool.errors import ConfigError
from carpool.loading import resolve_models
from carpool.loading.repository import (
    as_model,
    forget_module,
    load_folder,
    model_folders,
    module_name,
)


def test_unknown_backend_option_is_a_config_error(tmp_path: Path) -> None:
    from backends import onnx_graphs

    path = onnx_graphs.static(tmp_path / "fixed.onnx")
    with pytest.raises(ConfigError, match=r"^model file '.*fixed.onnx': .*'threads'"):
        resolve_models(
            [str(path)], name=None, flags={}, file_models={"fixed": {"onnx": {"threads": 1}}}
        )


MODEL_PY = "def model(batch):\n    return batch * {factor}\n"


def folder(root: Path, name: str, files: dict[str, str]) -> Path:
    """A model folder: ``files`` by path relative to it (version folders included)."""
    for relative, text in files.items():
        path = root / name / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / name


def test_model_folders_are_sorted_and_skip_hidden_ones(tmp_path: Path) -> None:
    for name in ("b", "a", ".git", "_cache"):
        (tmp_path / name).mkdir()
    (tmp_path / "notes.txt").write_text("")
    assert [p.name for p in model_folders(tmp_path)] == ["a", "b"]


def test_a_folder_serves_its_highest_version_under_its_own_name(tmp_path: Path) -> None:
    where = folder(
        tmp_path,
        "doubler_v",
        {
            "2/model.py": MODEL_PY.format(factor=2),
            "10/model.py": MODEL_PY.format(factor=10),
            "carpool.toml": "max_batch_size = 4\n",
        },
    )
    model, own = load_folder(where, {})
    assert (model.name, model.version, model.fn(3)) == ("doubler_v", "10", 30)
    assert own == {"max_batch_size": 4}


def test_a_folder_without_versions_and_a_named_file(tmp_path: Path) -> None:
    where = folder(
        tmp_path,
        "named_file",
        {
            "a.py": MODEL_PY.format(factor=2),
            "b.py": "def predict(batch):\n    return -batch\n",
            "carpool.toml": 'file = "b.py"\ntarget = "predict"\n',
        },
    )
    model, _ = load_folder(where, {})
    assert (model.name, model.version, model.fn(3)) == ("named_file", "1", -3)


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"README": ""}, r"^no model file in .*: add a \.onnx, \.pt or model\.py file"),
        ({"a.py": "", "b.py": ""}, r"^several model files \['a\.py', 'b\.py'\]; choose one"),
        ({"carpool.toml": 'file = "x.onnx"\n'}, r"^file = 'x\.onnx' is not a file in "),
        ({"carpool.toml": "max_batch_size = \n"}, r"^carpool\.toml is not valid TOML: "),
        ({"model.py": "x = 1\n"}, r"^model\.py has no attribute 'model'; define it"),
        ({"model.py": "model = 3\n"}, r"^model\.py:model is a int; it must be a batched"),
        ({"model.py": "import carpool_nowhere\n"}, r"^importing model\.py failed: Module"),
        ({"model.py": "raise SystemExit(3)\n"}, r"^importing model\.py failed: SystemExit: 3$"),
        (
            {"model.py": "raise KeyboardInterrupt\n"},
            r"^importing model\.py failed: KeyboardInterrupt$",
        ),
        (
            {"model.py": "raise GeneratorExit('gone')\n"},
            r"^importing model\.py failed: GeneratorExit: gone$",
        ),
        (
            {"model.py": "class Stop(BaseException): ...\nraise Stop\n"},
            r"^importing model\.py failed: Stop$",
        ),
        ({"m.bin": "", "carpool.toml": 'file = "m.bin"\n'}, r"^m\.bin: no backend for '\.bin'"),
    ],
)
def test_a_broken_folder_says_what_to_fix(
    tmp_path: Path, files: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_folder(folder(tmp_path, "broken", files), {})


def test_a_model_that_exits_at_import_leaves_no_module_behind(tmp_path: Path) -> None:
    """SystemExit raised by a model.py is its failed load: a ConfigError carrying it, and
    the half-run module is forgotten, as for any other error."""
    with pytest.raises(ConfigError) as info:
        load_folder(folder(tmp_path, "quits", {"model.py": "import sys\nsys.exit(3)\n"}), {})
    assert isinstance(info.value.__cause__, SystemExit)
    assert info.value.__cause__.code == 3
    assert module_name("quits") not in sys.modules


def test_a_real_interrupt_while_a_model_imports_still_interrupts(tmp_path: Path) -> None:
    """Ctrl-C during a load at start reaches the caller as KeyboardInterrupt, not as the
    model's failed load: the model's code runs in a thread of its own, and the signal
    interrupts the main thread, which only waits for it."""
    body = "import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(2)\n"
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            load_folder(folder(tmp_path, "ctrl_c", {"model.py": body}), {})
    finally:
        signal.signal(signal.SIGINT, previous)
        forget_module("ctrl_c")


def test_as_model_names_what_it_wraps() -> None:
    unnamed = Model(lambda batch: batch)
    assert as_model(unnamed, name="given", where="w").name == "given"
    named = Model(lambda batch: batch, name="own")
    assert as_model(named, name="given", where="w") is named
    assert as_model(abs, name="absolute", where="w").name == "absolute"
