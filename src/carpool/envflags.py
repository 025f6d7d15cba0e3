"""argparse flags that fall back to environment variables: ``--max-batch-size`` reads
``CARPOOL_MAX_BATCH_SIZE``, so containers are configured without rewriting the command line.

Shared by ``carpool serve`` and ``carpool bench``; stdlib only.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

__all__ = ["FromEnv", "add_flag", "parse_bool", "typed_flag"]


class FromEnv(str):
    """A default read from the environment, so a bad value can be blamed on its variable."""

    env = ""


def typed_flag(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    """``convert`` as an argparse ``type``: a value it refuses is a usage error that names the
    environment variable when the value came from one, else the flag's type."""

    def typed(value: str) -> Any:
        try:
            return convert(value)
        except ValueError:
            if isinstance(value, FromEnv):
                message = f"environment variable {value.env}={str(value)!r} is invalid"
                raise argparse.ArgumentTypeError(message) from None
            name = getattr(convert, "__name__", "value").lstrip("_")
            raise argparse.ArgumentTypeError(f"invalid {name} value: {value!r}") from None

    typed.__name__ = getattr(convert, "__name__", "value")
    return typed


def add_flag(
    parser: argparse._ActionsContainer,  # a parser or one of its argument groups
    flag: str,
    convert: Callable[[str], Any],
    default: Any,
    help: str,
    *,
    prefix: str = "CARPOOL_",
    **kwargs: Any,
) -> None:
    """Add ``flag`` to ``parser``, defaulting to the variable ``prefix`` + its name in capitals
    (``--max-batch-size``: ``CARPOOL_MAX_BATCH_SIZE``) when that is set and not empty, else to
    ``default``. The help text names the variable, and the default when there is one."""
    env = prefix + flag.lstrip("-").replace("-", "_").upper()
    # A string default is converted by argparse only for the command being run, and a bad
    # value becomes a usage error (exit 2) like a bad flag.
    value = os.environ.get(env)
    from_env = None
    if value:
        from_env = FromEnv(value)
        from_env.env = env
    shown = "" if default is None else f"; default {default}"
    parser.add_argument(
        flag,
        type=typed_flag(convert),
        default=from_env if from_env is not None else default,
        help=f"{help} (env {env}{shown})",
        **kwargs,
    )


def parse_bool(value: str) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off``, any case; ``ValueError`` for anything else."""
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(value)
