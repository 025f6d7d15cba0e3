"""Models from targets (``carpool.loading.targets``): ``module:attr``, model files, built-ins
and repositories, with flags, the config file and the model's own settings in their order of
precedence; and the TOML config file itself."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from carpool import Batching, Model, Tensor
from carpool.errors import ConfigError
from carpool.loading import load_target, read_config_file, resolve_models
from loading.conftest import declared_model

# ---------------------------------------------------------------- load_target


def test_demo_target() -> None:
    model = load_target("demo")
    assert (model.name, model.platform) == ("demo", "carpool_numpy")
    assert [(t.name, t.datatype, t.shape) for t in model.input_specs] == [
        ("INPUT0", "FP32", (256,))
    ]


@pytest.mark.usefixtures("test_models")
def test_a_function_becomes_an_undeclared_model_named_after_it() -> None:
    import models

    model = load_target("models:add_one")
    assert model.fn is models.add_one
    assert model.name == "add_one"
    assert not model.declared
    assert model.batching == Batching()


@pytest.mark.usefixtures("test_models")
def test_a_model_object_is_served_as_declared() -> None:
    import models

    model = load_target("models:pair")
    assert model == models.pair  # as declared; only the recipe (not compared) is added
    assert model.fn is models.pair.fn
    assert model.recipe is not None
    assert model.recipe().fn is models.pair.fn  # how a worker process loads it again


@pytest.mark.usefixtures("test_models")
def test_name_overrides_the_model_name() -> None:
    assert load_target("models:add_one", name="plus").name == "plus"
    renamed = load_target("models:pair", name="pair2")
    assert (renamed.name, renamed.inputs) == ("pair2", load_target("models:pair").inputs)


def test_an_unnamed_model_takes_the_attribute_name(module: Callable[[str], str]) -> None:
    name = module("from carpool import Model\nbert = Model(lambda b: b)\n")
    assert load_target(f"{name}:bert").name == "bert"


def test_dotted_attributes(module: Callable[[str], str]) -> None:
    name = module("class Zoo:\n    @staticmethod\n    def predict(batch):\n        return batch\n")
    model = load_target(f"{name}:Zoo.predict")
    assert model.name == "predict"
    assert model.fn(3) == 3


@pytest.mark.parametrize("target", ["models", "models:", ":add_one", ""])
def test_target_without_module_and_attr(target: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_target(target)
    assert str(info.value) == (
        f"target {target!r} must look like 'module:attr' (as with uvicorn), "
        "e.g. 'mypkg.models:predict', a model file (.onnx, .pt), a model repository "
        "folder, or one of ['demo', 'minilm', 'smollm2']"
    )
    assert isinstance(info.value, ValueError)


def test_module_that_does_not_exist() -> None:
    with pytest.raises(ConfigError) as info:
        load_target("carpool_no_such_module:f")
    assert str(info.value) == (
        "cannot import module 'carpool_no_such_module' of target 'carpool_no_such_module:f': "
        "No module named 'carpool_no_such_module'"
    )


def test_module_whose_own_import_fails(module: Callable[[str], str]) -> None:
    name = module("import carpool_missing_dependency\n")
    with pytest.raises(ConfigError, match=f"cannot import module '{name}'.*carpool_missing_dep"):
        load_target(f"{name}:f")


@pytest.mark.parametrize(
    ("source", "raised"),
    [
        ("import sys\nsys.exit(3)\n", "SystemExit: 3"),
        ("raise KeyboardInterrupt\n", "KeyboardInterrupt"),
    ],
)
def test_module_that_exits_at_import(
    module: Callable[[str], str], source: str, raised: str
) -> None:
    """A target's module that exits is a target that cannot be used (``carpool serve``
    exits 2 naming it), never an exit with the module's code."""
    name = module(source)
    with pytest.raises(ConfigError) as info:
        load_target(f"{name}:f")
    assert str(info.value) == f"cannot import module '{name}' of target '{name}:f': {raised}"


def test_module_whose_import_raises_keeps_its_error(module: Callable[[str], str]) -> None:
    name = module("raise RuntimeError('no weights')\n")
    with pytest.raises(RuntimeError, match=r"^no weights$"):
        load_target(f"{name}:f")


@pytest.mark.usefixtures("test_models")
def test_missing_attribute() -> None:
    with pytest.raises(ConfigError) as info:
        load_target("models:nope")
    assert str(info.value) == "module 'models' has no attribute 'nope' (target 'models:nope')"


@pytest.mark.usefixtures("test_models")
def test_attribute_that_is_not_a_model() -> None:
    with pytest.raises(ConfigError) as info:
        load_target("models:NEGATIVE")
    assert str(info.value) == (
        "target 'models:NEGATIVE' is a str; it must be a batched function, a torch.nn.Module "
        "or a carpool.Model"
    )


# ---------------------------------------------------------------- precedence


def test_flags_over_file_over_model_over_defaults(module: Callable[[str], str]) -> None:
    target = declared_model(module)
    (model,), _ = resolve_models(
        [target],
        name=None,
        flags={"max_batch_size": 4},
        file_models={"net": {"max_batch_size": 8, "workers": 2}},
    )
    assert model.batching == Batching(
        max_batch_size=4,  # flag
        workers=2,  # file
        max_wait_ms=2.0,  # the Model
        policy="eager",  # default
    )


def test_file_over_model(module: Callable[[str], str]) -> None:
    (model,), _ = resolve_models(
        [declared_model(module)],
        name=None,
        flags={},
        file_models={"net": {"max_batch_size": 8, "default_timeout_ms": 50.0}},
    )
    assert (model.batching.max_batch_size, model.batching.workers) == (8, 3)
    assert model.batching.default_timeout_ms == 50.0


def test_file_tables_follow_the_name_option(module: Callable[[str], str]) -> None:
    (model,), _ = resolve_models(
        [declared_model(module)],
        name="renamed",
        flags={},
        file_models={"renamed": {"max_batch_size": 2}},
    )
    assert (model.name, model.batching.max_batch_size) == ("renamed", 2)


def test_no_target_serves_the_demo() -> None:
    (model,), _ = resolve_models([], name=None, flags={"workers": 2}, file_models={})
    assert (model.name, model.batching.workers) == ("demo", 2)


def test_runner_settings_come_from_flags_and_config_tables() -> None:
    (model,), _ = resolve_models(
        ["demo"],
        name=None,
        flags={"runner": "process"},
        file_models={"demo": {"batch_timeout_ms": 2000, "retry": False}},
    )
    batching = model.batching
    assert (batching.runner, batching.batch_timeout_ms, batching.retry) == ("process", 2000, False)
    assert model.batcher().runner == "process"  # constructed: no process starts until entered


def test_name_needs_a_single_target() -> None:
    with pytest.raises(ConfigError) as info:
        resolve_models(["demo", "demo"], name="x", flags={}, file_models={})
    assert str(info.value) == (
        "--name applies to a single model; a repository names models after their folders"
    )


def test_file_settings_for_a_model_not_served() -> None:
    with pytest.raises(ConfigError) as info:
        resolve_models(["demo"], name=None, flags={}, file_models={"other": {"workers": 2}})
    assert str(info.value) == (
        "config file has settings for models ['other'] that are not served; serving ['demo']"
    )


def test_resolve_models_keeps_model_objects_apart(module: Callable[[str], str]) -> None:
    target = declared_model(module)
    (first,), _ = resolve_models([target], name=None, flags={"workers": 1}, file_models={})
    (second,), _ = resolve_models([target], name=None, flags={}, file_models={})
    assert (first.batching.workers, second.batching.workers) == (1, 3)
    assert isinstance(first, Model)


# ---------------------------------------------------------------- the TOML file


def test_config_file(tmp_path: Path) -> None:
    path = tmp_path / "carpool.toml"
    path.write_text(
        '[server]\nport = 9000\nhost = "0.0.0.0"\n\n'
        "[models.demo]\nmax_batch_size = 4\nmax_wait_ms = 1.5\n"
    )
    assert read_config_file(path) == {
        "server": {"port": 9000, "host": "0.0.0.0"},
        "models": {"demo": {"max_batch_size": 4, "max_wait_ms": 1.5}},
    }
    assert read_config_file(str(path)) == read_config_file(path)


def test_config_file_that_is_not_toml(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[server\nport = 1\n")
    with pytest.raises(ConfigError) as info:
        read_config_file(path)
    assert str(info.value).startswith(f"config file {str(path)!r} is not valid TOML: ")


def test_config_file_that_does_not_exist(tmp_path: Path) -> None:
    path = tmp_path / "missing.toml"
    with pytest.raises(ConfigError, match=r"cannot read config file .*missing\.toml"):
        read_config_file(path)


def test_config_file_with_unknown_tables(tmp_path: Path) -> None:
    path = tmp_path / "extra.toml"
    path.write_text("[server]\n[extra]\n[more]\n")
    with pytest.raises(ConfigError) as info:
        read_config_file(path)
    assert str(info.value) == (
        f"config file {str(path)!r}: unknown tables ['extra', 'more']; "
        "use [server] and [models.NAME]"
    )


# ---------------------------------------------------------------- declared signatures


@pytest.mark.usefixtures("test_models")
def test_flags_declare_a_plain_functions_signature() -> None:
    (model,), _ = resolve_models(
        ["models:add_one"],
        name=None,
        flags={},
        file_models={},
        inputs=[Tensor("INPUT0", "FP32", (4,))],
        outputs=[Tensor("OUTPUT0", "FP32", (4,))],
    )
    assert model.declared
    assert model.input_specs == (Tensor("INPUT0", "FP32", (4,)),)
    assert model.output_specs == (Tensor("OUTPUT0", "FP32", (4,)),)


@pytest.mark.usefixtures("test_models")
def test_signature_flags_need_exactly_one_target() -> None:
    with pytest.raises(ConfigError, match="name one TARGET"):
        resolve_models(
            ["models:add_one", "models:identity"],
            name=None,
            flags={},
            file_models={},
            inputs=[Tensor("INPUT0")],
        )


def test_file_target_is_named_after_its_stem_unless_renamed(tmp_path: Path) -> None:
    from backends import onnx_graphs

    path = onnx_graphs.batch_probe(tmp_path / "scorer.onnx")
    (model,), _ = resolve_models([str(path)], name=None, flags={}, file_models={})
    assert model.name == "scorer"
    (model,), _ = resolve_models([str(path)], name="ranker", flags={}, file_models={})
    assert model.name == "ranker"


def test_missing_model_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_target(str(tmp_path / "nope.onnx"))
    assert str(info.value) == f"model file '{tmp_path / 'nope.onnx'}' does not exist"


def test_repository_where_nothing_loads_is_refused(tmp_path: Path) -> None:
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "model.onnx").write_text("not a graph")
    with pytest.raises(ConfigError, match=r"^no model of the repository loaded \(broken: "):
        resolve_models([str(tmp_path)], name=None, flags={}, file_models={})


def test_name_is_refused_for_a_repository(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="a repository names models after their folders"):
        resolve_models([str(tmp_path)], name="x", flags={}, file_models={})


def test_torch_module_target_is_served_through_the_torch_backend(
    module: Callable[[str], str],
) -> None:
    name = module(
        "import torch\n\n"
        "class Scale(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x * 3\n\n"
        "scale = Scale()\n"
    )
    model = load_target(f"{name}:scale")
    assert (model.name, model.platform) == ("scale", "pytorch")
    got = model.batched_fn()({"INPUT0": np.arange(4, dtype=np.float32).reshape(2, 2)})
    np.testing.assert_array_equal(got["OUTPUT0"], [[0, 3], [6, 9]])
