"""The docs tell the truth: their tables against the code, the README's example run as
written, and every relative link resolved. Each test fails when the docs drift."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
import shlex
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import carpool
from carpool.backends.demo import demo_model
from carpool.bench.report.data import Report
from carpool.cli import build_parser
from carpool.loading.settings import LOAD_KEYS
from carpool.server.config import ServerConfig

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
LIBRARY = ROOT / "docs" / "library.md"
SERVER = ROOT / "docs" / "server.md"
BENCH = ROOT / "docs" / "bench.md"
DEMO_WAITS = (0, 2, 5, 10)  # max_wait_ms of the demo curve's reports (docs/bench/)
REQUIRED = "(required)"  # how a table writes a parameter without a default
NONE_CELL = "—"  # how a table writes "no such thing" (no env var, no default)
# Keys a [models.NAME] table takes besides Batching's fields (carpool.loading.settings).
MODEL_TABLE_KEYS = frozenset({"inputs", "outputs", "version", "padding", "openai"}) | LOAD_KEYS

RUN_SERVER = "python3 -m pip install -e '.[server]' && carpool serve"
RUN_TESTS = "python3 -m pip install -e '.[test]' && python3 -m pytest"


# ----------------------------------------------------------------- markdown helpers


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _without_code(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.DOTALL | re.MULTILINE)


def _section(text: str, heading: str) -> str:
    """From the heading line ``heading`` to the next heading of the same or a higher level."""
    match = re.search(rf"^(#+) {re.escape(heading)}\s*$", text, flags=re.MULTILINE)
    assert match is not None, f"no heading {heading!r}"
    level = len(match.group(1))
    rest = text[match.end() :]
    end = re.search(rf"^#{{1,{level}}} ", rest, flags=re.MULTILINE)
    return rest if end is None else rest[: end.start()]


def _cells(line: str) -> list[str]:
    parts = re.split(r"(?<!\\)\|", line.strip())[1:-1]
    return [part.strip().replace("\\|", "|") for part in parts]


def _table(text: str, *header: str) -> list[list[str]]:
    """The rows of the first table in ``text`` whose header row is ``header``."""
    lines = text.splitlines()
    for i, line in enumerate(lines[:-1]):
        if line.startswith("|") and _cells(line) == list(header):
            rows = []
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                rows.append(_cells(row))
            return rows
    raise AssertionError(f"no table with header {header}")


def _code(cell: str) -> str:
    """The cell's text without the backticks of a single code span."""
    match = re.fullmatch(r"`([^`]*)`", cell)
    return match.group(1) if match else cell


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)


# ----------------------------------------------------------------- tables against the code


def _check_defaults(rows: list[list[str]], defaults: dict[str, Any], what: str) -> None:
    """A table's first two columns are a name and its default as a Python literal (or
    ``(required)``): the same names in the same order as ``defaults``, the same values."""
    assert [_code(row[0]) for row in rows] == list(defaults), f"{what}: names or order"
    for row in rows:
        name, cell = _code(row[0]), row[1]
        expected = defaults[name]
        if expected is inspect.Parameter.empty:
            assert cell == REQUIRED, f"{what}: {name} has no default; the table says {cell}"
            continue
        written = ast.literal_eval(_code(cell))
        assert (type(written), written) == (type(expected), expected), (
            f"{what}: {name} defaults to {expected!r}; the table says {cell}"
        )


def _signature_defaults(fn: Any) -> dict[str, Any]:
    params = inspect.signature(fn).parameters.values()
    return {p.name: p.default for p in params if p.name != "self"}


def _field_defaults(cls: type) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if field.default is not dataclasses.MISSING:
            out[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            out[field.name] = field.default_factory()
        else:
            out[field.name] = inspect.Parameter.empty
    return out


def test_batcher_options_table_matches_the_signature() -> None:
    rows = _table(_section(_text(LIBRARY), "Options"), "option", "default", "meaning")
    _check_defaults(rows, _signature_defaults(carpool.Batcher.__init__), "Batcher options")


def test_padding_table_matches_the_dataclass() -> None:
    rows = _table(_section(_text(LIBRARY), "Padding"), "field", "default", "meaning")
    _check_defaults(rows, _field_defaults(carpool.Padding), "Padding")


def test_stats_table_lists_every_field() -> None:
    rows = _table(_section(_text(LIBRARY), "Stats"), "field", "meaning")
    properties = [n for n, v in vars(carpool.BatcherStats).items() if isinstance(v, property)]
    fields = [f.name for f in dataclasses.fields(carpool.BatcherStats)]
    assert [_code(row[0]) for row in rows] == fields + properties


def test_queue_view_table_lists_every_field() -> None:
    rows = _table(_section(_text(LIBRARY), "Writing a policy"), "field", "meaning")
    fields = [f.name for f in dataclasses.fields(carpool.QueueView)]
    assert [_code(row[0]) for row in rows] == fields


def test_model_table_keys_match_batching_and_the_settings() -> None:
    rows = _table(_section(_text(SERVER), "Config file"), "key", "default", "meaning")
    single = [row for row in rows if "," not in row[0] and _code(row[0]) not in MODEL_TABLE_KEYS]
    _check_defaults(single, _field_defaults(carpool.Batching), "[models.NAME] batching keys")
    others = {name.strip(" `") for row in rows if row not in single for name in row[0].split(",")}
    assert others == MODEL_TABLE_KEYS


def test_server_table_keys_match_the_server_config() -> None:
    line = next(p for p in _text(SERVER).split("\n\n") if p.startswith("`[server]` keys:"))
    documented = re.findall(r"`(\w+)`", line.partition(":")[2].partition("(")[0])
    settings = [f.name for f in dataclasses.fields(ServerConfig)]
    internal = ("models", "unavailable", "catalog")  # what the command line loads, not keys
    assert documented == [name for name in settings if name not in internal]


def test_every_public_name_is_documented() -> None:
    text = _text(LIBRARY) + _text(SERVER)
    spans = re.findall(r"`([^`\n]+)`", text) + re.findall(r"^```.*?^```", text, re.S | re.M)
    missing = [
        name
        for name in carpool.__all__
        if not any(re.search(rf"(?<!\w){name}(?!\w)", span) for span in spans)
    ]
    assert missing == []


# ----------------------------------------------------------------- carpool serve's flags


def _serve_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    serve: argparse.ArgumentParser = commands.choices["serve"]
    return serve


def test_serve_flags_table_matches_the_parser() -> None:
    actions = {
        option: action
        for action in _serve_parser()._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    }
    rows = _table(_section(_text(SERVER), "Flags"), "flag", "env", "default", "meaning")
    assert sorted(_code(row[0]) for row in rows) == sorted(actions)
    for flag, env, default, _ in rows:
        help_text = actions[_code(flag)].help or ""
        env_var = re.search(r"\(env (\w+)", help_text)
        assert _code(env) == (env_var.group(1) if env_var else NONE_CELL), flag
        # the default --help states: "[32]" at the end, before "(env ...)"
        shown = re.search(r"\[([^\]]+)\](?: \(env \w+\))?$", help_text)
        if shown is not None:
            assert _code(default) == shown.group(1), flag


# ----------------------------------------------------------------- the README


def test_readme_states_the_commands_ci_runs() -> None:
    text = _text(README)
    assert f"```bash\n{RUN_SERVER}\n```" in text
    assert f"```bash\n{RUN_TESTS}\n```" in text
    assert RUN_TESTS in _text(ROOT / ".ci" / "run")
    assert 'python3 -m pytest -m "not slow"' in text


def test_readme_install_matches_pyproject() -> None:
    project = tomllib.loads(_text(ROOT / "pyproject.toml"))["project"]
    text = _text(README)
    rows = _table(_section(text, "Install"), "extra", "adds", "for")
    assert [_code(row[0]) for row in rows] == list(project["optional-dependencies"])
    assert f"Python {project['requires-python'].replace('>=', '>= ')}" in text


def test_readme_library_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    (code,) = _python_blocks(_section(_text(README), "As a library"))
    exec(compile(code, str(README), "exec"), {"__name__": "readme_example"})
    assert "model calls for 100 requests" in capsys.readouterr().out


def test_readme_client_example_speaks_the_demo_models_signature() -> None:
    (code,) = _python_blocks(_section(_text(README), "As a client of `carpool serve`"))
    compile(code, str(README), "exec")
    model = demo_model()
    (given,), (wanted,) = model.input_specs, model.output_specs
    assert f'.infer("{model.name}", ' in code
    assert f'InferInput("{given.name}", [1, {given.shape[0]}], "{given.datatype}")' in code
    assert f'.as_numpy("{wanted.name}")' in code


def test_readme_shows_batching_with_the_load_that_makes_it() -> None:
    """One request is one batch: the stats show batching after concurrent requests, which
    the README makes with a ``carpool bench`` command the CLI takes, at the served demo."""
    section = _section(_text(README), "As a client of `carpool serve`")
    blocks = re.findall(r"^```bash\n(.*?)^```", section, flags=re.DOTALL | re.MULTILINE)
    (command,) = [line for block in blocks for line in block.splitlines()]
    args = build_parser().parse_args(shlex.split(command)[1:])
    assert (args.command, args.target) == ("bench", "http://127.0.0.1:8000/v2/models/demo")
    assert min(args.concurrency) > 1
    assert "`inference_count` 1 and\n`execution_count` 1" in section  # the one request's


# ----------------------------------------------------------------- docs/bench.md


def test_bench_demo_table_is_its_reports_measured_as_the_page_says() -> None:
    """The demo curve's table is the reports beside it, run with the steps the page names,
    and the page's other claims about the demo model's throughput quote that table."""
    text = _text(BENCH)
    section = _section(text, "The demo model's curve, by batching window")
    words = " ".join(section.split())
    rows = _table(section, "clients", *(f"wait {w} ms" for w in DEMO_WAITS))
    best = 0
    for column, wait in enumerate(DEMO_WAITS, start=1):
        report = Report.load(ROOT / "docs" / "bench" / f"demo-wait-{wait}ms.json")
        steps = report.settings["warmup_s"], report.settings["duration_s"]
        assert "--warmup {:g} --duration {:g}".format(*steps) in words
        assert [row[0] for row in rows] == [f"{step.load.value:g}" for step in report.steps]
        for row, step in zip(rows, report.steps, strict=True):
            assert row[column].startswith(f"{step.throughput_rps:,.0f}, "), (wait, row[0])
            best = max(best, round(step.throughput_rps))
    assert f"{best:,} req/s" in _without_code(text).replace("\n", " ")  # the peak it quotes


# ----------------------------------------------------------------- links


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    headings = re.findall(r"^#+ (.+)$", _without_code(_text(path)), flags=re.MULTILINE)
    return {_slug(h) for h in headings}


def _doc_files() -> Iterator[Path]:
    yield README
    yield from sorted((ROOT / "docs").glob("*.md"))
    yield from sorted((ROOT / "examples").glob("*/README.md"))


@pytest.mark.parametrize("doc", list(_doc_files()), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path) -> None:
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _without_code(_text(doc))):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        linked = (doc.parent / path).resolve() if path else doc
        if not linked.exists() or (
            anchor and linked.suffix == ".md" and anchor not in _anchors(linked)
        ):
            broken.append(target)
    assert broken == []
