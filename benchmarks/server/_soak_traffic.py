"""``soak``'s traffic: the request mix, each arrival's v2 body (from data rendered once, so
the client's core sends rather than encodes) and the one outcome it ends in, as the client
saw it; a cancellation is written whole on a raw connection of its own, then closed.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

MODEL = "demo"  # 256 FP32 in, 8 FP32 out
FEATURES, OUTPUTS = 256, 8
ROWS = range(1, 9)  # rows per request: 1..8, so requests share batches unevenly
PRIORITIES = (0, 1, 2, 3)  # 0 = the model's default level; the server has 3 levels
BAD_P = 0.02  # wrong shape, wrong datatype, unknown model, malformed JSON: a 4xx each
CANCEL_P = 0.02  # the client closes its connection before the answer
TIMEOUT_P = 0.10  # a short queue timeout, expected to expire now and then
TIMEOUTS_US = (2_000, 10_000, 50_000)  # Triton's `timeout` parameter is in microseconds
CANCEL_AFTER_S = (0.0, 0.006)  # a cancellation closes after U(this) s: queued or running
BINARY_P = 0.5  # binary tensor extension both ways, else JSON both ways
ANSWER_WITHIN_S = 60.0  # a request not answered by then is lost
BAD_KINDS = ("shape", "datatype", "model", "json")

HEADER_LENGTH = "Inference-Header-Content-Length"

# The outcomes a request ends in, as the client saw it. The first five are expected.
OK, EXPIRED, QUEUE_FULL, REFUSED, CANCELLED = "ok", "expired", "queue full", "4xx", "cancelled"
WRONG, UNEXPECTED, LOST = "wrong answer", "unexpected status", "lost"
OUTCOMES = (OK, EXPIRED, QUEUE_FULL, REFUSED, CANCELLED, WRONG, UNEXPECTED, LOST)


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request of the mix."""

    id: int
    rows: int
    binary: bool
    priority: int
    timeout_us: int | None = None
    bad: str | None = None  # one of BAD_KINDS
    cancel_after_s: float | None = None

    @property
    def model(self) -> str:
        return "no-such-model" if self.bad == "model" else MODEL


def draw(rng: random.Random, n: int, *, good_only: bool = False) -> Arrival:
    """The ``n``-th request of the mix (``good_only``: no bad, cancelled or timed request,
    as the capacity step sends)."""
    rows, binary, priority = rng.choice(ROWS), rng.random() < BINARY_P, rng.choice(PRIORITIES)
    if good_only:
        return Arrival(n, rows, binary, priority)
    u = rng.random()
    if u < BAD_P:
        return Arrival(n, rows, False, priority, bad=rng.choice(BAD_KINDS))
    if u < BAD_P + CANCEL_P:
        return Arrival(n, rows, binary, priority, cancel_after_s=rng.uniform(*CANCEL_AFTER_S))
    if u < BAD_P + CANCEL_P + TIMEOUT_P:
        return Arrival(n, rows, binary, priority, timeout_us=rng.choice(TIMEOUTS_US))
    return Arrival(n, rows, binary, priority)


class Bodies:
    """Request bodies, from row data rendered once per row count (seeded)."""

    def __init__(self, seed: int = 0) -> None:
        rng = random.Random(seed)
        values = [rng.uniform(-1.0, 1.0) for _ in range(FEATURES * max(ROWS))]
        self._json: dict[int, bytes] = {}
        self._wire: dict[int, bytes] = {}
        for rows in ROWS:
            data = values[: rows * FEATURES]
            self._json[rows] = orjson.dumps(data)
            self._wire[rows] = array.array("f", data).tobytes()  # little-endian hosts

    def build(self, a: Arrival) -> tuple[str, bytes, dict[str, str]]:
        """``a``'s path, body and headers."""
        params: dict[str, Any] = {}
        if a.priority:
            params["priority"] = a.priority
        if a.timeout_us:
            params["timeout"] = a.timeout_us
        shape = [a.rows, FEATURES - 1 if a.bad == "shape" else FEATURES]
        datatype = "INT32" if a.bad == "datatype" else "FP32"
        tensor: dict[str, Any] = {"name": "INPUT0", "datatype": datatype, "shape": shape}
        path = f"/v2/models/{a.model}/infer"
        if a.binary:
            params["binary_data_output"] = True
            tensor["parameters"] = {"binary_data_size": len(self._wire[a.rows])}
            head = orjson.dumps({"id": str(a.id), "parameters": params, "inputs": [tensor]})
            headers = {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(head))}
            return path, head + self._wire[a.rows], headers
        doc = orjson.dumps({"id": str(a.id), "parameters": params, "inputs": [tensor]})
        data = self._json[a.rows]
        if a.bad == "shape":  # as many elements as the shape it declares
            data = orjson.dumps(orjson.loads(data)[: a.rows * (FEATURES - 1)])
        body = doc[:-3] + b',"data":' + data + b"}]}"  # ...}]} -> ..., "data": [...]}]}
        if a.bad == "json":
            body = body[: len(body) // 2]
        return path, body, {"Content-Type": "application/json"}


@dataclass
class Tally:
    """What the client counted: every request sent, by kind and outcome."""

    sent: Counter[str] = field(default_factory=Counter)  # by model
    outcomes: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)  # of the answered, by status
    model_statuses: Counter[int] = field(default_factory=Counter)  # answered, for MODEL
    surprises: list[str] = field(default_factory=list)  # the first few unexpected ends

    def note(self, outcome: str, what: str = "") -> str:
        self.outcomes[outcome] += 1
        if outcome in (WRONG, UNEXPECTED, LOST) and len(self.surprises) < 10:
            self.surprises.append(f"{outcome}: {what}"[:300])
        return outcome


async def send(
    session: aiohttp.ClientSession, base: str, a: Arrival, bodies: Bodies, tally: Tally
) -> str:
    """Send ``a`` over the session's pool and classify its answer; returns the outcome."""
    path, body, headers = bodies.build(a)
    tally.sent[a.model] += 1
    try:
        async with session.post(base + path, data=body, headers=headers) as response:
            status, payload = response.status, await response.read()
            split = response.headers.get(HEADER_LENGTH)
    except (TimeoutError, aiohttp.ClientError) as exc:
        return tally.note(LOST, f"{a} {type(exc).__name__}: {exc}")
    tally.statuses[status] += 1
    if a.model == MODEL:
        tally.model_statuses[status] += 1
    if a.bad is not None:
        expected = 404 if a.bad == "model" else 400
        if status == expected:
            return tally.note(REFUSED)
        return tally.note(UNEXPECTED, f"{a}: {status} {payload[:200]!r}")
    if status == 503:
        text = payload.decode(errors="replace").lower()
        if "queue size" in text:
            return tally.note(QUEUE_FULL)
        if "timeout" in text and a.timeout_us is not None:
            return tally.note(EXPIRED)
    if status != 200:
        return tally.note(UNEXPECTED, f"{a}: {status} {payload[:200]!r}")
    return tally.note(_check(a, payload, split))


def _check(a: Arrival, payload: bytes, split: str | None) -> str:
    """``OK`` if the answer is ``a``'s: its id echoed, ``rows`` x 8 FP32 out."""
    try:
        doc = orjson.loads(payload[: int(split)] if split else payload)
        (out,) = doc["outputs"]
        good = doc.get("id") == str(a.id) and out["shape"] == [a.rows, OUTPUTS]
        if a.binary:
            good = good and out["parameters"]["binary_data_size"] == 4 * a.rows * OUTPUTS
        else:
            good = good and len(out["data"]) == a.rows * OUTPUTS
    except (ValueError, KeyError, TypeError):
        good = False
    return OK if good else WRONG


async def cancel(host: str, port: int, a: Arrival, bodies: Bodies, tally: Tally) -> str:
    """Write ``a`` whole on a connection of its own, wait, then close the connection
    without reading: the server has the request and must answer it into the void."""
    path, body, headers = bodies.build(a)
    head = f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: {len(body)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    tally.sent[a.model] += 1
    try:
        _, writer = await asyncio.open_connection(host, port)
    except OSError as exc:
        return tally.note(LOST, f"{a} connect: {exc}")
    try:
        writer.write(head.encode() + body)
        await writer.drain()
        await asyncio.sleep(a.cancel_after_s or 0.0)
    except OSError as exc:  # not sent whole: the server may not know of it
        return tally.note(LOST, f"{a} write: {exc}")
    finally:
        writer.close()
        with contextlib.suppress(OSError):  # the server may have closed it first
            await writer.wait_closed()
    return tally.note(CANCELLED)
