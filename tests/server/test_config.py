"""The server's own settings (``carpool.server.config``). Loading the models it serves is
``carpool.loading``'s, tested in ``tests/loading/``."""

from __future__ import annotations

import re
from typing import Any

import pytest

from carpool import Model
from carpool.errors import ConfigError
from carpool.loading import Catalog
from carpool.server.config import ServerConfig


def test_server_config_defaults() -> None:
    config = ServerConfig()
    assert (config.host, config.port, config.access_log) == ("127.0.0.1", 8000, True)
    assert (config.max_body_bytes, config.drain_timeout_s) == (64 * 1024 * 1024, 30.0)
    assert config.models == ()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"drain_timeout_s": -1.0}, "drain timeout must be >= 0 seconds, got -1.0"),
        ({"drain_timeout_s": float("nan")}, "drain timeout must be >= 0 seconds, got nan"),
        ({"port": 0}, r"port must be in 1\.\.65535, got 0"),
        ({"port": 65536}, r"port must be in 1\.\.65535, got 65536"),
        ({"max_body_bytes": 0}, "max body bytes must be >= 1, got 0"),
        ({"log_format": "xml"}, "log format must be 'text' or 'json', got 'xml'"),
        ({"log_level": "loud"}, "log level must be debug, info, warning, error or critical"),
        (
            {"models": (Model(lambda b: b, name="m"), Model(lambda b: b, name="m"))},
            r"two models are named 'm'; give one another name \(--name\)",
        ),
    ],
)
def test_server_config_refuses_what_it_cannot_serve(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ServerConfig(**settings)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"model_control_mode": "sometimes"}, "must be none, explicit or poll, got 'sometimes'"),
        ({"model_control_mode": ""}, "must be none, explicit or poll, got ''"),
        ({"model_control_mode": "explicit"}, "needs the catalog of models"),
        (
            {"model_control_mode": "poll", "catalog": Catalog(["demo"]), "frontends": 2},
            "runs with one front end: leave out --frontends (got 2)",
        ),
        ({"repository_poll_secs": 0}, "--repository-poll-secs must be > 0 seconds, got 0"),
        ({"repository_poll_secs": True}, "--repository-poll-secs must be > 0 seconds"),
        (
            {"repository_poll_settle_secs": -1},
            "--repository-poll-settle-secs must be >= 0 seconds, got -1",
        ),
        ({"repository_poll_settle_secs": "3"}, "--repository-poll-settle-secs must be >= 0"),
        ({"cache_size": 0}, "--cache-size must be a whole number of bytes >= 1, got 0"),
        ({"cache_size": 1.5}, "--cache-size must be a whole number of bytes >= 1"),
    ],
)
def test_model_control_and_cache_settings_are_checked(
    settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        ServerConfig(**settings)


def test_model_control_takes_its_catalog() -> None:
    catalog = Catalog(["demo"])
    config = ServerConfig(model_control_mode="explicit", catalog=catalog)
    assert (config.model_control_mode, config.catalog) == ("explicit", catalog)
    assert ServerConfig().model_control_mode == "none"
