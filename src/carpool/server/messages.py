"""The v2 (KServe / Open Inference Protocol) messages as records, and the error they share.

:mod:`carpool.server.requests` builds these records from bytes and
:mod:`carpool.server.responses` turns them back into bytes. Every refusal of either is a
:class:`ProtocolError` carrying the HTTP status and the field at fault. Pure: numpy and the
standard library only; no sockets, no event loop, no framework.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import numpy as np

from carpool.datatypes import DATATYPES
from carpool.errors import CarpoolError

__all__ = [
    "HEADER_LENGTH",
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
]

#: The header that splits a body into its JSON part and the binary blobs after it.
HEADER_LENGTH = "Inference-Header-Content-Length"

Parameters = dict[str, str | int | float | bool]
Array = np.ndarray[Any, np.dtype[Any]]


class ProtocolError(CarpoolError, ValueError):
    """A request the protocol cannot accept, or a response it cannot carry.

    ``field`` names what is at fault: a JSON path (``"inputs[0].shape"``), a tensor name
    (``"INPUT0"``), ``"body"``, or a header name. ``status`` is the HTTP status to answer
    with: 400 for a malformed request, 413 for one over a size limit, 500 for a model
    output the protocol cannot express. The message is what the client should read.
    """

    def __init__(self, message: str, *, field: str, status: int = 400) -> None:
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
    ``ValueError`` is the client's to fix (400), ``TypeError`` the server's (500). A class,
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
            raise ProtocolError(str(exc), field=self._field, status=500) from None


def check_element_total(
    total: int, name: str, shape: tuple[int, ...], where: str, max_elements: int
) -> None:
    """413 once input ``name`` brings a request's elements past ``max_elements``; every
    wire format (JSON, binary, gRPC) checks this before allocating anything."""
    if total > max_elements:
        raise ProtocolError(
            f"input '{name}' with shape {list(shape)} brings the request to {total} "
            f"elements, over this server's limit of {max_elements}",
            field=f"{where}.shape",
            status=413,
        )


def check_output_fits(tensor: OutputTensor) -> None:
    """500 for an output whose array does not fit its datatype and shape (the server's
    fault, not the client's), before any wire format encodes it."""
    if tensor.datatype not in DATATYPES or math.prod(tensor.shape) != tensor.data.size:
        raise ProtocolError(
            f"output '{tensor.name}' ({tensor.data.size} elements) does not fit datatype "
            f"{tensor.datatype!r} and shape {list(tensor.shape)}",
            field=tensor.name,
            status=500,
        )
