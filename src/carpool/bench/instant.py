"""A v2 server that answers at once, so the load generator's own ceiling can be measured
(``python -m carpool.bench.instant --port N``). Canned answers over HTTP/1.1 on a raw
:class:`asyncio.Protocol`; bodies are counted, never parsed. Stdlib only and no carpool
import, so it starts in milliseconds."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from collections.abc import Callable, Sequence
from typing import cast

__all__ = ["InstantProtocol", "main", "serve"]

FEATURES = 256  # the demo model's row: requests of the size a real client sends
OUTPUTS = 8

_INFER_BODY = json.dumps(
    {
        "model_name": "instant",
        "model_version": "1",
        "outputs": [
            {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, OUTPUTS], "data": [0.0] * OUTPUTS}
        ],
    },
    separators=(",", ":"),
).encode()

_MAX_HEAD = 64 * 1024  # a request head beyond this is not a client we serve


def _response(status: str, body: bytes, *, close: bool = False) -> bytes:
    connection = b"close" if close else b"keep-alive"
    return (
        b"HTTP/1.1 " + status.encode() + b"\r\nContent-Type: application/json\r\n"
        b"Content-Length: "
        + str(len(body)).encode()
        + b"\r\nConnection: "
        + connection
        + b"\r\n\r\n"
        + body
    )


_INFER_RESPONSE = _response("200 OK", _INFER_BODY)
_NOT_FOUND = _response("404 Not Found", b'{"error":"not found"}')


def _metadata(name: str) -> bytes:
    doc = {
        "name": name,
        "versions": ["1"],
        "platform": "instant",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, FEATURES]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, OUTPUTS]}],
    }
    return json.dumps(doc).encode()


def _answer(method: bytes, target: bytes) -> bytes:
    """The response to one request; the hot path (infer) is a constant."""
    path = target.split(b"?", 1)[0].rstrip(b"/")
    if method == b"POST" and path.endswith(b"/infer"):
        return _INFER_RESPONSE
    if method != b"GET":
        return _NOT_FOUND
    parts = path.decode("latin-1").split("/")  # ["", "v2", "models", NAME, ...]
    if path == b"/v2/health/live":
        return _response("200 OK", b'{"live":true}')
    if path == b"/v2/health/ready":
        return _response("200 OK", b'{"ready":true}')
    if path == b"/v2":
        return _response("200 OK", b'{"name":"instant","version":"1","extensions":[]}')
    if len(parts) >= 4 and parts[1:3] == ["v2", "models"] and parts[3]:
        rest = parts[4:]
        if rest and rest[-1] == "ready":
            return _response("200 OK", json.dumps({"name": parts[3], "ready": True}).encode())
        if not rest or (len(rest) == 2 and rest[0] == "versions"):
            return _response("200 OK", _metadata(parts[3]))
    return _NOT_FOUND


class InstantProtocol(asyncio.Protocol):
    """One connection: parse request heads, skip bodies, answer each in order (pipelining
    included); all responses to one read leave in one write."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._skip = 0  # body bytes of the current request still to arrive

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None

    def data_received(self, data: bytes) -> None:
        transport = self._transport
        if transport is None:
            return
        self._buffer += data
        out, close = self._answer_buffered()
        if out:
            transport.write(b"".join(out))
        if close:
            transport.close()

    def _answer_buffered(self) -> tuple[list[bytes], bool]:
        """Responses to every whole request head buffered, bodies skipped; and whether the
        connection closes after the last."""
        buffer = self._buffer
        out: list[bytes] = []
        while True:
            if self._skip:
                taken = min(self._skip, len(buffer))
                del buffer[:taken]
                self._skip -= taken
                if self._skip:
                    return out, False
                continue
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > _MAX_HEAD:
                    out.append(_response("431 Request Header Fields Too Large", b"{}", close=True))
                    return out, True
                return out, False
            head = bytes(buffer[:end])
            del buffer[: end + 4]
            response, self._skip, close = _reply(head)
            out.append(response)
            if close:
                return out, True


def _reply(head: bytes) -> tuple[bytes, int, bool]:
    """The response to one request head, the length of the body to skip, and whether the
    connection closes after it."""
    lines = head.split(b"\r\n")
    request = lines[0].split(b" ")
    if len(request) != 3:
        return _response("400 Bad Request", b'{"error":"bad request"}', close=True), 0, True
    method, target, version = request
    length, close, chunked = _headers(lines[1:], close=version != b"HTTP/1.1")
    if chunked:  # no client of ours sends it; refuse rather than misparse
        return _response("501 Not Implemented", b'{"error":"chunked"}', close=True), 0, True
    response = _answer(method, target)
    if close:
        response = response.replace(b"Connection: keep-alive", b"Connection: close", 1)
    return response, length, close


def _headers(lines: Sequence[bytes], *, close: bool) -> tuple[int, bool, bool]:
    """Content-Length, whether to close (``close``: the HTTP version's default), chunked."""
    length = 0
    chunked = False
    for line in lines:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value.strip() or b"0")
        elif name == b"connection":
            lowered = value.strip().lower()
            close = lowered == b"close" or (close and lowered != b"keep-alive")
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    return length, close, chunked


async def serve(host: str, port: int, *, ready: asyncio.Event | None = None) -> None:
    """Serve until SIGTERM or SIGINT (or cancellation)."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(InstantProtocol, host, port, reuse_address=True, backlog=4096)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready.set()
    sys.stderr.write(f"instant: serving on http://{host}:{port}\n")
    sys.stderr.flush()
    async with server:
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m carpool.bench.instant",
        description="A KServe v2 server that answers every inference at once with a canned "
        "response: run carpool bench against it to measure the load generator's ceiling.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on [127.0.0.1]")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on [8000]")
    args = parser.parse_args(argv)
    loop_factory: Callable[[], asyncio.AbstractEventLoop]
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:  # the stdlib loop: slower, still far faster than any model
        loop_factory = asyncio.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(serve(args.host, args.port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
