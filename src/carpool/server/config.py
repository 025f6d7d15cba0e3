"""The server's own settings: where it listens, how it logs, what it serves.

Which models and with what batching is settled by :mod:`carpool.loading`; this is what is
left for the HTTP process. A frozen record checked on construction; it must not import the
rest of the server.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from carpool.engine.options import option
from carpool.errors import ConfigError
from carpool.loading import Catalog, LoadFailure
from carpool.model import Model
from carpool.stepwise import StepwiseModel

__all__ = ["ServerConfig"]

_MAX_FRONTENDS = 256  # processes; more is a typo, not a host
MODEL_CONTROL_MODES = ("none", "explicit", "poll")  # Triton's --model-control-mode


@dataclass(frozen=True)
class ServerConfig:
    host: str = option("127.0.0.1", help="address to listen on")
    port: int = option(8000, help="port to listen on")
    grpc_port: int = option(  # Triton's gRPC port; 0 turns gRPC off
        8001,
        help="port for the KServe v2 / Triton gRPC API, on the same models and --host; 0 "
        "turns it off",
    )
    log_level: str = option("info", help="debug, info, warning, error or critical")
    # or "json": one object per line
    log_format: str = option("text", help="text, or json for one object per line")
    access_log: bool = option(True, help="log every request (true/false)")
    # Triton's HTTP default is the same order
    max_body_bytes: int = option(64 * 1024 * 1024, help="largest request body; then 413")
    # Kubernetes' default terminationGracePeriodSeconds. Whole seconds are written as ints
    # here and below, so that --help shows them as such ([30], not [30.0]).
    drain_timeout_s: float = option(
        30, help="seconds to finish requests on SIGTERM", flag="--drain-timeout"
    )
    # Access control and transport: no keys, no TLS, by default (a server on loopback).
    api_keys: tuple[str, ...] = field(default=(), repr=False)  # never in a repr or a log
    # Prometheus scrapers usually carry no key
    metrics_need_key: bool = option(
        False, help="with --api-key: /metrics needs a key too (true/false)"
    )
    ssl_certfile: str | None = option(
        None, help="serve HTTPS and gRPC over TLS with this PEM certificate (chain)"
    )
    ssl_keyfile: str | None = option(None, help="the private key of --ssl-certfile (PEM)")
    # Connection limits. nginx waits 60 s for headers and between body reads; a model server
    # behind a load balancer gets whole requests at once, so far less is plenty.
    # A slow client's headers: 10 s (Apache's is 20-40 s).
    header_timeout_s: float = option(
        10,
        help="seconds a connection may take to send a request's headers; then 408 and closed",
        flag="--header-timeout",
    )
    # The whole body: 64 MiB at ~2 MB/s, as long as a drain.
    body_timeout_s: float = option(
        30,
        help="seconds a request may take to send its whole body; then 408 and closed",
        flag="--body-timeout",
    )
    # Connections at once, then 503; under 1024 fds; 0: none.
    limit_concurrency: int = option(
        1000, help="HTTP connections served at once; requests on more get 503; 0: no limit"
    )
    # Processes that serve connections, around one batcher per model
    # (carpool.server.frontends.spread); 1: this process does both.
    frontends: int = option(
        1,
        help="front-end processes that serve HTTP and gRPC connections (reading, keys, "
        "decoding, encoding) around one batcher per model in the main process; one per spare "
        "core when the server's own CPU is the limit; 1: one process does both",
    )
    # Texts in one /v1/embeddings request at most, then 413: text-embeddings-inference's 32.
    max_client_batch_size: int = option(
        32, help="texts one /v1/embeddings request may hold; more get 413"
    )
    # gRPC calls running at once (per front end), then RESOURCE_EXHAUSTED; 0: none.
    grpc_max_concurrent_rpcs: int = option(
        1000,
        help="gRPC calls served at once (each front end); more get RESOURCE_EXHAUSTED; 0: no limit",
    )
    # Model control, as Triton's: "none" serves what loaded at start; "explicit" loads and
    # unloads on request (POST /v2/repository/models/NAME/load); "poll" follows the
    # repository's folders, looked at every repository_poll_secs (Triton's default: 15 s).
    model_control_mode: str = option(
        "none",
        help="none: serve what loads at start; explicit: load and unload models on request "
        "(POST /v2/repository/models/NAME/load|unload, tritonclient's load_model); poll: "
        "follow the repository's folders as they are added, changed and removed",
    )
    repository_poll_secs: float = option(
        15, help="with --model-control-mode poll: seconds between looks at the repository"
    )
    # poll: a changed folder is left until it has not changed for this long (0: two looks)
    repository_poll_settle_secs: float = option(
        0,
        help="with --model-control-mode poll: seconds a changed folder must stay unchanged "
        "before it loads (0: two looks agree); longer than a copy's longest pause",
    )
    # The response cache's size across models (those with response_cache on), in bytes.
    cache_size: int = option(
        64 * 1024 * 1024,
        help="bytes the response cache holds across models (--response-cache); the least "
        "recently used answers go first",
    )
    # Prompts' computed state each step-wise model keeps for reuse, in bytes, split over its
    # replicas: 256 MiB holds ~5,000 prompt tokens of SmolLM2-135M's float32 cache.
    prefix_cache_size: int = option(
        256 * 1024 * 1024,
        help="bytes of prompts' computed state each step-wise model keeps for later prompts "
        "that share a prefix, split over its replicas; least recently used first out; 0: off",
    )
    models: tuple[Model, ...] = field(default_factory=tuple)
    unavailable: tuple[LoadFailure, ...] = ()  # repository models that failed to load
    catalog: Catalog | None = None  # how to load models again: model control needs it

    def __post_init__(self) -> None:
        if not self.drain_timeout_s >= 0:
            raise ConfigError(f"drain timeout must be >= 0 seconds, got {self.drain_timeout_s}")
        if not 0 < self.port < 65536:
            raise ConfigError(f"port must be in 1..65535, got {self.port}")
        if not 0 <= self.grpc_port < 65536:
            raise ConfigError(f"gRPC port must be in 1..65535, or 0 for none, got {self.grpc_port}")
        if self.grpc_port == self.port:
            raise ConfigError(
                f"the gRPC port and the HTTP port are both {self.port}; give one another"
            )
        if self.max_body_bytes < 1:
            raise ConfigError(f"max body bytes must be >= 1, got {self.max_body_bytes}")
        keys: object = self.api_keys  # a config file gives a list, or by mistake one string
        if isinstance(keys, str) or not isinstance(keys, tuple | list):
            raise ConfigError("api_keys must be a list of keys")
        object.__setattr__(self, "api_keys", tuple(keys))
        _check_access(self)
        _check_processes(self)
        _check_models(self)
        object.__setattr__(self, "models", tuple(self.served(m) for m in self.models))
        names = [m.name for m in self.models]
        for name in names:
            if names.count(name) > 1:
                raise ConfigError(f"two models are named {name!r}; give one another name (--name)")
        if self.log_format not in ("text", "json"):
            raise ConfigError(f"log format must be 'text' or 'json', got {self.log_format!r}")
        if self.log_level.lower() not in ("debug", "info", "warning", "error", "critical"):
            raise ConfigError(
                f"log level must be debug, info, warning, error or critical, got {self.log_level!r}"
            )

    def served(self, model: Model) -> Model:
        """``model`` as this server serves it: a step-wise one with the prefix cache's budget."""
        if isinstance(model, StepwiseModel) and model.prefix_cache_bytes != self.prefix_cache_size:
            return replace(model, prefix_cache_bytes=self.prefix_cache_size)
        return model


def _check_access(config: ServerConfig) -> None:
    """The keys, TLS files and connection limits; a message never quotes a key."""
    for key in config.api_keys:
        if not isinstance(key, str) or not key or not key.isprintable() or not key.isascii():
            raise ConfigError("an API key must be a non-empty string of printable ASCII")
        if any(c in key for c in " ,\t"):
            raise ConfigError("an API key must not contain spaces or commas")
    if (config.ssl_certfile is None) != (config.ssl_keyfile is None):
        raise ConfigError("TLS needs both --ssl-certfile and --ssl-keyfile, or neither")
    for flag, path in (
        ("--ssl-certfile", config.ssl_certfile),
        ("--ssl-keyfile", config.ssl_keyfile),
    ):
        if path is not None and not os.path.isfile(path):
            raise ConfigError(f"{flag} {path!r}: no such file")
    for flag, seconds in (
        ("--header-timeout", config.header_timeout_s),
        ("--body-timeout", config.body_timeout_s),
    ):
        if not seconds > 0:
            raise ConfigError(f"{flag} must be > 0 seconds, got {seconds}")
    if config.limit_concurrency < 0:
        raise ConfigError(
            f"--limit-concurrency must be >= 0 (0: no limit), got {config.limit_concurrency}"
        )


def _check_processes(config: ServerConfig) -> None:
    """The front ends, and what one request may ask of them."""
    if isinstance(config.frontends, bool) or not isinstance(config.frontends, int):
        raise ConfigError(f"--frontends must be a whole number, got {config.frontends!r}")
    if not 1 <= config.frontends <= _MAX_FRONTENDS:
        raise ConfigError(
            f"--frontends must be in 1..{_MAX_FRONTENDS} (1: one process serves and batches), "
            f"got {config.frontends}"
        )
    limit = config.max_client_batch_size
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigError(f"--max-client-batch-size must be a whole number >= 1, got {limit!r}")
    rpcs = config.grpc_max_concurrent_rpcs
    if isinstance(rpcs, bool) or not isinstance(rpcs, int) or rpcs < 0:
        raise ConfigError(
            f"--grpc-max-concurrent-rpcs must be a whole number >= 0 (0: no limit), got {rpcs!r}"
        )


def _check_models(config: ServerConfig) -> None:
    """Model control and the response cache."""
    mode = config.model_control_mode
    if mode not in MODEL_CONTROL_MODES:
        raise ConfigError(f"--model-control-mode must be none, explicit or poll, got {mode!r}")
    if mode != "none" and config.catalog is None:
        raise ConfigError(f"--model-control-mode {mode} needs the catalog of models to load")
    if mode != "none" and config.frontends > 1:
        raise ConfigError(
            f"--model-control-mode {mode} runs with one front end: leave out --frontends "
            f"(got {config.frontends}), or use --model-control-mode none"
        )
    seconds = config.repository_poll_secs
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
        raise ConfigError(f"--repository-poll-secs must be > 0 seconds, got {seconds!r}")
    settle = config.repository_poll_settle_secs
    if isinstance(settle, bool) or not isinstance(settle, int | float) or not settle >= 0:
        raise ConfigError(f"--repository-poll-settle-secs must be >= 0 seconds, got {settle!r}")
    size = config.cache_size
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError(f"--cache-size must be a whole number of bytes >= 1, got {size!r}")
    size = config.prefix_cache_size
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ConfigError(
            f"--prefix-cache-size must be a whole number of bytes >= 0 (0: off), got {size!r}"
        )
    cached = [m.name for m in config.models if m.response_cache]
    if cached and config.frontends > 1:
        raise ConfigError(
            f"the response cache (models {', '.join(map(str, cached))}) runs with one front "
            f"end: leave out --frontends (got {config.frontends}), or turn the cache off for "
            "them (--response-cache, [models.NAME] response_cache)"
        )
