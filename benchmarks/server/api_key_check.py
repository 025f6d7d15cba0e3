"""What checking an API key costs a request: ``carpool serve --api-key``'s check, per request.

What: the app's whole check (``auth.is_open`` on the split path, then ``ApiKeys.allows`` on
the ASGI scope's headers: find the presented key, SHA-256 it, compare it in constant time
with every served key) timed with ``timeit`` on a realistic scope (the nine headers
tritonclient's HTTP client sends with an infer request, the key last), for 1 and 3 served
keys, the key right, wrong, or missing, in either header.

Why: the check runs on every request but the health routes; the goal is < 2 us, against a
v2 request's ~100 us of server-side work. The ratio to that goal is printed; nothing is
asserted; exits 0.

    python3 benchmarks/auth_cost.py [--quick]
"""

from __future__ import annotations

import timeit
from typing import Any

import _bench

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


def scope(extra: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": PATH, "headers": HEADERS + extra}


def check_us(keys: Any, request: dict[str, Any], number: int, repeats: int) -> float:
    """Median microseconds of the app's check, as ``App._http`` runs it."""
    from carpool.server.auth import is_open

    def check() -> bool:
        parts = request["path"].strip("/").split("/")
        return is_open(parts, metrics_need_key=False) or keys.allows(request["headers"])

    times = timeit.repeat(check, number=number, repeat=repeats)
    return _bench.median(times) / number * 1e6


def main() -> int:
    args = _bench.base_parser(__doc__, default_cpus="0", default_repeats=7).parse_args()
    _bench.pin(_bench.parse_cpus(args.cpus))
    from carpool.server.auth import ApiKeys

    repeats = args.repeats or (1 if args.quick else 7)
    number = 2_000 if args.quick else 100_000
    _bench.header("API-key check per request", {"repeats": repeats, "number": number})
    cases = {
        "Authorization: Bearer (right)": [(b"authorization", f"Bearer {KEYS[0]}".encode())],
        "x-api-key (right)": [(b"x-api-key", KEYS[0].encode())],
        "x-api-key (wrong)": [(b"x-api-key", b"not-a-served-key-0000000")],
        "no key": [],
    }
    rows = []
    worst = 0.0
    for served in (1, 3):
        keys = ApiKeys(KEYS[:served])
        for name, extra in cases.items():
            us = check_us(keys, scope(extra), number, repeats)
            worst = max(worst, us)
            rows.append((served, name, f"{us:.2f}"))
    print(_bench.table(["keys", "presented", "us/request"], rows))
    print(f"\nworst/goal = {worst / GOAL_US:.2f} (goal < {GOAL_US:g} us per request)")
    return 0


if __name__ == "__main__":
    raise SystemExit(_bench.run_reported("auth_cost", main))
