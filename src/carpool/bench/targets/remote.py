"""A model behind a server, however ``carpool bench`` reaches it (v2 over HTTP or gRPC, OpenAI
embeddings or chat): the target connected by its kind, and its client with every request
encoded once, before any step. Each protocol's module is imported only when its kind is asked
for."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, cast

import numpy as np

from carpool.bench.options import Options
from carpool.bench.targets.base import BenchError, Client

__all__ = [
    "client_for",
    "connect",
    "conversations_for",
    "others_for",
    "requests_for",
    "stream_client_for",
    "texts_for",
]

_OTHERS_SEED = 1 << 32  # added to --seed: the others share no draw with any run's --distinct


def requests_for(
    metadata: Mapping[str, Any], options: Options, batched: bool | None
) -> tuple[Any, list[dict[str, np.ndarray[Any, Any]]]]:
    """The request spec and the distinct requests a run cycles through: read from
    ``--input-data``, or generated from the metadata (``--strings`` for BYTES elements).
    ``batched``: as :func:`~carpool.bench.targets.payload.spec_from_metadata` takes it."""
    from carpool.bench.targets import payload, requests_file

    try:
        if options.input_data:  # the file gives the shapes; the metadata names and types
            requests = requests_file.read_requests(options.input_data, metadata)
            spec = payload.RequestSpec(
                tuple(
                    payload.InputSpec(t["name"], t["datatype"], tuple(requests[0][t["name"]].shape))
                    for t in metadata["inputs"]
                )
            )
            return spec, requests
        spec = payload.spec_from_metadata(
            metadata, rows=options.rows, shapes=options.shapes, batched=batched
        )
        strings = requests_file.read_strings(options.strings) if options.strings else None
        return spec, payload.generate(spec, options.distinct, seed=options.seed, strings=strings)
    except (OSError, ValueError) as exc:
        raise BenchError(f"requests for model {metadata.get('name')!r}: {exc}") from None


def others_for(spec: Any, options: Options) -> list[dict[str, np.ndarray[Any, Any]]]:
    """``--repeat-fraction``'s others: ``--unique`` requests of random data (BYTES elements
    random words, not ``--strings``: each must differ), none when every request repeats."""
    from carpool.bench.targets import payload

    if options.repeat_fraction >= 1.0:
        return []
    return payload.generate(spec, options.unique, seed=options.seed + _OTHERS_SEED)


def texts_for(options: Options) -> Sequence[str]:
    """An embeddings endpoint's texts: the ``--strings`` file's, or the built-in sentences."""
    from carpool.bench.targets import requests_file
    from carpool.bench.targets.sentences import SENTENCES

    if not options.strings:
        return SENTENCES
    try:
        return requests_file.read_strings(options.strings)
    except (OSError, ValueError) as exc:
        raise BenchError(f"--strings: {exc}") from None


def client_for(target: Any, options: Options) -> Client:
    """The target's client, its requests built (and encoded once) from the options."""
    from carpool.bench.targets import payload
    from carpool.bench.targets.openai_target import embedding_bodies

    try:
        if options.kind == "openai":
            bodies = embedding_bodies(
                texts_for(options),
                model=target.name,
                count=options.distinct,
                rows=options.rows,
                encoding=options.encoding,
            )
            return cast(Client, target.client(bodies, options.timeout_s))
        spec, requests = requests_for(target.metadata, options, batched=None)
        others, fraction = others_for(spec, options), options.repeat_fraction
        if options.kind == "grpc":
            return cast(Client, target.client(requests, spec, options.timeout_s, others, fraction))
        binary = options.encoding == "binary"
        encoded = [payload.encode(r, spec, binary=binary) for r in requests]
        also = [payload.encode(r, spec, binary=binary) for r in others]
        return cast(Client, target.client(encoded, options.timeout_s, also, fraction))
    except ValueError as exc:
        raise BenchError(f"cannot encode requests: {exc}") from None


def conversations_for(options: Options) -> list[list[dict[str, Any]]]:
    """A chat endpoint's conversations: ``--input-data``'s (JSONL, each line an object with
    ``messages``), or one user message per ``--strings`` line (the built-in sentences)."""
    from carpool.bench.targets import requests_file

    if not options.input_data:
        return [[{"role": "user", "content": text}] for text in texts_for(options)]
    try:
        return requests_file.read_conversations(options.input_data)
    except (OSError, ValueError) as exc:
        raise BenchError(f"--input-data: {exc}") from None


def _chat_client(target: Any, options: Options) -> Client:
    from carpool.bench.targets.chat_target import chat_bodies
    from carpool.bench.targets.stream_requests import LENGTHS_DRAWN

    lengths = options.lengths
    drawn: list[int | None] = [None]
    if lengths is not None:
        drawn = [int(n) for n in lengths.draw(1 if lengths.kind == "fixed" else LENGTHS_DRAWN,
                                              seed=options.seed)]  # fmt: skip
    bodies = chat_bodies(conversations_for(options), model=target.name, lengths=drawn)
    return cast(Client, target.client(bodies, options.timeout_s))


def stream_client_for(target: Any, options: Options) -> Client:
    """``--stream``: the client of a target's streams (generate_stream over HTTP,
    ModelStreamInfer over gRPC, OpenAI chat's events), every request encoded once."""
    from carpool.bench.targets import stream_clients
    from carpool.bench.targets.stream_requests import generate_body, stream_requests

    if options.kind == "chat":
        return _chat_client(target, options)
    spec, requests = requests_for(target.metadata, options, batched=None)
    streams = stream_requests(requests, options)
    try:
        if options.kind == "grpc":
            u = target.url
            bodies = stream_clients.stream_bodies(streams, spec, u.model, u.version)
            return stream_clients.GrpcStreamClient(u.address, bodies, options.timeout_s)
        url = target.url.metadata + "/generate_stream"
        encoded = tuple(generate_body(r) for r in streams)
        return stream_clients.SseClient(url, encoded, options.timeout_s)
    except ValueError as exc:
        raise BenchError(f"cannot encode requests: {exc}") from None


def connect(options: Options) -> AbstractAsyncContextManager[Any]:
    """The target a remote TARGET names, by its kind; as an async context manager."""
    if options.kind == "grpc":
        from carpool.bench.targets.grpc_target import GrpcTarget

        return GrpcTarget.connect(options.target, options.model)
    if options.kind == "openai":
        from carpool.bench.targets.openai_target import OpenAITarget

        return OpenAITarget.connect(options.target, options.model)
    if options.kind == "chat":
        from carpool.bench.targets.chat_target import ChatTarget

        return ChatTarget.connect(options.target, options.model)
    from carpool.bench.targets.http_target import HttpTarget

    return HttpTarget.connect(options.target)
