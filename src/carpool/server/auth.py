"""API keys: which credentials a request presents (``Authorization: Bearer KEY`` or
``x-api-key: KEY``, one header of one kind), whether one is a served key, which routes need
none. Keys are compared as SHA-256 digests with :func:`hmac.compare_digest`, against every
served key without exiting early, so timing reveals neither a match nor a length. Pure."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Sequence

__all__ = ["OPEN_RPCS", "UNAUTHORIZED", "ApiKeys", "is_open", "presented"]

UNAUTHORIZED = "unauthorized"  # the whole message of a refusal: no detail to probe with
_BEARER = b"bearer "
# The gRPC methods that need no key, as Kubernetes' gRPC probes and REST's health routes.
OPEN_RPCS = frozenset(
    {
        "/inference.GRPCInferenceService/ServerLive",
        "/inference.GRPCInferenceService/ServerReady",
    }
)


def presented(headers: Iterable[tuple[bytes, bytes]]) -> list[bytes | None]:
    """What each key header of a request presents: the token of an ``Authorization: Bearer``
    header (the scheme in any case), None for an ``Authorization`` of another scheme, and
    the value of an ``x-api-key`` header. Names must be lower case, as ASGI and gRPC give
    them."""
    keys: list[bytes | None] = []
    for name, value in headers:
        if name == b"authorization":
            keys.append(value[7:].strip() if value[:7].lower() == _BEARER else None)
        elif name == b"x-api-key":
            keys.append(value.strip())
    return keys


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


class ApiKeys:
    """The keys a server accepts; :meth:`allows` a request's headers in constant time."""

    def __init__(self, keys: Sequence[str]) -> None:
        if not keys:
            raise ValueError("ApiKeys needs at least one key; serve with no keys instead")
        self._digests = tuple(_digest(key.encode()) for key in keys)

    def __len__(self) -> int:
        return len(self._digests)

    def __repr__(self) -> str:
        return f"ApiKeys(<{len(self._digests)} keys>)"  # never the keys themselves

    def allows(self, headers: Iterable[tuple[bytes, bytes]]) -> bool:
        """Whether the headers present exactly one key, and it is one of these. A request
        with several key headers (of one kind or of both) is refused whatever they hold:
        one request tests one guess."""
        keys = presented(headers)
        if len(keys) != 1 or keys[0] is None:
            return False
        return self.matches(keys)  # type: ignore[arg-type]  # (None ruled out above)

    def matches(self, candidates: Iterable[bytes]) -> bool:
        """Whether any of ``candidates`` is one of these keys; every candidate is compared
        with every key, whatever the earlier comparisons found."""
        found = False
        for candidate in candidates:
            digest = _digest(candidate)
            for key in self._digests:
                found |= hmac.compare_digest(digest, key)
        return found


def is_open(parts: Sequence[str], *, metrics_need_key: bool) -> bool:
    """Whether the route of a path split at ``/`` needs no key: the health routes (probes
    carry no credentials), and ``/metrics`` unless ``metrics_need_key``."""
    if len(parts) == 3:
        return parts[0] == "v2" and parts[1] == "health" and parts[2] in ("live", "ready")
    return parts == ["metrics"] and not metrics_need_key
