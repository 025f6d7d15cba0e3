"""``benchmarks.streams.synthetic``'s ``litserve`` row: the synthetic model behind LitServe's
batched streaming, ``LitAPI(max_batch_size=..., stream=True)``, run by the LitServe venv's
python (``setup_litserve.sh``). A batch's ``predict`` is a generator yielding one output per
member a step; a member that ended gets nothing more, but its stream ends with its batch
(LitServe#45). ``python -m benchmarks.streams._litserve_app PORT FIXED_MS PER_MS BATCH WAIT_MS``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import litserve as ls

from benchmarks.streams._models import Synthetic, held_batch

Row = list[int | None]  # a step's outputs, one per member of the batch (None: it ended)


class SyntheticAPI(ls.LitAPI):  # type: ignore[misc]
    def __init__(self, fixed_s: float, per_s: float, batch: int, wait_s: float) -> None:
        super().__init__(max_batch_size=batch, batch_timeout=wait_s, stream=True)
        self._costs = fixed_s, per_s

    def setup(self, device: str) -> None:
        self.model = Synthetic(*self._costs)

    def decode_request(self, request):  # type: ignore[no-untyped-def]
        # unannotated: LitServe reads the parameter's annotation as the body's type
        return int(request["key"]), int(request["length"])

    def batch(self, inputs: list[tuple[int, int]]) -> list[tuple[int, int]]:
        return list(inputs)

    def predict(self, jobs: list[tuple[int, int]]) -> Iterator[Row]:
        """Step the members that have not ended, until none is left: static batching."""
        yield from held_batch(self.model, jobs)

    def unbatch(self, rows: Iterator[Row]) -> Iterator[Row]:
        yield from rows

    def encode_response(self, rows: Iterator[Row]) -> Iterator[list[Any]]:
        for row in rows:  # "" writes nothing to an ended member's stream
            yield [{"value": v} if v is not None else "" for v in row]


def main(argv: list[str]) -> None:
    port, fixed_ms, per_ms, batch, wait_ms = argv
    api = SyntheticAPI(
        float(fixed_ms) / 1000, float(per_ms) / 1000, int(batch), float(wait_ms) / 1000
    )
    # timeout off: a request may wait several batches of up to 512 steps (LitServe's 30 s
    # default would answer it 504); fast_queue: ZeroMQ between the API server and the worker
    server = ls.LitServer(
        api, accelerator="cpu", workers_per_device=1, timeout=False, fast_queue=True
    )
    server.run(host="127.0.0.1", port=int(port), num_api_servers=1, log_level="warning",
               generate_client_file=False)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
