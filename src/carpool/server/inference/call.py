"""The call record: what a front end hands the inference path for one request (how to read,
size, decode and encode it, how the caller may withdraw), and what the path hands its encoder
back. ``decode`` and ``encode`` are pure functions of what ``read`` returned: nothing is kept
between them. Types only: it must not import the path."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from carpool.model import Model
    from carpool.server.inference.admission import AdmittedRequest
    from carpool.server.lifecycle.registry import ServedModel
    from carpool.server.messages import InferRequest, OutputTensor, Parameters

__all__ = ["NOT_WITHDRAWN", "Answer", "Call", "GoneSignal", "Replay", "Withdrawal"]

R = TypeVar("R")  # a request as its front end read it
T = TypeVar("T")  # its answer as its front end sends it

# Called with what to run when the client goes (at most once); returns what stops watching.
GoneSignal = Callable[[Callable[[], None]], Callable[[], None]]


@dataclass(frozen=True, slots=True)
class Withdrawal:
    """How a request may be withdrawn before its answer; every field may be left out.

    ``client_gone``: a :data:`GoneSignal`, told what to run when the client goes (REST: its
    connection is lost); the request is then withdrawn and
    :class:`~carpool.server.inference.path.ClientGone` raised. A callback, not an awaitable:
    watching costs no task of its own.
    ``deadline_s``: the seconds the caller still waits (a gRPC call's deadline); it
    shortens the queue timeout, and its expiry is a 504's kind (gRPC's
    ``DEADLINE_EXCEEDED``), while the model's own queue timeout stays a 503.
    ``cancel_counts_as``: the status a cancellation of the caller's task is counted as
    (gRPC: a call the client cancelled, 499; REST: the server's cut-off at the drain
    deadline, 503); None counts nothing. One at ``deadline_s`` or past it counts 504.
    """

    client_gone: GoneSignal | None = None
    deadline_s: float | None = None
    cancel_counts_as: int | None = None


NOT_WITHDRAWN = Withdrawal()


@dataclass(frozen=True, slots=True)
class Replay(Generic[R, T]):
    """How the response cache may answer a request repeated byte for byte with the answer
    encoded the last time (see :mod:`carpool.server.inference.path`).

    ``parts(read)``: the request's parts as they came, every byte its encoded answer depends
    on but the model (REST: the header-length and content-type headers, None if not sent,
    and the body). ``size(encoded)``: the bytes an encoded answer holds, which the cache
    counts.
    """

    parts: Callable[[R], tuple[bytes | None, ...]]
    size: Callable[[T], int]


@dataclass(frozen=True, slots=True, eq=False)
class Answer:
    """What a request's ``encode`` gets: the request as decoded, as admitted, and its
    response tensors, each with whether to send it binary, in the order asked for.

    From the response cache, ``admitted`` is the identical request's that computed it, its
    ``value`` (the admitted inputs) kept only for a model that counts tokens, else empty.
    ``index``: the row a streamed step answers (0 but for a call whose request may carry
    several sequences, :attr:`Call.row_parameters`).
    """

    served: ServedModel
    request: InferRequest
    admitted: AdmittedRequest
    outputs: list[tuple[OutputTensor, bool]]
    index: int = 0


def _inline(read: Any) -> int:
    return 0  # nothing worth a thread to decode


# Not frozen: one is built per request, and a frozen dataclass's __init__ (object.__setattr__
# per field) costs three times a plain one's; nothing writes to it once handed over.
@dataclass(slots=True, kw_only=True, eq=False)
class Call(Generic[R, T]):
    """One request as its front end hands it to the inference path.

    ``protocol``: its label in ``/metrics``. ``model`` and ``version``: the model it is for
    (version None: the one served), looked up before the request is read; or ``model`` None
    and ``named(read)`` the name the request itself gives (OpenAI's body), looked up once it
    is read. ``read()``: the request as it came (a body, a message), read only once the
    server is known to be ready. ``size(read)``: the bytes decoding it walks; from
    :data:`~carpool.server.inference.admission.DECODE_OFFLOAD_BYTES` the path decodes it in
    a thread. ``decode(model, read)`` and ``encode(answer, read)``: pure, and raise what a
    request can end in. ``withdrawal``: how the caller may leave. ``replay``: whether, and
    how, a cached model's answers are also kept encoded. ``row_parameters(read, parameters,
    row)``: each row's parameters for a step-wise model's streamed request, which may then
    carry several rows, their steps interleaved (OpenAI's ``n`` and prompt lists); None:
    every row gets the request's own, and a stream carries one row.
    """

    protocol: str
    model: str | None
    version: str | None = None
    named: Callable[[R], str] | None = None
    read: Callable[[], Awaitable[R]]
    size: Callable[[R], int] = _inline
    decode: Callable[[Model, R], InferRequest]
    encode: Callable[[Answer, R], T]
    withdrawal: Withdrawal = NOT_WITHDRAWN
    replay: Replay[R, T] | None = None
    row_parameters: Callable[[R, Parameters, int], Parameters] | None = None
