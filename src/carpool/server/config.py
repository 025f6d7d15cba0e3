"""The server's own settings: where it listens, how it logs, what it serves.

Which models and with what batching is settled by :mod:`carpool.loading`; this is what is
left for the HTTP process. A frozen record checked on construction; it must not import the
rest of the server.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from carpool.errors import ConfigError
from carpool.loading import LoadFailure
from carpool.model import Model

__all__ = ["ServerConfig"]


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    grpc_port: int = 8001  # Triton's gRPC port; 0 turns gRPC off
    log_level: str = "info"
    log_format: str = "text"  # or "json": one object per line
    access_log: bool = True
    max_body_bytes: int = 64 * 1024 * 1024  # Triton's HTTP default is the same order
    drain_timeout_s: float = 30.0  # Kubernetes' default terminationGracePeriodSeconds
    models: tuple[Model, ...] = field(default_factory=tuple)
    unavailable: tuple[LoadFailure, ...] = ()  # repository models that failed to load

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
