"""What every scenario shares: pinning, the common flags, medians and tables."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SRC = REPO / "src"


# --------------------------------------------------------------------------
# carpool / ray imports
# --------------------------------------------------------------------------
def import_carpool() -> Any:
    """Import carpool, falling back to the repo's src/ when not installed."""
    try:
        import carpool

        if hasattr(carpool, "Batcher"):
            return carpool
    except ImportError:
        pass
    sys.modules.pop("carpool", None)
    sys.path.insert(0, str(SRC))
    import carpool

    if not hasattr(carpool, "Batcher"):
        raise ImportError(f"carpool at {getattr(carpool, '__file__', '?')} has no Batcher yet")
    return carpool


def missing_modules(modules: Iterable[str]) -> list[str]:
    """Those of ``modules`` this interpreter cannot import, found without importing them."""
    import importlib.util

    return [m for m in modules if importlib.util.find_spec(m) is None]


def ray_available() -> bool:
    try:
        import ray.serve  # noqa: F401
    except Exception:
        return False
    return True


def ray_serve_batch(max_batch_size: int, batch_wait_timeout_s: float) -> Callable[[Any], Any]:
    """Return ``serve.batch(...)`` usable in a plain process, without a cluster.

    ``serve.batch`` is pure asyncio and does not need ``ray.init()``; but in
    Ray 2.60 its queue asks ``serve.get_replica_context()`` once (to warn when
    ``max_ongoing_requests`` is below ``max_batch_size``) and raises outside a
    replica.  So we install the same replica context a Serve replica has, with
    ``max_ongoing_requests`` high enough not to cap anything.  This only runs
    once, when the queue is built; the per-request path is Ray's own code,
    unchanged (its metrics objects included).  No actor, no RPC, no HTTP: this
    is the cheapest possible way to use Ray's batching, i.e. generous to Ray.
    """
    from ray import serve
    from ray.serve import context as serve_context
    from ray.serve._private.common import DeploymentID, ReplicaID
    from ray.serve._private.config import DeploymentConfig
    from ray.serve.schema import ReplicaRank

    if serve_context._get_internal_replica_context() is None:
        serve_context._set_internal_replica_context(
            replica_id=ReplicaID("bench-replica", DeploymentID("bench", "bench")),
            servable_object=None,
            _deployment_config=DeploymentConfig(max_ongoing_requests=1_000_000),
            rank=ReplicaRank(rank=0, node_rank=0, local_rank=0),
            world_size=1,
        )
    return serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=batch_wait_timeout_s)


def ray_version() -> str:
    try:
        import ray

        return str(ray.__version__)
    except Exception:
        return "not installed"


# --------------------------------------------------------------------------
# CPU pinning (of this process; child processes: _process.py)
# --------------------------------------------------------------------------
def parse_cpus(spec: str | None) -> set[int] | None:
    """'0', '0,1', '0-1' -> {0, 1}; '' / 'none' / None -> no pinning."""
    if not spec or spec.lower() in ("none", "all"):
        return None
    cpus: set[int] = set()
    for part in spec.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            cpus.update(range(int(lo), int(hi) + 1))
        else:
            cpus.add(int(part))
    available = os.sched_getaffinity(0)
    cpus &= available
    return cpus or None


def pin(cpus: set[int] | None) -> str:
    """Pin the calling process (call before starting threads) and describe it."""
    if cpus:
        os.sched_setaffinity(0, cpus)
    return ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))


def base_parser(
    doc: str | None, default_cpus: str, default_repeats: int = 5
) -> argparse.ArgumentParser:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # progress lines
    p = argparse.ArgumentParser(
        description=(doc or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="short smoke run (< ~10 s)")
    p.add_argument(
        "--repeats",
        type=int,
        default=None,
        help=f"repeats (default {default_repeats}; 1 with --quick)",
    )
    p.add_argument(
        "--cpus",
        default=default_cpus,
        help=f"CPUs to pin to, e.g. '0' or '0,1'; 'none' to not pin (default {default_cpus!r})",
    )
    return p


def answer_commands(commands: dict[str, Callable[[dict[str, Any]], Any]]) -> int:
    """A worker process's loop: answer each ``{"cmd": NAME, ...}`` line of stdin with one
    JSON line, ``commands[NAME](spec)``'s result or ``{"error": ...}``, until stdin ends."""
    import json

    replies = sys.stdout
    sys.stdout = sys.stderr  # a stray print never lands among the answers
    for line in sys.stdin:
        spec = json.loads(line)
        try:
            reply = commands[spec["cmd"]](spec)
        except Exception as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
    return 0


# --------------------------------------------------------------------------
# statistics / output (percentiles: carpool.bench.report.data.percentile, numpy's linear)
# --------------------------------------------------------------------------
def median(xs: Iterable[float]) -> float:
    xs = list(xs)
    return statistics.median(xs) if xs else float("nan")


def fmt_num(x: float, digits: int = 0) -> str:
    if x != x:  # NaN
        return "n/a"
    return f"{x:,.{digits}f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], left: int = 1) -> str:
    """Aligned columns; the first ``left`` of them are text (left-aligned), the rest numbers."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: Sequence[str]) -> str:
        return "  ".join(
            (c.ljust(w) if i < left else c.rjust(w))
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )

    out = [line(cells[0]), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)


def verdict(value: float, target: float, higher_is_better: bool = True) -> str:
    if value != value:
        return "n/a"
    ok = value >= target if higher_is_better else value <= target
    return "met" if ok else "MISSED"


def header(title: str, extra: dict[str, Any]) -> None:
    import platform

    print(f"== {title} ==")
    info = {
        "python": platform.python_version(),
        "cpus": extra.pop("cpus", "?"),
        **extra,
    }
    print("   " + "  ".join(f"{k}={v}" for k, v in info.items()))
    print()


def now() -> float:
    return time.perf_counter()


def batch_stats(stats: Any) -> dict[str, float]:
    """Pull requests/batches/mean batch size out of a carpool stats snapshot.

    Tolerant of attribute naming, so the benchmarks keep working while the
    stats API settles.
    """

    def get(*names: str) -> Any:
        for n in names:
            v = getattr(stats, n, None)
            if v is None and isinstance(stats, dict):
                v = stats.get(n)
            if v is not None:
                return v() if callable(v) else v
        return None

    completed = get("completed", "requests_completed", "items")
    rows = get("rows")
    batches = get("batches", "batch_count", "num_batches", "batches_dispatched")
    mean = get("mean_batch_size", "avg_batch_size", "average_batch_size")
    if mean is None:
        hist = get("batch_size_histogram", "batch_sizes", "histogram")
        if isinstance(hist, dict) and hist:
            n = sum(hist.values())
            mean = sum(k * v for k, v in hist.items()) / n if n else None
            if batches is None:
                batches = n
    if rows is None:
        rows = completed
    if mean is None and rows is not None and batches:
        mean = rows / batches
    return {
        "rows": float(rows) if rows is not None else float("nan"),
        "completed": float(completed) if completed is not None else float("nan"),
        "batches": float(batches) if batches is not None else float("nan"),
        "mean_batch_size": float(mean) if mean is not None else float("nan"),
    }
