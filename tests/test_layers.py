"""The architecture as a test: where each module sits, how big anything may grow, and where a
status number may be written.

- Every module sits in a layer and imports only from layers below its own (or its own). An
  import inside a function counts like one at the top: a lazy import is still an arrow. Only
  imports under ``if TYPE_CHECKING:`` are exempt, since they never run.
- No import cycle among carpool's modules, whatever the layers say.
- No module over 500 lines, no class over 20 methods (dunders aside; what a class takes from
  carpool base classes and mixins counts), no function over 60 lines.
- No two public classes share a name, anywhere in carpool.
- HTTP status numbers (400-599) are written in the status table only
  (``carpool/server/statuses.py``); everything else names them through it.
- A module's docstring says what it is for in at most five lines, a package's in one; the
  history of the code is git's.

Adding a module means placing it in ``LAYERS``; an import that points upward fails here with
the two modules named, so the layering stays the one the README draws.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "carpool"

# Lowest first. A module may import modules of its own layer or of any layer before it. A
# name is a module or package path below ``carpool``; a module takes the layer of the longest
# name that contains it (``runners.threads`` before ``runners``).
LAYERS: list[tuple[str, ...]] = [
    ("errors", "datatypes", "envflags"),  # the words: stdlib and numpy only
    ("collation",),  # rows into batches and back: stacking, padding, tokens; pure
    ("policies",),  # when a batch leaves: pure decisions and cost models
    ("ipc",),  # between processes: shared-memory tensors, a parent's lifeline
    ("runners",),  # where replicas live: threads, child processes, Ray actors
    ("engine",),  # the batcher: queue, scheduler, requests, executor, options, stats
    ("steps",),  # step-wise models: sequences join and leave a batch at every step
    ("model", "decorator", "compat", "stepwise"),  # what builds batchers
    ("backends",),  # models: onnxruntime, torch, minilm, the demo
    ("loading",),  # targets, files, repositories, settings -> Models
    # the v2 HTTP and gRPC server: a request goes down these layers and comes back up once
    (
        "server.statuses",
        "server.failures",
        "server.messages",
        "server.tensors",
        "server.auth",
        "server.config",
    ),
    ("server.telemetry",),  # metrics, statistics, logs
    ("server.lifecycle",),  # the registry; loads, unloads, polls
    ("server.inference",),  # the one path: ready, admit, batch, cache, outcome
    ("server.openai",),  # OpenAI's bodies on that path
    ("server.rest", "server.grpc"),  # the front ends
    ("server.frontends",),  # --frontends N: front-end processes around one batcher
    ("server", "server.serve"),  # the process: bind, serve, drain
    ("bench",),  # the load generator (a v2 client; runs models in process too)
    ("tour", "cli", "__main__"),  # commands
]
MAX_MODULE_LINES = 500
MAX_CLASS_METHODS = 20
MAX_FUNCTION_LINES = 60
MAX_DOCSTRING_LINES = 5  # STYLE asks for two or three; a design's why goes on what it concerns
STATUS_TABLE = SRC / "server" / "statuses.py"


def _module_name(path: Path) -> str:
    relative = path.relative_to(SRC.parent).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


SOURCES = sorted(SRC.rglob("*.py"))
MODULES = {_module_name(p): p for p in SOURCES}
INNER = [p for p in SOURCES if p.parent != SRC or p.name != "__init__.py"]


def _layer_of(module: str) -> int:
    parts = module.split(".")
    assert parts[0] == "carpool"
    if len(parts) == 1:
        raise AssertionError("nothing inside carpool imports the front door 'carpool' itself")
    for end in range(len(parts), 1, -1):
        name = ".".join(parts[1:end])
        for index, names in enumerate(LAYERS):
            if name in names:
                return index
    raise AssertionError(f"module {module} has no layer: add it to LAYERS in {__file__}")


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node except what sits under ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in [child, *_runtime_nodes(child)])
            continue
        yield node
        yield from _runtime_nodes(node)


def _resolve(name: str) -> str:
    """The carpool module ``name`` names: itself, or the module that defines it."""
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every carpool module the file imports when it runs (function-local imports too)."""
    found = []
    for node in _runtime_nodes(_tree(path)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("carpool")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("carpool"):
            module = str(node.module)
            found += [(node.lineno, _resolve(f"{module}.{a.name}")) for a in node.names]
    return [(line, _resolve(target)) for line, target in found]


@pytest.mark.parametrize("path", INNER, ids=_module_name)
def test_imports_point_down_the_layers(path: Path) -> None:
    module = _module_name(path)
    own = _layer_of(module)
    upward = [
        f"{module} (layer {own}) imports {target} (layer {_layer_of(target)}) at line {line}"
        for line, target in _imports(path)
        if _layer_of(target) > own
    ]
    assert not upward


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def _graph() -> dict[str, set[str]]:
    return {
        module: {target for _, target in _imports(path) if target != module}
        for module, path in MODULES.items()
    }


def test_no_import_cycles() -> None:
    assert not _cycles(_graph()), "break these cycles: move the shared piece down a layer"


def test_the_cycle_finder_finds_a_cycle_closed_by_a_function_level_import() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    source = "def f():\n    import carpool.errors\nif TYPE_CHECKING:\n    import carpool.x\n"
    tree = ast.parse(source)
    imported = [n for n in _runtime_nodes(tree) if isinstance(n, ast.Import)]
    assert [a.name for n in imported for a in n.names] == ["carpool.errors"]


@pytest.mark.parametrize("path", SOURCES, ids=_module_name)
def test_modules_stay_small(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"split {_module_name(path)}: {lines} lines"


@pytest.mark.parametrize("path", SOURCES, ids=_module_name)
def test_functions_stay_short(path: Path) -> None:
    long = [
        f"{node.name} at line {node.lineno}: {node.end_lineno - node.lineno + 1} lines"
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"split these functions of {_module_name(path)}: {long}"


@pytest.mark.parametrize("path", SOURCES, ids=_module_name)
def test_module_docstrings_stay_short(path: Path) -> None:
    doc = ast.get_docstring(_tree(path))
    assert doc, f"{_module_name(path)} has no docstring: say what it is for"
    lines = len(doc.splitlines())
    if path.name == "__init__.py":
        assert lines == 1, f"the docstring of package {_module_name(path)} is one line"
    else:
        assert lines <= MAX_DOCSTRING_LINES, f"shorten {_module_name(path)}'s docstring: {lines}"


def _classes() -> dict[str, list[tuple[set[str], list[str]]]]:
    """Every carpool class by name: its own non-dunder methods and its bases' names."""
    found: dict[str, list[tuple[set[str], list[str]]]] = {}
    for path in SOURCES:
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ClassDef):
                methods = {
                    f.name
                    for f in node.body
                    if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                    and not (f.name.startswith("__") and f.name.endswith("__"))
                }
                bases = [ast.unparse(b).split("[")[0].rpartition(".")[2] for b in node.bases]
                found.setdefault(node.name, []).append((methods, bases))
    return found


def _methods(name: str, classes: dict[str, list[tuple[set[str], list[str]]]]) -> set[str]:
    """``name``'s methods with all it takes from carpool base classes (any of that name)."""
    methods: set[str] = set()
    for own, bases in classes.get(name, []):
        methods |= own
        for base in bases:
            if base != name:
                methods |= _methods(base, classes)
    return methods


def test_classes_stay_small() -> None:
    classes = _classes()
    large = {
        name: len(_methods(name, classes))
        for name in classes
        if len(_methods(name, classes)) > MAX_CLASS_METHODS
    }
    assert not large, f"split these classes (non-dunder methods, with their bases'): {large}"


def test_a_class_counts_the_methods_of_its_carpool_bases() -> None:
    classes = {"Mixin": [({"a", "b"}, [])], "Thing": [({"c"}, ["Mixin", "Protocol"])]}
    assert _methods("Thing", classes) == {"a", "b", "c"}


def _named_twice(trees: dict[str, ast.Module]) -> dict[str, list[str]]:
    """Public class names (not starting with ``_``) defined in more than one place, with
    the modules that define them (nested classes included)."""
    found: dict[str, list[str]] = {}
    for module, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                found.setdefault(node.name, []).append(module)
    return {name: modules for name, modules in found.items() if len(modules) > 1}


def test_no_two_public_classes_share_a_name() -> None:
    twice = _named_twice({_module_name(path): _tree(path) for path in SOURCES})
    assert not twice, f"rename one of each: a class name means one thing in carpool: {twice}"


def test_the_name_check_sees_a_class_defined_twice() -> None:
    trees = {
        "a": ast.parse("class Entry: ...\nclass _Private: ..."),
        "b": ast.parse("def f():\n    class Entry: ...\n    class _Private: ..."),
    }
    assert _named_twice(trees) == {"Entry": ["a", "b"]}


def _status_numbers(tree: ast.AST) -> list[int]:
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and type(node.value) is int and 400 <= node.value <= 599
    ]


@pytest.mark.parametrize("path", [p for p in SOURCES if p != STATUS_TABLE], ids=_module_name)
def test_status_numbers_only_in_the_status_table(path: Path) -> None:
    lines = _status_numbers(_tree(path))
    assert not lines, (
        f"{_module_name(path)} writes an HTTP status number at lines {lines}: name it in "
        "carpool/server/statuses.py and import the name"
    )


def test_the_status_check_sees_a_literal_status() -> None:
    assert _status_numbers(ast.parse("raise HTTPError(404, 'gone')\nx = 5000\n")) == [1]


def test_every_layer_names_an_existing_module() -> None:
    for names in LAYERS:
        for name in names:
            assert f"carpool.{name}" in MODULES, f"LAYERS names {name}, which is not in carpool"


IMPORT_EVERYTHING = """
import atexit, importlib, pkgutil, signal, sys, threading
import carpool

ran = []

def watch(owner, name):
    real = getattr(owner, name)
    def spy(*args, **kwargs):
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.startswith("carpool"):
            ran.append(f"{caller}: {name}")
        return real(*args, **kwargs)
    setattr(owner, name, spy)

watch(atexit, "register")
watch(signal, "signal")
watch(threading.Thread, "start")
for info in pkgutil.walk_packages(carpool.__path__, "carpool."):
    if info.name != "carpool.__main__":
        importlib.import_module(info.name)
print(sorted(set(ran)))
"""


def test_importing_any_module_runs_nothing() -> None:
    """No atexit handler, signal handler or thread at import: the objects that own a
    resource release it themselves."""
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_EVERYTHING], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


README = SRC.parent.parent / "README.md"


def _readme_layers() -> list[set[str]]:
    """The numbered list of the README's Development section, as ``LAYERS``' names."""
    section = README.read_text().partition("## Development")[2].partition("\n## ")[0]
    layers = []
    for item in re.findall(r"^\d+\. (.*)$", section, re.MULTILINE):
        tokens = re.findall(r"`([^`]+)`", item.partition(": ")[0])
        nested = tokens[0].endswith("/") and len(tokens) > 1 and not tokens[1].endswith("/")
        package, names = (tokens[0], tokens[1:]) if nested else ("", tokens)
        layers.append({(package + t).rstrip("/").replace("/", ".") for t in names})
    return layers


def test_the_readme_lists_the_layers_as_they_are() -> None:
    ours = [set(names) - {"server", "__main__"} for names in LAYERS]
    assert _readme_layers() == ours
