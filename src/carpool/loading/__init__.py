"""Models from targets, files, repositories and config tables: shared by the server and bench.

``load_target`` turns one ``module:attr``, model file or built-in name into a Model, and
``with_batching`` applies batching settings to it, checked; ``resolve_models`` does both for
every target of a command line with the settings of flags, config files and model folders in
their order of precedence.
"""

from carpool.loading.catalog import Catalog, resolve_models
from carpool.loading.repository import LoadFailure
from carpool.loading.settings import apply_settings, parse_tensor, with_batching
from carpool.loading.targets import BUILTINS, load_target, read_config_file

__all__ = [
    "BUILTINS",
    "Catalog",
    "LoadFailure",
    "apply_settings",
    "load_target",
    "parse_tensor",
    "read_config_file",
    "resolve_models",
    "with_batching",
]
