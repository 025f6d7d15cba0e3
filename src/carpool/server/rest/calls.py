"""The REST front ends' call records for the inference path: how a v2 inference request (JSON,
binary or raw) and an OpenAI ``/v1/embeddings`` request are sized, decoded, encoded and
withdrawn, by the codecs. Pure functions of what the app read; only the app imports it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from carpool.model import Model
from carpool.server.inference.admission import DECODE_OFFLOAD_BYTES
from carpool.server.inference.call import Answer, Call, Replay, Withdrawal
from carpool.server.messages import HEADER_LENGTH, MAX_ELEMENTS, InferRequest, ProtocolError
from carpool.server.openai import codec as openai
from carpool.server.rest.asgi import JSON, Receive, Scope, gone_signal
from carpool.server.rest.codec import (
    check_raw_content_type,
    encode_infer_response,
    parse_header_length,
    parse_infer_request,
    parse_raw_request,
)
from carpool.server.statuses import Status

__all__ = ["HTTP", "OPENAI", "Received", "Sent", "embeddings_call", "v2_call", "withdrawal"]

HTTP = "http"  # the protocol label of v2 REST requests in /metrics
OPENAI = "openai"  # and of /v1/embeddings requests
# The server cancels a REST request only at the drain deadline, and answers it 503 itself:
# counted so by the inference path, as every other answer is.
_CUT_OFF = Status.UNAVAILABLE
# A v2 inference request as it came: its ``inference-header-content-length`` and
# ``content-type`` headers (None where not sent) and its body.
Received = tuple[bytes | None, bytes | None, bytes]
Sent = tuple[bytes, list[tuple[bytes, bytes]]]  # an answer's body and headers


def v2_call(
    name: str,
    version: str | None,
    read: Callable[[], Awaitable[Received]],
    withdrawn: Withdrawal,
) -> Call[Received, Sent]:
    """A v2 inference request for model ``name`` (``version``), read by ``read``."""
    return Call(
        protocol=HTTP, model=name, version=version, read=read, size=_decoded_bytes,
        decode=_decode, encode=_encode, withdrawal=withdrawn, replay=_REPLAY,
    )  # fmt: skip


def embeddings_call(
    read: Callable[[], Awaitable[dict[str, Any]]],
    withdrawn: Withdrawal,
    max_client_batch_size: int | None,
) -> Call[dict[str, Any], Sent]:
    """One ``POST /v1/embeddings`` body of k texts (``read``: as a JSON object), on the path
    the v2 route takes. Its body names the model: counted the server's until then."""
    decode = partial(openai.decode, max_client_batch_size=max_client_batch_size)
    return Call(
        protocol=OPENAI, model=None, named=openai.model_name, read=read, decode=decode,
        encode=_encode_embeddings, withdrawal=withdrawn,
    )  # fmt: skip


def withdrawal(scope: Scope, receive: Receive) -> Withdrawal:
    """A REST request is withdrawn when its client goes; cut off at the drain deadline."""
    return Withdrawal(client_gone=gone_signal(scope, receive), cancel_counts_as=_CUT_OFF)


def _decoded_bytes(received: Received) -> int:
    """The bytes decoding a v2 request walks: its JSON (a raw body is not decoded). A body
    too small to be decoded in a thread is not looked into: its JSON is smaller still."""
    length, _, body = received
    if length is None or len(body) < DECODE_OFFLOAD_BYTES:
        return len(body)
    header_length = parse_header_length(_text(length), len(body))
    return len(body) if header_length is None else header_length


def _decode(model: Model, received: Received) -> InferRequest:
    """The request of a v2 body and its ``inference-header-content-length`` and
    ``content-type`` headers (None where not sent) for ``model``."""
    length, content_type, body = received
    header_length = parse_header_length(_text(length), len(body))
    if header_length == 0:
        check_raw_content_type(_text(content_type))
        return _raw_request(model, body)
    return parse_infer_request(body, header_length, max_elements=MAX_ELEMENTS)


def _encode(answer: Answer, received: Received) -> Sent:
    body, json_length = encode_infer_response(
        model_name=answer.served.name,
        model_version=answer.served.version,
        request_id=answer.request.id,
        outputs=answer.outputs,
    )
    return body, _infer_headers(json_length)


def _encode_embeddings(answer: Answer, doc: dict[str, Any]) -> Sent:
    ((tensor, _),) = answer.outputs
    body = openai.encode_embeddings(
        model=answer.served.name,
        vectors=tensor.data,
        base64=openai.wants_base64(doc),
        prompt_tokens=openai.prompt_tokens(answer.served.model, answer.admitted.value),
    )
    return body, JSON


def _as_received(received: Received) -> tuple[bytes | None, ...]:
    return received


def _encoded_size(sent: Sent) -> int:
    return len(sent[0])


# A v2 answer depends on the request's parts as they came, and the model: kept encoded.
_REPLAY: Replay[Received, Sent] = Replay(_as_received, _encoded_size)


def _raw_request(model: Model, body: bytes) -> InferRequest:
    """A raw binary body is the data of the model's one input (Triton's rule)."""
    spec = model.input_specs
    if len(spec) != 1:
        raise ProtocolError(
            f"raw binary request needs a model with exactly 1 input; "
            f"'{model.name}' has {len(spec)}",
            field=HEADER_LENGTH,
        )
    return parse_raw_request(
        body, name=spec[0].name, datatype=spec[0].datatype, shape_without_batch=spec[0].shape
    )


def _infer_headers(json_length: int | None) -> list[tuple[bytes, bytes]]:
    if json_length is None:
        return JSON
    return [
        (b"content-type", b"application/octet-stream"),
        (b"inference-header-content-length", str(json_length).encode()),
    ]


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")
