"""Reference servers, without carpool, answering carpool bench's requests with the least work:
``bare_app`` (ASGI: carpool's recorded response), ``orjson_app`` (ASGI: also JSON to numpy
and back with orjson), ``serve_grpc`` (``python -m benchmarks.harness.frontend_refs PORT
FIXTURE``: grpc.aio replaying ``ModelInfer``). Each reads a pickled :class:`Recording`
(``$FRONTEND_FIXTURE`` or argv); ASGI targets: ``benchmarks.harness.frontend_refs:bare_app``.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

DIM = 512  # the tensor: 512 FP32 each way (2 KiB), in and out of both models
FIXTURE_ENV = "FRONTEND_FIXTURE"
HEADER_LENGTH = b"inference-header-content-length"  # a binary v2 request carries it
MAX_MESSAGE = 2**31 - 1  # as carpool bench and tritonclient set it

Answer = tuple[list[tuple[bytes, bytes]], bytes]  # headers, body
Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True)
class Recording:
    """What carpool answered to the run's requests, by route: the references replay it."""

    model: str  # the v2 model (identity)
    gets: dict[str, Answer]  # path -> answer: metadata, /v1/models, readiness
    json: Answer  # v2 JSON inference
    binary: Answer  # v2 binary inference
    embeddings: Answer  # /v1/embeddings
    grpc_metadata: bytes  # ModelMetadataResponse, serialized
    grpc_infer: bytes  # ModelInferResponse, serialized


def vectors(texts: Any) -> np.ndarray[Any, Any]:
    """One vector per text (``[rows, 1]`` bytes): 0..511 plus the text's UTF-8 length."""
    lengths = np.array([len(bytes(t)) for t in np.asarray(texts).reshape(-1)], np.float32)
    return np.arange(DIM, dtype=np.float32)[None, :] + lengths[:, None]


def load(path: str | None = None) -> Recording:
    with open(path or os.environ[FIXTURE_ENV], "rb") as f:
        recording: Recording = pickle.load(f)  # our own file, written by frontend_check's caller
    return recording


# ------------------------------------------------------------------------------ ASGI


async def _body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _answer(send: Send, answer: Answer, status: int = 200) -> None:
    headers, body = answer
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        kind = message["type"].rsplit(".", 1)[1]  # startup / shutdown
        await send({"type": f"lifespan.{kind}.complete"})
        if kind == "shutdown":
            return


def _replayed(recording: Recording, scope: Scope) -> Answer | None:
    """The recorded answer to a request on this route, or None for an unknown one."""
    path = scope["path"]
    if scope["method"] == "GET":
        return recording.gets.get(path)
    if path == "/v1/embeddings":
        return recording.embeddings
    if path == f"/v2/models/{recording.model}/infer":
        binary = any(name == HEADER_LENGTH for name, _ in scope["headers"])
        return recording.binary if binary else recording.json
    return None


def bare_app() -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """Reads the body, answers carpool's recorded bytes: HTTP's own cost."""
    recording = load()
    missing: Answer = ([(b"content-type", b"text/plain")], b"not found")

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            return await _lifespan(receive, send)
        await _body(receive)
        answer = _replayed(recording, scope)
        await _answer(send, answer or missing, 200 if answer else 404)

    return app


def orjson_app() -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """Like ``bare_app``, but decodes JSON bodies into numpy and encodes the answers."""
    recording = load()
    v2, openai = orjson.loads(recording.json[1]), orjson.loads(recording.embeddings[1])
    json_headers = [(b"content-type", b"application/json")]
    replay = bare_app()

    def infer(doc: dict[str, Any]) -> bytes:
        tensor = doc["inputs"][0]
        data = np.asarray(tensor["data"], np.float32)  # the identity model's whole work
        out = {**v2["outputs"][0], "shape": tensor["shape"], "data": data}
        return orjson.dumps({**v2, "outputs": [out]}, option=orjson.OPT_SERIALIZE_NUMPY)

    def embeddings(doc: dict[str, Any]) -> bytes:
        vector = vectors(np.array([[doc["input"].encode()]], object))[0]
        item = {**openai["data"][0], "embedding": vector}
        answer = {**openai, "data": [item], "model": doc["model"]}
        return orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)

    routes = {f"/v2/models/{recording.model}/infer": infer, "/v1/embeddings": embeddings}

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        route = routes.get(scope["path"]) if scope["type"] == "http" else None
        binary = route is not None and any(name == HEADER_LENGTH for name, _ in scope["headers"])
        if route is None or binary or scope["method"] != "POST":
            return await replay(scope, receive, send)
        body = route(orjson.loads(await _body(receive)))
        length = str(len(body)).encode()
        await _answer(send, ([*json_headers, (b"content-length", length)], body))

    return app


# ------------------------------------------------------------------------------ gRPC


async def serve_grpc(port: int, recording: Recording) -> None:
    """A ``grpc.aio`` server on 127.0.0.1:``port`` until the process is stopped."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pb_grpc

    infer = pb.ModelInferResponse.FromString(recording.grpc_infer)
    metadata = pb.ModelMetadataResponse.FromString(recording.grpc_metadata)

    class Servicer(pb_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
        async def ModelInfer(self, request: Any, context: Any) -> Any:
            return infer

        async def ModelMetadata(self, request: Any, context: Any) -> Any:
            return metadata

        async def ServerReady(self, request: Any, context: Any) -> Any:
            return pb.ServerReadyResponse(ready=True)

    options = [
        ("grpc.max_send_message_length", MAX_MESSAGE),
        ("grpc.max_receive_message_length", MAX_MESSAGE),
    ]
    server = grpc.aio.server(options=options)
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(Servicer(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(serve_grpc(int(sys.argv[1]), load(sys.argv[2])))
