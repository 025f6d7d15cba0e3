"""The server's own settings (``carpool.server.config``). Loading the models it serves is
``carpool.loading``'s, tested in ``tests/loading/``."""

from __future__ import annotations

from carpool.server.config import ServerConfig


def test_server_config_defaults() -> None:
    config = ServerConfig()
    assert (config.host, config.port, config.access_log) == ("127.0.0.1", 8000, True)
    assert (config.max_body_bytes, config.drain_timeout_s) == (64 * 1024 * 1024, 30.0)
    assert config.models == ()
