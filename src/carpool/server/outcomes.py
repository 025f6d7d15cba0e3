"""Which status every exception a request can end in answers with: :func:`error_status`; and
where an answer that no model counts is counted: :func:`server_counts`.

The one classification: the app sends what it returns, the access log and ``/metrics``
count what it says, and gRPC answers it under :func:`~carpool.server.statuses.grpc_code`'s
names, so no two protocols can disagree. Statuses are named by
:class:`~carpool.server.statuses.Status`.

Every answer is counted once: under its model (``ServedModel.record``: an inference request
whose model is known), or else in its server's :class:`ServerCounts` (a health probe, a
scrape, a refused key, an unknown model, a body that could not be read before the model
was named, ...). It classifies and counts, and must not import the app, grpc or anything
that sends.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from weakref import WeakKeyDictionary

from carpool.errors import (
    BatcherClosed,
    BatchSizeMismatch,
    BatchTimeout,
    DeadlineExceeded,
    QueueFull,
    SharedMemoryFull,
    WorkerDied,
)
from carpool.server.admission import ModelOutputError
from carpool.server.messages import ProtocolError
from carpool.server.registry import ModelNotFound, ModelUnavailable, Registry
from carpool.server.statuses import RETRY, STOPPING, HTTPError, Status

__all__ = ["ServerCounts", "error_status", "server_counts"]


def error_status(exc: BaseException) -> HTTPError:
    """Every exception a request can end in, as the status a client sees.

    Anything that is not an ``Exception`` (cancellation, ``KeyboardInterrupt``) is
    re-raised: it is not a request's outcome.
    """
    if isinstance(exc, HTTPError):
        return exc
    if isinstance(exc, ProtocolError):
        return HTTPError(exc.status, str(exc))
    if isinstance(exc, ModelNotFound):
        return HTTPError(Status.NOT_FOUND, str(exc))
    if isinstance(exc, ModelUnavailable):
        return HTTPError(Status.BAD_REQUEST, str(exc))
    if isinstance(exc, QueueFull | DeadlineExceeded | SharedMemoryFull):
        return HTTPError(Status.UNAVAILABLE, str(exc), RETRY)
    if isinstance(exc, BatcherClosed):
        return HTTPError(Status.UNAVAILABLE, STOPPING)
    if isinstance(exc, BatchTimeout):  # the model ran too long: a gateway timeout's kind
        return HTTPError(Status.GATEWAY_TIMEOUT, str(exc))
    if isinstance(exc, WorkerDied):
        return HTTPError(Status.INTERNAL_ERROR, str(exc))
    if isinstance(exc, BatchSizeMismatch | ModelOutputError):
        return HTTPError(Status.INTERNAL_ERROR, f"model error: {exc}")
    if isinstance(exc, Exception):  # the model's own exception, isolated to its rows
        return HTTPError(Status.INTERNAL_ERROR, f"model error: {type(exc).__name__}: {exc}")
    raise exc


class ServerCounts:
    """The answers of one server that no model counts, by protocol and status (as
    ``ServedModel.statuses``): ``carpool_server_requests_total`` in ``/metrics``.

    ``counted`` is this process's. A front-end process (``--frontends``) shows every front
    end's, summed in the main process as of the last query: ``shown``, set by its registry.
    """

    def __init__(self) -> None:
        self.counted: defaultdict[str, Counter[int]] = defaultdict(Counter)
        self.shown: Mapping[str, Mapping[int, int]] | None = None  # None: ``counted``

    def record(self, protocol: str, status: int) -> None:
        """One answer, by ``protocol`` (a label, as the models'), that ended in ``status``."""
        self.counted[protocol][status] += 1

    def totals(self) -> Mapping[str, Mapping[int, int]]:
        """What ``/metrics`` shows."""
        return self.counted if self.shown is None else self.shown

    def export(self) -> dict[str, dict[int, int]]:
        """``counted`` as plain dicts, to send to the main process."""
        return {protocol: dict(counts) for protocol, counts in self.counted.items()}


_BY_REGISTRY: WeakKeyDictionary[Registry, ServerCounts] = WeakKeyDictionary()


def server_counts(registry: Registry) -> ServerCounts:
    """The :class:`ServerCounts` of the server over ``registry``: the one object that every
    protocol, the metrics and a front end's link to the main process share, so the counts
    hang on it (kept beside it, as long as it lives)."""
    counts = _BY_REGISTRY.get(registry)
    if counts is None:
        counts = _BY_REGISTRY[registry] = ServerCounts()
    return counts
