"""What changed in a model repository between two looks."""

from __future__ import annotations

import os
from pathlib import Path

from carpool.server.lifecycle.watch import NOT_READ, Changes, fingerprint, fingerprints, settled

A = (("model.py", 10, 1, 1, "aa"),)
B = (("model.py", 10, 1, 2, "bb"),)


def test_a_new_folder_loads_once_it_looked_the_same_twice() -> None:
    assert settled({}, {}, {"m": A}) == Changes()  # first seen: may still be copied in
    assert settled({}, {"m": B}, {"m": A}) == Changes()  # still changing
    assert settled({}, {"m": A}, {"m": A}) == Changes(load=("m",))


def test_a_changed_folder_reloads_once_per_change() -> None:
    assert settled({"m": A}, {"m": A}, {"m": A}) == Changes()
    assert settled({"m": A}, {"m": A}, {"m": B}) == Changes()
    assert settled({"m": A}, {"m": B}, {"m": B}) == Changes(load=("m",))
    assert settled({"m": B}, {"m": B}, {"m": B}) == Changes()  # acted on: not again


def test_a_removed_folder_unloads_once_gone_from_two_looks() -> None:
    assert settled({"m": A}, {"m": A}, {}) == Changes()
    assert settled({"m": A}, {}, {}) == Changes(unload=("m",))
    assert settled({}, {}, {}) == Changes()


def test_a_folder_that_comes_back_unchanged_is_left_alone() -> None:
    assert settled({"m": A}, {}, {"m": A}) == Changes()


def test_fingerprint_sees_a_rewrite_within_the_same_tick_at_the_same_size(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    code = folder / "model.py"
    code.write_text("def model(x):\n    return x + 1\n")
    stat = code.stat()
    before = fingerprint(folder)
    code.write_text("def model(x):\n    return x + 2\n")
    os.utime(code, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the same size and mtime
    assert code.stat().st_mtime_ns == stat.st_mtime_ns
    assert fingerprint(folder) != before


def test_fingerprint_leaves_out_hidden_files_and_bytecode(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text("x = 1\n")
    before = fingerprint(folder)
    assert [entry[0] for entry in before] == [os.path.join("1", "model.py")]
    (folder / ".model.py.swp").write_text("editor")
    (folder / "1" / "__pycache__").mkdir()
    (folder / "1" / "__pycache__" / "model.pyc").write_bytes(b"\0")
    assert fingerprint(folder) == before
    assert fingerprints([folder]) == {"m": before}


def test_a_named_pipe_is_listed_but_never_opened(tmp_path: Path) -> None:
    """Opening a pipe blocks until something writes to it: the look would hang for ever."""
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.py").write_text("x = 1\n")
    os.mkfifo(folder / "weights.bin")
    files = {path: digest for path, *_, digest in fingerprint(folder)}
    assert files["weights.bin"] == NOT_READ
    assert files["model.py"] not in ("", NOT_READ)
