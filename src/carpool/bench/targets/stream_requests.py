"""The requests a streaming run (``--stream``) cycles through: the generated or given inputs,
each paired with a requested length from ``--lengths`` sent as the ``--length-parameter``
request parameter; encoded once, as generate_stream's JSON or a ModelStreamInfer request."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from carpool.bench.options import Options

__all__ = ["LENGTHS_DRAWN", "StreamRequest", "generate_body", "stream_requests"]

Array = np.ndarray[Any, Any]
# Requests drawn when lengths vary: enough for a distribution's shape, cheap to encode.
LENGTHS_DRAWN = 1024


@dataclass(frozen=True, slots=True)
class StreamRequest:
    """One request: its inputs as the request spec shapes them, and its parameters."""

    values: dict[str, Array]
    parameters: dict[str, int]

    def row(self, batched: bool) -> dict[str, Array]:
        """The inputs of its one row (without the batch axis when ``batched``)."""
        return {k: v[0] if batched else v for k, v in self.values.items()}


def stream_requests(
    requests: Sequence[Mapping[str, Array]], options: Options
) -> list[StreamRequest]:
    """``requests`` (as :func:`~carpool.bench.targets.remote.requests_for` makes them),
    cycled and paired with lengths drawn from ``--lengths`` (seeded by ``--seed``); as they
    are, without parameters, when no lengths are asked for."""
    lengths = options.lengths
    if lengths is None:
        return [StreamRequest(dict(r), {}) for r in requests]
    count = len(requests) if lengths.kind == "fixed" else max(len(requests), LENGTHS_DRAWN)
    drawn = lengths.draw(count, seed=options.seed)
    name = options.length_parameter
    return [
        StreamRequest(dict(requests[i % len(requests)]), {name: n}) for i, n in enumerate(drawn)
    ]


def generate_body(request: StreamRequest) -> bytes:
    """The generate extension's JSON body: a field per input (a lone element as itself, BYTES
    as text) and ``parameters``."""
    doc: dict[str, Any] = {}
    for name, array in request.values.items():
        items = [_element(x) for x in np.asarray(array).reshape(-1).tolist()]
        doc[name] = items[0] if len(items) == 1 else items
    if request.parameters:
        doc["parameters"] = request.parameters
    return orjson.dumps(doc)


def _element(x: Any) -> Any:
    return x.decode("utf-8", errors="replace") if isinstance(x, bytes) else x
