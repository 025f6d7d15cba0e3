"""A model behind a v2 gRPC server (carpool, Triton), as ``carpool bench`` measures it:
``grpc://HOST:PORT``, requests serialized once with ``raw_input_contents``, batching figures
from ``ModelStatistics``. grpcio and tritonclient's stubs are imported only when a server is
reached."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import import_module
from typing import Any
from urllib.parse import urlsplit

from carpool.bench.report.data import ServerSide
from carpool.bench.report.scrape import Histograms, exact_buckets, server_side
from carpool.bench.targets.base import BenchError, Client, Send

__all__ = [
    "GrpcAddress",
    "GrpcClient",
    "GrpcStats",
    "GrpcTarget",
    "encode_request",
    "parse_grpc",
    "stats_of",
]

SCHEME = "grpc://"
SERVICE = "/inference.GRPCInferenceService"
INFER = SERVICE + "/ModelInfer"  # called with bytes in and out: no protobuf per request
CONTROL_TIMEOUT_S = 10.0  # metadata and statistics: a server that cannot answer these is down
MAX_MESSAGE = 2**31 - 1  # as tritonclient sets it: outputs of any size come back
_INSTALL = "grpc:// targets need grpcio and tritonclient's stubs: pip install 'tritonclient[grpc]'"


@dataclass(frozen=True, slots=True)
class GrpcAddress:
    """``grpc://HOST:PORT`` and the model asked for there."""

    address: str  # host:port, as grpc takes it
    model: str
    version: str = ""  # "": the server's choice, as in ModelMetadataRequest

    def __str__(self) -> str:
        suffix = f"/versions/{self.version}" if self.version else ""
        return f"{SCHEME}{self.address}/v2/models/{self.model}{suffix}"


def parse_grpc(text: str, model: str | None) -> GrpcAddress:
    """``grpc://HOST:PORT`` with ``model`` (``--model``), or the model named in the path as
    an HTTP target names it (``grpc://HOST:PORT/v2/models/NAME[/versions/V]``).
    :class:`BenchError` when no model, or two different ones, are named."""
    parts = urlsplit(text)
    segments = [s for s in parts.path.split("/") if s]
    version = ""
    if len(segments) == 5 and segments[3] == "versions":
        version = segments.pop()
        segments.pop()
    named = segments[2] if len(segments) == 3 and segments[:2] == ["v2", "models"] else None
    if parts.scheme != "grpc" or not parts.hostname or not parts.port or (segments and not named):
        raise BenchError(
            f"TARGET {text!r} must be grpc://HOST:PORT (with --model NAME) or "
            "grpc://HOST:PORT/v2/models/NAME"
        )
    if named and model and named != model:
        raise BenchError(f"TARGET {text!r} names model {named!r} but --model says {model!r}")
    if not (named or model):
        raise BenchError(f"TARGET {text!r} names no model: add --model NAME")
    return GrpcAddress(parts.netloc, str(named or model), version)


def encode_request(
    request: Mapping[str, Any], spec: Any, *, model: str, version: str = ""
) -> bytes:
    """One serialized ``ModelInferRequest``: the inputs of ``spec`` (a
    :class:`~carpool.bench.targets.payload.RequestSpec`) with their bytes in ``raw_input_contents``,
    laid out as the binary tensor extension lays them out; no outputs named (all of them
    come back). Raises ``ValueError`` for a missing input or an array its datatype cannot
    carry."""
    from carpool.bench.targets.payload import checked_inputs
    from carpool.server.tensors import array_to_wire

    pb = _stubs()[0]
    message = pb.ModelInferRequest(model_name=model, model_version=version)
    for name, datatype, array in checked_inputs(request, spec):
        message.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
        message.raw_input_contents.append(bytes(array_to_wire(array, datatype=datatype, name=name)))
    return bytes(message.SerializeToString())


@dataclass(frozen=True, slots=True)
class GrpcStats:
    """One model's ``ModelStatistics`` at one call, counted since the server started."""

    executions: int
    inferences: int
    batch_sizes: dict[int, int]  # batch size -> model calls with that many rows
    queue_count: int
    queue_ns: int
    model_ns: int  # summed over model calls


def stats_of(statistics: Any) -> GrpcStats:
    """:class:`GrpcStats` from a ``ModelStatistics`` message. Model time: the per batch
    size ``compute_infer`` durations, one per model call (carpool and Triton fill them),
    else the request-level ``compute_infer`` (Triton's counts each batch once per request)."""
    inference = statistics.inference_stats
    per_size = sum(int(b.compute_infer.ns) for b in statistics.batch_stats)
    return GrpcStats(
        executions=int(statistics.execution_count),
        inferences=int(statistics.inference_count),
        batch_sizes={int(b.batch_size): int(b.compute_infer.count) for b in statistics.batch_stats},
        queue_count=int(inference.queue.count),
        queue_ns=int(inference.queue.ns),
        model_ns=per_size or int(inference.compute_infer.ns),
    )


def _snapshot(stats: GrpcStats, largest: int) -> Histograms:
    # As a scrape of /metrics reads it, with a bucket per batch size: the sizes are exact.
    return Histograms(
        batch_count=stats.executions,
        batch_rows=stats.inferences,
        batch_buckets=exact_buckets(stats.batch_sizes, largest),
        queue_wait_count=stats.queue_count,
        queue_wait_sum=stats.queue_ns / 1e9,
        model_count=stats.executions,
        model_sum=stats.model_ns / 1e9,
    )


# By name, so that neither package's lack of type information reaches mypy.
def _stubs() -> tuple[Any, Any]:
    """tritonclient's generated ``service_pb2`` and ``service_pb2_grpc``."""
    try:
        names = ("tritonclient.grpc.service_pb2", "tritonclient.grpc.service_pb2_grpc")
        return import_module(names[0]), import_module(names[1])
    except ImportError:
        raise BenchError(_INSTALL) from None


def _aio() -> Any:
    try:
        return import_module("grpc.aio")
    except ImportError:
        raise BenchError(_INSTALL) from None


def _channel(address: str) -> Any:
    sizes = [
        ("grpc.max_send_message_length", MAX_MESSAGE),
        ("grpc.max_receive_message_length", MAX_MESSAGE),
    ]
    return _aio().insecure_channel(address, options=sizes)


def _refused(url: GrpcAddress, exc: Any) -> BenchError:
    code = exc.code()
    details = (exc.details() or "").strip()
    if code.name == "UNAVAILABLE":
        return BenchError(f"cannot reach {SCHEME}{url.address}: {details}; is the server running?")
    return BenchError(f"{url} answered {code.name}: {details}")


class GrpcTarget:
    """A model behind a v2 gRPC server."""

    kind = "grpc"

    def __init__(self, url: GrpcAddress, metadata: Mapping[str, Any], stub: Any) -> None:
        self.url = url
        self.metadata = dict(metadata)
        self.name = str(metadata.get("name") or url.model)
        self._stub = stub
        self._stats = True  # until ModelStatistics turns out not to be served

    def __str__(self) -> str:
        return str(self.url)

    @classmethod
    @asynccontextmanager
    async def connect(cls, text: str, model: str | None) -> AsyncIterator[GrpcTarget]:
        """Reach the server and read the model's metadata; :class:`BenchError` when the
        server is unreachable or does not serve that model."""
        url = parse_grpc(text, model)
        aio, (pb, pb_grpc) = _aio(), _stubs()
        async with _channel(url.address) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            request = pb.ModelMetadataRequest(name=url.model, version=url.version)
            try:
                answer = await stub.ModelMetadata(request, timeout=CONTROL_TIMEOUT_S)
            except aio.AioRpcError as exc:
                raise _refused(url, exc) from None
            yield cls(url, metadata_of(answer), stub)

    def client(
        self,
        requests: Sequence[Mapping[str, Any]],
        spec: Any,
        timeout_s: float,
        others: Sequence[Mapping[str, Any]] = (),
        repeat_fraction: float = 1.0,
    ) -> Client:
        """Each request serialized once, ``requests`` sent in turn; with ``others``, a share
        ``1 - repeat_fraction`` of the sends are ``others``' in turn instead.
        ``ValueError`` for a request the spec cannot carry."""
        u = self.url
        bodies, also = (
            tuple(encode_request(r, spec, model=u.model, version=u.version) for r in given)
            for given in (requests, others)
        )
        return GrpcClient(u.address, bodies, timeout_s, also, repeat_fraction)

    async def snapshot(self) -> GrpcStats | None:
        """The model's ``ModelStatistics``; ``None`` when the server does not give them."""
        if not self._stats:
            return None
        pb = _stubs()[0]
        request = pb.ModelStatisticsRequest(name=self.url.model, version=self.url.version)
        try:
            answer = await self._stub.ModelStatistics(request, timeout=CONTROL_TIMEOUT_S)
            stats = stats_of(answer.model_stats[0]) if answer.model_stats else None
        except _aio().AioRpcError as exc:
            stats = None
            if exc.code().name == "UNAVAILABLE":
                return None  # the server went away: the step's errors say so
        self._stats = stats is not None
        return stats

    def server_side(
        self, before: GrpcStats | None, after: GrpcStats | None, latency_sum_s: float
    ) -> ServerSide | None:
        if before is None or after is None:
            return None
        largest = max([*before.batch_sizes, *after.batch_sizes], default=0)
        old, new = _snapshot(before, largest), _snapshot(after, largest)
        return server_side(old, new, latency_sum_s=latency_sum_s)


def metadata_of(answer: Any) -> dict[str, Any]:
    """A ``ModelMetadataResponse`` as the v2 JSON metadata the rest of bench reads."""

    def tensors(items: Any) -> list[dict[str, Any]]:
        return [
            {"name": t.name, "datatype": t.datatype, "shape": [int(d) for d in t.shape]}
            for t in items
        ]

    return {
        "name": answer.name,
        "versions": list(answer.versions),
        "platform": answer.platform,
        "inputs": tensors(answer.inputs),
        "outputs": tensors(answer.outputs),
    }


@dataclass(frozen=True, slots=True)
class GrpcClient:
    """Serialized ``ModelInferRequest`` bytes sent over one channel (one HTTP/2 connection
    that every caller multiplexes over, as tritonclient and perf_analyzer do); answers are
    received as bytes and not parsed. Picklable: each client process opens its own."""

    address: str
    bodies: tuple[bytes, ...]
    timeout_s: float
    others: tuple[bytes, ...] = ()  # --repeat-fraction's others
    repeat_fraction: float = 1.0  # the share of sends that are ``bodies``'

    @asynccontextmanager
    async def open(self, connections: int) -> AsyncIterator[Send]:
        from carpool.bench.targets.payload import is_unique

        rpc_error = _aio().AioRpcError
        async with _channel(self.address) as channel:
            infer = channel.unary_unary(INFER)  # no (de)serializers: bytes both ways
            bodies, n, timeout = self.bodies, len(self.bodies), self.timeout_s
            others, fraction = self.others, self.repeat_fraction

            async def send(i: int) -> str | None:
                if others and is_unique(i, fraction):
                    body = others[i % len(others)]
                else:
                    body = bodies[i % n]
                try:
                    await infer(body, timeout=timeout)
                except rpc_error as exc:  # counted by its status code: "UNAVAILABLE", ...
                    return str(exc.code().name)
                except Exception as exc:  # any other failure is counted by its kind
                    return type(exc).__name__
                return None

            yield send
