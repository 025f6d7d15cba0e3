"""The v2 (KServe / Open Inference Protocol) messages as records, and the :class:`ProtocolError`
they share. The REST and gRPC codecs build these records; the checks every decoder makes alike
live here once, each refusal naming its status and the field at fault. Pure."""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import numpy as np

from carpool.datatypes import DATATYPES
from carpool.errors import CarpoolError
from carpool.server.statuses import Status

__all__ = [
    "HEADER_LENGTH",
    "MAX_ELEMENTS",
    "ProtocolError",
    "InferInput",
    "RequestedOutput",
    "InferRequest",
    "OutputTensor",
    "Parameters",
    "wants_binary",
    "blame",
    "check_element_total",
    "check_output_fits",
    "claim_name",
    "input_tensor",
    "check_requested_output",
    "refuse_shared_memory",
]

#: The header that splits a body into its JSON part and the binary blobs after it.
HEADER_LENGTH = "Inference-Header-Content-Length"
#: Elements one request may carry (2**31, Triton's limit): checked before anything is allocated.
MAX_ELEMENTS = 2**31
_NO_SHM = (
    "shared memory is not supported by this server ({} '{}'); send the tensor's data in the request"
)

Parameters = dict[str, str | int | float | bool]
Array = np.ndarray[Any, np.dtype[Any]]


class ProtocolError(CarpoolError, ValueError):
    """A request the protocol cannot accept, or a response it cannot carry.

    ``field`` names what is at fault: a JSON path (``"inputs[0].shape"``), a tensor name
    (``"INPUT0"``), ``"body"``, or a header name. ``status`` is the HTTP status to answer
    with (:class:`~carpool.server.statuses.Status`): a bad request for a malformed one,
    content too large for one over a size limit, an internal error for a model output the
    protocol cannot express. The message is what the client should read.
    """

    def __init__(self, message: str, *, field: str, status: int = Status.BAD_REQUEST) -> None:
        self.detail = message
        self.field = field
        self.status = status
        super().__init__(message)

    def _fields(self) -> dict[str, Any]:
        return {"message": self.detail, "field": self.field, "status": self.status}


@dataclass(frozen=True, slots=True, eq=False)
class InferInput:
    """One input tensor; ``data`` is read-only and has ``shape`` (BF16 held as float32).

    ``parameters`` are the input's own, minus ``binary_data_size`` (consumed by framing).
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: Array
    parameters: Parameters


@dataclass(frozen=True, slots=True)
class RequestedOutput:
    """An output the client asked for; ``binary`` is ``None`` when it did not say how.

    ``parameters`` are the output's own, minus ``binary_data`` (lifted into ``binary``).
    """

    name: str
    binary: bool | None
    parameters: Parameters


@dataclass(frozen=True, slots=True, eq=False)
class InferRequest:
    """A parsed inference request; ``outputs`` is ``None`` when the client wants them all.

    ``parameters`` are the request's own (``priority``, ``timeout``, custom keys) minus
    ``binary_data_output``, which is lifted into its own field.
    """

    id: str | None
    parameters: Parameters
    inputs: tuple[InferInput, ...]
    outputs: tuple[RequestedOutput, ...] | None
    binary_data_output: bool


@dataclass(frozen=True, slots=True, eq=False)
class OutputTensor:
    """One output to send; ``data`` may be any dtype that casts same-kind to ``datatype``."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: Array


def wants_binary(request: InferRequest, output: RequestedOutput | None) -> bool:
    """Whether to send an output binary: its own ``binary_data`` wins over the request's."""
    if output is not None and output.binary is not None:
        return output.binary
    return request.binary_data_output


class blame:  # lower case: used like a function, as contextlib.suppress is
    """Turn the tensor codecs' builtin errors into a :class:`ProtocolError` naming ``field``.

    The codecs (:mod:`carpool.server.tensors`) raise builtins with client-ready messages:
    ``ValueError`` is the client's to fix (a bad request), ``TypeError`` the server's (an
    internal error). A class,
    not ``@contextmanager``: it runs once per tensor of every request, and costs a third.
    """

    __slots__ = ("_field",)

    def __init__(self, field: str) -> None:
        self._field = field

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None or isinstance(exc, ProtocolError):
            return
        if isinstance(exc, ValueError):
            raise ProtocolError(str(exc), field=self._field) from None
        if isinstance(exc, TypeError):
            raise ProtocolError(str(exc), field=self._field, status=Status.INTERNAL_ERROR) from None


def check_element_total(
    total: int, name: str, shape: tuple[int, ...], where: str, max_elements: int
) -> None:
    """Content too large once input ``name`` brings a request's elements past
    ``max_elements``; every wire format (JSON, binary, gRPC) checks this before allocating
    anything."""
    if total > max_elements:
        raise ProtocolError(
            f"input '{name}' with shape {list(shape)} brings the request to {total} "
            f"elements, over this server's limit of {max_elements}",
            field=f"{where}.shape",
            status=Status.CONTENT_TOO_LARGE,
        )


def check_output_fits(tensor: OutputTensor) -> None:
    """An internal error for an output whose array does not fit its datatype and shape (the server's
    fault, not the client's), before any wire format encodes it."""
    if tensor.datatype not in DATATYPES or math.prod(tensor.shape) != tensor.data.size:
        raise ProtocolError(
            f"output '{tensor.name}' ({tensor.data.size} elements) does not fit datatype "
            f"{tensor.datatype!r} and shape {list(tensor.shape)}",
            field=tensor.name,
            status=Status.INTERNAL_ERROR,
        )


def input_tensor(
    name: str, datatype: str, shape: tuple[int, ...], data: Array, params: Parameters
) -> InferInput:
    """An input's record, its data shaped and read-only (views of the request are never
    written, and copies follow suit)."""
    data = data.reshape(shape)
    data.flags.writeable = False
    return InferInput(name=name, datatype=datatype, shape=shape, data=data, parameters=params)


def claim_name(name: str, taken: set[str], kind: str, where: str) -> None:
    """Add ``name`` to the names of its ``kind`` ("input", "output") ``taken`` so far; a
    400 if an earlier tensor of that kind has it (Triton's words)."""
    if name in taken:
        raise ProtocolError(f"{kind} '{name}' already exists in request", field=f"{where}.name")
    taken.add(name)


def refuse_shared_memory(kind: str, name: str, where: str, params: Parameters) -> None:
    """A 400 for a tensor whose ``params`` point at a shared memory region: this server
    takes tensors in the request only."""
    if "shared_memory_region" in params:
        raise ProtocolError(_NO_SHM.format(kind, name), field=f"{where}.parameters")


def check_requested_output(name: str, params: Parameters, where: str) -> None:
    """A 400 for an output the client asks for in shared memory, or with the
    classification extension: this server supports neither."""
    refuse_shared_memory("output", name, where, params)
    if "classification" in params:
        raise ProtocolError(
            f"the classification extension is not supported (output '{name}')",
            field=f"{where}.parameters.classification",
        )
