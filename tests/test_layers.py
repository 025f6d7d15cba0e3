"""The architecture as a test: every module sits in a layer and imports only from layers below
its own (or its own), and no function grows past what a reader holds in their head.

Adding a module means placing it in ``LAYERS``; an import that points upward fails here with
the two modules named, so the layering stays the one the README draws.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "carpool"

# Lowest first. A module may import modules of its own layer or of any layer before it.
LAYERS: list[tuple[str, ...]] = [
    # stdlib and numpy only
    ("errors", "datatypes", "envflags", "cost", "blocking", "pool", "transport"),
    ("stats", "collate", "queue", "padding"),  # pure data structures
    ("policy", "adaptive", "options"),  # when to dispatch: pure decisions
    (  # the engine
        "inflight",
        "worker",
        "request",
        "runners",
        "warmup",
        "scheduler",
        "batcher",
        "model",
        "decorator",
        "compat",
        "process_worker",
        "process_supervisor",
        "process_pool",
        "ray_workers",
    ),
    ("backends",),  # models: onnxruntime, torch, minilm, the demo
    ("loading",),  # targets, files, repositories, settings -> Models
    ("server",),  # the v2 HTTP server
    ("bench",),  # the load generator (a v2 client; runs models in process too)
    ("tour", "cli", "__main__"),  # commands
]
MAX_FUNCTION_LINES = 60


def _layer_of(module: str) -> int:
    """The layer of ``carpool.a.b``: by its first component below ``carpool``."""
    parts = module.split(".")
    assert parts[0] == "carpool"
    if len(parts) == 1:
        raise AssertionError("nothing inside carpool imports the front door 'carpool' itself")
    for index, names in enumerate(LAYERS):
        if parts[1] in names:
            return index
    raise AssertionError(f"module {module} has no layer: add it to LAYERS in {__file__}")


def _module_name(path: Path) -> str:
    relative = path.relative_to(SRC.parent).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(tree: ast.AST) -> list[tuple[int, str]]:
    """Every carpool module imported anywhere in the file (function-local imports too)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("carpool")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("carpool"):
            found.append((node.lineno, str(node.module)))
    return found


SOURCES = sorted(p for p in SRC.rglob("*.py") if p.name != "__init__.py" or p.parent != SRC)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: _module_name(p))
def test_imports_point_down_the_layers(path: Path) -> None:
    module = _module_name(path)
    own = _layer_of(module)
    upward = [
        f"{module} (layer {own}) imports {target} (layer {_layer_of(target)}) at line {line}"
        for line, target in _imports(ast.parse(path.read_text()))
        if _layer_of(target) > own
    ]
    assert not upward


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: _module_name(p))
def test_functions_stay_short(path: Path) -> None:
    long = [
        f"{node.name} at line {node.lineno}: {node.end_lineno - node.lineno + 1} lines"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"split these functions of {_module_name(path)}: {long}"


def test_every_layer_names_an_existing_module() -> None:
    present = {p.stem if p.suffix else p.name for p in SRC.iterdir() if p.name != "__pycache__"}
    for names in LAYERS:
        for name in names:
            assert name in present, f"LAYERS names {name}, which is not in src/carpool"
