"""Models from targets, files, repositories and config tables, for the server and bench."""

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
