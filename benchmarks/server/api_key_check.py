"""What checking an API key costs a request: ``carpool serve --api-key``'s whole check
(``auth.is_open``, then ``ApiKeys.allows``) timed with ``timeit`` on tritonclient's headers,
for 1 and 3 served keys, the key right, wrong or missing. Goal: < 2 us a request.

    python -m benchmarks.server.api_key_check [--quick]
"""

from __future__ import annotations

import argparse
import timeit
from typing import Any

from benchmarks.harness import Figures, common, run

GOAL_US = 2.0
PATH = "/v2/models/scorer/infer"
# What tritonclient.http's infer sends (geventhttpclient), as uvicorn gives it in the scope.
HEADERS = [
    (b"host", b"carpool.internal:8000"),
    (b"user-agent", b"python/gevent-http-client-2.3.1"),
    (b"accept-encoding", b"gzip, deflate"),
    (b"connection", b"keep-alive"),
    (b"content-type", b"application/octet-stream"),
    (b"inference-header-content-length", b"176"),
    (b"content-length", b"1200"),
    (b"traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
]
KEYS = ["c2VydmluZy1rZXktb25l-2f8a", "c2VydmluZy1rZXktdHdv-9b1c", "c2VydmluZy1rZXktdGhy-4e7d"]
# (figure's stem, what the table shows, the headers it adds)
CASES: list[tuple[str, str, list[tuple[bytes, bytes]]]] = [
    ("bearer_right", "Authorization: Bearer (right)",
     [(b"authorization", f"Bearer {KEYS[0]}".encode())]),
    ("x_api_key_right", "x-api-key (right)", [(b"x-api-key", KEYS[0].encode())]),
    ("x_api_key_wrong", "x-api-key (wrong)", [(b"x-api-key", b"not-a-served-key-0000000")]),
    ("no_key", "no key", []),
]  # fmt: skip


def scope(extra: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": PATH, "headers": HEADERS + extra}


def check_us(keys: Any, request: dict[str, Any], number: int, repeats: int) -> float:
    """Median microseconds of the app's check, as ``App._http`` runs it."""
    from carpool.server.auth import is_open

    def check() -> bool:
        parts = request["path"].strip("/").split("/")
        return is_open(parts, metrics_need_key=False) or keys.allows(request["headers"])

    times = timeit.repeat(check, number=number, repeat=repeats)
    return common.median(times) / number * 1e6


def parser() -> argparse.ArgumentParser:
    return common.base_parser(__doc__, default_cpus="0", default_repeats=7)


def measure(args: argparse.Namespace) -> Figures:
    common.pin(common.parse_cpus(args.cpus))
    from carpool.server.auth import ApiKeys

    repeats = args.repeats or (1 if args.quick else 7)
    number = 2_000 if args.quick else 100_000
    common.header(
        "API-key check per request", {"cpus": args.cpus, "repeats": repeats, "number": number}
    )
    figures = Figures()
    rows = []
    worst = 0.0
    for served in (1, 3):
        keys = ApiKeys(KEYS[:served])
        for stem, name, extra in CASES:
            us = check_us(keys, scope(extra), number, repeats)
            worst = max(worst, us)
            rows.append((served, name, f"{us:.2f}"))
            figures.add(f"{stem}_us_{served}_key{'s' if served > 1 else ''}", us, "us")
    print(common.table(["keys", "presented", "us/request"], rows))
    figures.at_most("worst_us", worst, GOAL_US, "us")
    return figures


if __name__ == "__main__":
    raise SystemExit(run(measure, parser()))
