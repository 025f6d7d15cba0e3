"""The one request per protocol that ``carpool bench --distinct 1 --seed 0`` sends (built
with carpool bench's own code), carpool's answers to them recorded for the references to
replay (:class:`frontend_refs.Recording`), and any server's answer compared with carpool's.
Used by the protocols' ``frontend_cpu`` and the server group; prints nothing.
"""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from benchmarks.harness.frontend_refs import Answer, Recording

INFER = "/inference.GRPCInferenceService/ModelInfer"
METADATA = "/inference.GRPCInferenceService/ModelMetadata"
DROPPED = {b"date", b"server", b"connection", b"keep-alive"}  # per answer, or uvicorn's own


@dataclass(frozen=True)
class Requests:
    """The request of each protocol, as carpool bench sends it, and its input data."""

    data: np.ndarray[Any, Any]  # the FP32 [1, 512] input of the v2 requests
    json: tuple[bytes, dict[str, str]]  # body, headers
    binary: tuple[bytes, dict[str, str]]
    grpc: bytes  # a serialized ModelInferRequest
    embeddings: bytes  # the /v1/embeddings body


def fetch(base: str, method: str, path: str, body: bytes = b"", headers: Any = None) -> Answer:
    """One request; the answer's headers (lower-case, less per-answer ones) and body.
    ``RuntimeError`` for a status other than 200."""
    parts = urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
    try:
        conn.request(method, path, body=body or None, headers=dict(headers or {}))
        response = conn.getresponse()
        data = response.read()
    finally:
        conn.close()
    if response.status != 200:
        raise RuntimeError(f"{method} {base}{path} answered {response.status}: {data[:300]!r}")
    kept = [(k.lower().encode(), v.encode()) for k, v in response.getheaders()]
    return [(k, v) for k, v in kept if k not in DROPPED], data


def grpc_call(port: int, method: str, body: bytes) -> bytes:
    """One unary gRPC call with bytes in and out (no protobuf on our side)."""
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return bytes(channel.unary_unary(method)(body, timeout=30))


def requests(base: str, model: str, embed: str) -> Requests:
    """What carpool bench sends ``model`` (and ``embed`` over OpenAI) at ``base``."""
    from carpool.bench.targets import payload
    from carpool.bench.targets.grpc_target import encode_request
    from carpool.bench.targets.openai_target import embedding_bodies
    from carpool.bench.targets.sentences import SENTENCES

    metadata = json.loads(fetch(base, "GET", f"/v2/models/{model}")[1])
    spec = payload.spec_from_metadata(metadata, rows=1)
    (request,) = payload.generate(spec, 1, seed=0)
    return Requests(
        data=np.asarray(request[spec.inputs[0].name], np.float32),
        json=payload.encode(request, spec, binary=False),
        binary=payload.encode(request, spec, binary=True),
        grpc=encode_request(request, spec, model=model),
        embeddings=embedding_bodies(SENTENCES, model=embed, count=1)[0],
    )


def record(base: str, grpc_port: int, model: str, sent: Requests) -> Recording:
    """carpool's answers to every route the references serve."""
    from tritonclient.grpc import service_pb2 as pb

    paths = (f"/v2/models/{model}", f"/v2/models/{model}/ready", "/v1/models", "/v2/health/ready")
    infer = f"/v2/models/{model}/infer"
    metadata = pb.ModelMetadataRequest(name=model).SerializeToString()
    return Recording(
        model=model,
        gets={path: fetch(base, "GET", path) for path in paths},
        json=fetch(base, "POST", infer, *sent.json),
        binary=fetch(base, "POST", infer, *sent.binary),
        embeddings=fetch(base, "POST", "/v1/embeddings", sent.embeddings, _JSON),
        grpc_metadata=grpc_call(grpc_port, METADATA, metadata),
        grpc_infer=grpc_call(grpc_port, INFER, sent.grpc),
    )


def answer(protocol: str, base: str, grpc_port: int, model: str, sent: Requests) -> Answer:
    """A server's answer to the request of ``protocol`` (gRPC: no headers)."""
    infer = f"/v2/models/{model}/infer"
    if protocol == "grpc":
        return [], grpc_call(grpc_port, INFER, sent.grpc)
    if protocol == "openai":
        return fetch(base, "POST", "/v1/embeddings", sent.embeddings, _JSON)
    return fetch(base, "POST", infer, *(sent.json if protocol == "json" else sent.binary))


def outputs(protocol: str, got: Answer) -> tuple[dict[str, Any], np.ndarray[Any, Any]]:
    """An answer's document without its tensor, and its tensor (as float32)."""
    from tritonclient.grpc import service_pb2 as pb

    headers, body = got
    if protocol == "grpc":
        message = pb.ModelInferResponse.FromString(body)
        tensor = np.frombuffer(message.raw_output_contents[0], "<f4")
        del message.raw_output_contents[:]
        return {"message": message.SerializeToString()}, tensor
    split = dict(headers).get(b"inference-header-content-length")
    doc = json.loads(body[: int(split)] if split else body)
    if protocol == "openai":
        return doc, np.asarray(doc["data"][0].pop("embedding"), np.float32)
    out = doc["outputs"][0]
    if split:
        return doc, np.frombuffer(body[int(split) :], "<f4")
    return doc, np.asarray(out.pop("data"), np.float32)


def compare(protocol: str, got: Answer, carpool: Answer, expected: Any) -> str:
    """'ok' when ``got`` carries carpool's answer (the same headers but for the length of a
    JSON answer, whose floats may be written otherwise; the same document; the same
    tensor, which is ``expected``), else what differs."""
    doc, tensor = outputs(protocol, got)
    carpool_doc, carpool_tensor = outputs(protocol, carpool)
    skip = {b"content-length"} if protocol in ("json", "openai") else set()
    heads = [{k: v for k, v in h if k not in skip} for h in (got[0], carpool[0])]
    if heads[0] != heads[1]:
        return f"headers {heads[0]} != carpool's {heads[1]}"
    if doc != carpool_doc:
        return f"answer {str(doc)[:200]} != carpool's {str(carpool_doc)[:200]}"
    if not np.array_equal(carpool_tensor, np.asarray(expected, np.float32).ravel()):
        return "carpool's tensor is not the expected one"
    return "ok" if np.array_equal(tensor, carpool_tensor) else "tensor differs from carpool's"


_JSON = {"Content-Type": "application/json"}
