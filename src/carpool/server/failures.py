"""The server's exceptions that a request can end in, beside the library's
(:mod:`carpool.errors`): an unknown or failed model, model control refused or failed, a
model's outputs that break its signature. Here, below the registry, model control and
admission that raise them, so that :mod:`carpool.server.inference.outcomes` classifies them
without importing any of those. Stdlib and :mod:`carpool.errors` only.
"""

from __future__ import annotations

from typing import Any

from carpool.errors import CarpoolError

__all__ = [
    "ControlUnavailable",
    "LoadFailed",
    "ModelNotFound",
    "ModelOutputError",
    "ModelUnavailable",
]


class ModelNotFound(CarpoolError, LookupError):
    """No model (or no such version of it) is served under that name: a 404."""

    def __init__(self, name: str, version: str | None = None) -> None:
        self.name = name
        self.version = version
        what = f"'{name}'" if version is None else f"'{name}' version '{version}'"
        super().__init__(f"Request for unknown model: {what} is not found")  # Triton's words

    def _fields(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version}


class ModelUnavailable(CarpoolError):
    """A request for a model that failed to load at start (its
    :class:`~carpool.loading.LoadFailure`); the reason says why (a 400, as in Triton)."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason
        super().__init__(f"Model '{name}' is not ready: failed to load: {reason}")

    def _fields(self) -> dict[str, Any]:
        return {"name": self.name, "reason": self.reason}


class ControlUnavailable(CarpoolError):
    """Loading and unloading on request are off (a 503, Triton's UNAVAILABLE): the server
    runs without explicit model control, or is stopping."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)

    def _fields(self) -> dict[str, Any]:
        return {"reason": self.reason}


class LoadFailed(CarpoolError):
    """A model could not be loaded (a 400, Triton's INVALID_ARG); the version serving
    before, if any, still serves."""

    def __init__(self, name: str, reason: str, *, action: str = "load") -> None:
        self.name = name
        self.reason = reason
        super().__init__(f"failed to {action} '{name}': {reason}")

    def _fields(self) -> dict[str, Any]:
        return {"name": self.name, "reason": self.reason}


class ModelOutputError(CarpoolError, RuntimeError):
    """The model returned outputs that do not match its declared signature (a 500).

    The server's error, not the client's: the message names the model and what it broke.
    """

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)

    def _fields(self) -> dict[str, Any]:
        return {"message": self.message}
