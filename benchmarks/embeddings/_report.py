"""``peers.py``'s report: a table per text set and texts per request, each carpool engine's
ratios to every other server measured in the same repeats, issue 20's goals, and the figures.
``results[server][(text set, texts per request, clients)]``: one row per repeat (a
``BenchRun.rows()`` row plus ``texts_per_s`` and ``padding``); ``offline[text set]``: texts/s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks.harness import Figures, common
from benchmarks.harness import texts as _texts

Cell = tuple[str, int, int]
Results = dict[str, dict[Cell, list[dict[str, Any]]]]
LABELS = {
    "fastapi": "FastAPI encode(texts)",
    "infinity torch": "infinity torch",
    "infinity onnx": "infinity onnx (optimum)",
}
# (text set, server compared with, least carpool / that server, its name in figure names) at
# 64 clients, one text each
GOALS = (
    ("short", "the faster infinity engine", 1.3, "fastest_infinity"),
    ("short", "FastAPI", 3.0, "fastapi"),
    ("short", "offline encode(batch_size=32)", 0.9, "offline"),
    ("long", "infinity torch", 1.2, "infinity_torch"),
)
GOAL_CLIENTS = 64
FEW = 20  # answers in a window below which a req/s (and its ratios) is coarse


def paired(a: Sequence[float], b: Sequence[float]) -> float:
    """Median over repeats of a / b, each pair measured in the same repeat."""
    return common.median(x / y for x, y in zip(a, b, strict=False) if y > 0 and x == x)


def times(x: float) -> str:
    """``1.23x``, or ``n/a``."""
    return "n/a" if x != x else f"{x:.2f}x"


def series(results: Results, name: str, cell: Cell, field: str = "throughput") -> list[float]:
    return [row[field] for row in results.get(name, {}).get(cell, [])]


def slug(name: str) -> str:
    """A server's name in figure names: ``carpool onnx-int8`` -> ``carpool_onnx_int8``."""
    return name.replace(" ", "_").replace("-", "_")


def report(
    args: Any, results: Results, offline: dict[str, list[float]], checks: dict[str, str]
) -> Figures:
    """Print the tables and goals; the figures: answers checked, offline texts/s, each
    server's req/s and p99 per cell (carpool's mean batch and padding too), the goals."""
    names = list(results)
    carpools = [n for n in names if n.startswith("carpool")]
    print(
        f"/v1/embeddings, servers on the servers' core, carpool bench on the client's; closed "
        f"loop; medians over {args.repeats} repeat{'s' if args.repeats != 1 else ''}. answers: "
        f"counted in the window (req/s = answers / window; few answers, a coarse req/s)"
    )
    print()
    for t in args.texts:
        for rows in args.rows:
            table(args, results, offline, t, rows, names, carpools)
    figures = served(args, results, offline, checks)
    figures.update(goals(results, offline, names, carpools))
    return figures


def served(
    args: Any, results: Results, offline: dict[str, list[float]], checks: dict[str, str]
) -> Figures:
    """Answers checked, offline texts/s, and each server's medians per cell."""
    names = list(results)
    figures = Figures()
    for name, verdict in checks.items():
        figures.check(f"{slug(name)}_answers_match", not verdict.startswith("DIFFERS"))
    figures.add("infinity_servers_run", sum(n.startswith("infinity") for n in names), "servers")
    for t in args.texts:
        figures.add(f"offline_texts_per_s_{t}", float(common.median(offline[t])), "texts/s")
    for name in names:
        for (t, rows, clients), runs in results[name].items():
            cell = f"{t}_x{rows}_{clients}"
            fields = [("req_per_s", "throughput", "req/s"), ("p99_ms", "p99_ms", "ms")]
            if name.startswith("carpool"):
                fields += [("mean_batch", "mean_batch", "texts"), ("padding", "padding", "x")]
            for what, field, unit in fields:
                value = float(common.median(r[field] for r in runs))
                figures.add(f"{slug(name)}_{what}_{cell}", value, unit)
        figures.add(
            f"{slug(name)}_errors", sum(r["errors"] for c in results[name].values() for r in c)
        )
    return figures


def table(
    args: Any,
    results: Results,
    offline: dict[str, list[float]],
    t: str,
    rows: int,
    names: list[str],
    carpools: list[str],
) -> None:
    fmt, med = common.fmt_num, common.median
    per = "1 text per request" if rows == 1 else f"{rows} texts per request"
    print(f"[{_texts.LABELS[t]}, {per}]")
    lines = []
    for name in names:
        for clients in args.clients:
            runs = results[name][(t, rows, clients)]
            lines.append(
                [LABELS.get(name, name), clients]
                + [fmt(med(r[f] for r in runs), d) for f, d in
                   (("throughput", 1), ("texts_per_s", 1), ("answers", 0), ("p50_ms", 1),
                    ("p99_ms", 1), ("mean_batch", 1), ("padding", 2))]
                + [sum(r["errors"] for r in runs)]
            )  # fmt: skip
    headers = ["server", "clients", "req/s", "texts/s", "answers", "p50 ms", "p99 ms",
               "mean batch", "computed/real tokens", "errors"]  # fmt: skip
    print(common.table(headers, lines))
    print(
        f"  offline sentence-transformers encode(all {args.n_texts[t]} texts, batch_size=32): "
        f"{fmt(med(offline[t]), 1)} texts/s"
    )
    for carpool in carpools:
        for clients in args.clients:
            cell = (t, rows, clients)
            mine = series(results, carpool, cell)
            parts = [
                f"/ {LABELS.get(other, other)} {times(paired(mine, series(results, other, cell)))}"
                for other in names
                if other not in carpools
            ]
            vs_offline = paired(series(results, carpool, cell, "texts_per_s"), offline[t])
            few = [n for n in names if med(series(results, n, cell, "answers")) < FEW]
            coarse = f"; coarse: under {FEW} answers from {', '.join(few)}" if few else ""
            print(f"  {clients} client{'s' if clients != 1 else ''}: {carpool} "
                  f"{', '.join(parts)} (req/s); / offline {times(vs_offline)} "
                  f"(texts/s){coarse}")  # fmt: skip
    print()


def goals(
    results: Results, offline: dict[str, list[float]], names: list[str], carpools: list[str]
) -> Figures:
    """Print each goal's line; its figure (n/a, and no verdict, where a peer did not run;
    left out where its cell was not measured)."""
    figures = Figures()
    infinities = [n for n in names if n.startswith("infinity")]
    print(f"goals ({GOAL_CLIENTS} clients, one text per request; ratios measured side by side):")
    for carpool in carpools:
        for t, other, target, short in GOALS:
            cell = (t, 1, GOAL_CLIENTS)
            mine = series(results, carpool, cell)
            note = ""
            if other == "FastAPI":
                ratio = paired(mine, series(results, "fastapi", cell))
            elif other.startswith("offline"):
                ratio = paired(series(results, carpool, cell, "texts_per_s"), offline.get(t, []))
            elif other == "infinity torch":
                ratio = paired(mine, series(results, "infinity torch", cell))
                note = "" if "infinity torch" in names else " (infinity torch not run)"
            else:  # each repeat against whichever infinity engine was faster in it
                fastest = [max(pair) for pair in zip(
                    *(series(results, n, cell) for n in infinities), strict=False
                )] if infinities else []  # fmt: skip
                ratio = paired(mine, fastest)
                note = (
                    " (infinity-emb not run)"
                    if not infinities
                    else _faster(results, infinities, cell)
                )
            if not mine:
                note = " (cell not measured)"
            print(f"  goal: {t}, {GOAL_CLIENTS} clients: {carpool} >= {target:g}x {other}: "
                  f"{times(ratio)} [{common.verdict(ratio, target)}]{note}")  # fmt: skip
            name = f"{slug(carpool)}_over_{short}_{t}_{GOAL_CLIENTS}"
            if not mine:
                continue
            if ratio == ratio:
                figures.at_least(name, ratio, target)
            else:
                figures.add(name, ratio, "x", goal=f">= {target:g}")
    return figures


def _faster(results: Results, infinities: list[str], cell: Cell) -> str:
    medians = {n: common.median(series(results, n, cell)) for n in infinities}
    best = max(medians, key=lambda n: medians[n] if medians[n] == medians[n] else -1.0)
    return f" (faster: {best})"
