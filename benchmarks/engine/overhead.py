"""Per-request overhead of carpool vs Ray Serve's ``@serve.batch`` vs a bare floor.

A no-op model behind ``max_batch_size=64``, driven by 1000 asyncio tasks and by 8 threads,
each (front end, implementation) in a fresh pinned child. Goals: carpool >= 0.4x the floor
and >= 5x Ray (NaN without Ray). Method and results: docs/benchmarks/engine.md."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import subprocess
import sys
import threading
from collections import deque
from typing import Any

from benchmarks.harness import Figures, run
from benchmarks.harness import common as _bench
from benchmarks.harness import processes as _process

MODULE = "benchmarks.engine.overhead"
MAX_BATCH = 64
ASYNC_TASKS = 1000
THREADS = 8
WINDOW = 32


# --------------------------------------------------------------------------
# async front end
# --------------------------------------------------------------------------
async def _noop_async(batch: Any) -> Any:
    return batch


async def _drive_async(call: Any, total: int, tasks: int) -> tuple[float, int]:
    """``tasks`` coroutines each awaiting ``call(i)`` total/tasks times: seconds taken, and
    the answers that were not ``i``."""
    per = max(1, total // tasks)
    bad = 0

    async def caller(base: int) -> None:
        nonlocal bad
        for i in range(base, base + per):
            if await call(i) != i:
                bad += 1

    t0 = _bench.now()
    await asyncio.gather(*(caller(k * per) for k in range(tasks)))
    return _bench.now() - t0, bad


class _AsyncFloor:
    """Minimal asyncio hand-back: future per request, resolved in chunks of 64."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.pending: list[tuple[Any, asyncio.Future[Any]]] = []
        self.scheduled = False

    def infer(self, x: Any) -> asyncio.Future[Any]:
        fut = self.loop.create_future()
        self.pending.append((x, fut))
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self._flush)
        return fut

    def _flush(self) -> None:
        self.scheduled = False
        pending, self.pending = self.pending, []
        for i in range(0, len(pending), MAX_BATCH):
            for x, fut in pending[i : i + MAX_BATCH]:
                fut.set_result(x)


async def _async_bench(impl: str, target_s: float, ray_timeout: float) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    if impl == "floor":
        floor = _AsyncFloor()
        return await _measure_async(floor.infer, target_s)
    if impl == "ray":
        import ray

        noop = _bench.ray_serve_batch(MAX_BATCH, ray_timeout)(_noop_async)
        res = await _measure_async(noop, target_s)
        res["ray_initialized"] = ray.is_initialized()
        return res
    if impl == "carpool":
        carpool = _bench.import_carpool()
        async with carpool.Batcher(_noop_async, max_batch_size=MAX_BATCH) as b:
            res = await _measure_async(b.infer, target_s)
            extra = _bench.batch_stats(b.stats())
        res.update(extra)
        return res
    raise ValueError(impl)


async def _measure_async(call: Any, target_s: float) -> dict[str, Any]:
    # warm-up (also sizes the run so it lasts ~target_s)
    n_warm = ASYNC_TASKS * 20
    dt, wrong = await _drive_async(call, n_warm, ASYNC_TASKS)
    rate = n_warm / dt
    total = max(ASYNC_TASKS * 10, int(rate * target_s) // ASYNC_TASKS * ASYNC_TASKS)
    gc.collect()
    dt, bad = await _drive_async(call, total, ASYNC_TASKS)
    return {"rps": total / dt, "n": total, "wrong": wrong + bad}


# --------------------------------------------------------------------------
# threaded front end
# --------------------------------------------------------------------------
def _drive_threads(submit: Any, total: int, threads: int, window: int) -> tuple[float, int]:
    """``threads`` threads each submitting total/threads values, ``window`` outstanding:
    seconds taken, and the answers that were not the value submitted."""
    per = max(1, total // threads)
    errors: list[BaseException] = []
    wrong = [0] * threads
    start = threading.Barrier(threads + 1)

    def worker(k: int) -> None:
        base = k * per
        try:
            futs: deque[tuple[int, Any]] = deque()
            start.wait()
            for i in range(base, base + per):
                if len(futs) >= window:
                    x, f = futs.popleft()
                    wrong[k] += f.result() != x
                futs.append((i, submit(i)))
            while futs:
                x, f = futs.popleft()
                wrong[k] += f.result() != x
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    start.wait()
    t0 = _bench.now()
    for t in ts:
        t.join()
    dt = _bench.now() - t0
    if errors:
        raise errors[0]
    return dt, sum(wrong)


def _measure_threads(submit: Any, target_s: float) -> dict[str, Any]:
    n_warm = THREADS * 2000
    dt, wrong = _drive_threads(submit, n_warm, THREADS, WINDOW)
    rate = n_warm / dt
    total = max(THREADS * 1000, int(rate * target_s) // THREADS * THREADS)
    gc.collect()
    dt, bad = _drive_threads(submit, total, THREADS, WINDOW)
    return {"rps": total / dt, "n": total, "wrong": wrong + bad}


class _ThreadFloor:
    """Minimal concurrent.futures hand-off: SimpleQueue + one server thread."""

    def __init__(self) -> None:
        import queue
        from concurrent.futures import Future

        self._Future = Future
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._empty = queue.Empty
        self._t = threading.Thread(target=self._serve, daemon=True)
        self._t.start()

    def submit(self, x: Any) -> Any:
        f = self._Future()
        self._q.put((x, f))
        return f

    def _serve(self) -> None:
        q, empty = self._q, self._empty
        while True:
            item = q.get()
            if item is None:
                return
            batch = [item]
            try:
                while len(batch) < MAX_BATCH:
                    batch.append(q.get_nowait())
            except empty:
                pass
            stop = False
            for it in batch:
                if it is None:
                    stop = True
                    continue
                it[1].set_result(it[0])
            if stop:
                return

    def close(self) -> None:
        self._q.put(None)
        self._t.join()


def _threads_bench(impl: str, target_s: float, ray_timeout: float) -> dict[str, Any]:
    if impl == "floor":
        floor = _ThreadFloor()
        try:
            return _measure_threads(floor.submit, target_s)
        finally:
            floor.close()
    if impl == "ray":
        import ray

        loop = asyncio.new_event_loop()
        lt = threading.Thread(target=loop.run_forever, daemon=True)
        lt.start()
        noop: Any = None

        async def make() -> Any:  # build the decorated fn on the loop thread
            return _bench.ray_serve_batch(MAX_BATCH, ray_timeout)(_noop_async)

        noop = asyncio.run_coroutine_threadsafe(make(), loop).result()

        def submit(x: Any) -> Any:
            return asyncio.run_coroutine_threadsafe(noop(x), loop)

        try:
            res = _measure_threads(submit, target_s)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            lt.join()
        res["ray_initialized"] = ray.is_initialized()
        return res
    if impl == "carpool":
        carpool = _bench.import_carpool()
        with carpool.Batcher(_noop_async, max_batch_size=MAX_BATCH) as b:
            res = _measure_threads(b.submit, target_s)
            res.update(_bench.batch_stats(b.stats()))
        return res
    raise ValueError(impl)


def _child_main(spec: dict[str, Any]) -> None:
    """One (front end, implementation) run, in this pinned child: its result as a JSON line."""
    if spec["mode"] == "async":
        res = asyncio.run(_async_bench(spec["impl"], spec["target_s"], spec["ray_timeout"]))
    else:
        res = _threads_bench(spec["impl"], spec["target_s"], spec["ray_timeout"])
    print(json.dumps(res))


def _child(spec: dict[str, Any], cpus: set[int] | None) -> dict[str, Any]:
    """Run one configuration in a fresh ``python -m`` child pinned to ``cpus``."""
    proc = subprocess.run(
        [sys.executable, "-m", MODULE, "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=_process.REPO,
        env=_process.child_env(),
        preexec_fn=_process.pin_child(frozenset(cpus) if cpus else None),
    )
    if proc.returncode != 0:
        raise RuntimeError(f"child {spec} failed (rc={proc.returncode}):\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return result


# --------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = _bench.base_parser(__doc__, default_cpus="0")
    p.add_argument(
        "--ray-timeout", type=float, default=0.0, help="Ray batch_wait_timeout_s (default 0)"
    )
    p.add_argument("--only", choices=["async", "threads"], help="run one front end only")
    return p


def measure(args: argparse.Namespace) -> Figures:
    cpus = _bench.parse_cpus(args.cpus)
    repeats = args.repeats or (1 if args.quick else 5)
    target_s = 0.15 if args.quick else 1.0
    have_ray = _bench.ray_available()
    impls = ["floor", "carpool"] + (["ray"] if have_ray else [])
    modes = [args.only] if args.only else ["async", "threads"]
    configs = [(m, i) for m in modes for i in impls]

    _bench.header(
        "carpool overhead: no-op model, max_batch_size=64",
        {
            "cpus": ",".join(map(str, sorted(cpus))) if cpus else "unpinned",
            "ray": _bench.ray_version(),
            "ray_batch_wait_timeout_s": args.ray_timeout,
            "repeats": repeats,
            "async_callers": ASYNC_TASKS,
            "threads": f"{THREADS}x window {WINDOW}",
        },
    )
    if not have_ray:
        print("(ray not installed: ray figures NaN; run benchmarks/setup.sh)\n")

    results: dict[tuple[str, str], list[dict[str, Any]]] = {c: [] for c in configs}
    for r in range(repeats):
        for mode, impl in configs:
            spec = {
                "mode": mode,
                "impl": impl,
                "target_s": target_s,
                "ray_timeout": args.ray_timeout,
            }
            res = _child(spec, cpus)
            results[(mode, impl)].append(res)
            print(
                f"  repeat {r + 1}/{repeats}  {mode:7s} {impl:8s} {res['rps']:>12,.0f} req/s",
                flush=True,
            )
    print()
    figures = report(results, modes, impls)
    wrong = sum(x["wrong"] for runs in results.values() for x in runs)
    figures.check("answers_equal", wrong == 0)
    return figures


def report(
    results: dict[tuple[str, str], list[dict[str, Any]]], modes: list[str], impls: list[str]
) -> Figures:
    """Per front end: medians over repeats, ratios of the medians, and the targets."""
    figures = Figures()
    for mode in modes:
        med = {i: _bench.median(x["rps"] for x in results[(mode, i)]) for i in impls}
        rows = []
        for i in impls:
            runs = [x["rps"] for x in results[(mode, i)]]
            mbs = _bench.median(x.get("mean_batch_size", float("nan")) for x in results[(mode, i)])
            rows.append(
                [
                    i,
                    _bench.fmt_num(med[i]),
                    _bench.fmt_num(min(runs)),
                    _bench.fmt_num(max(runs)),
                    _bench.fmt_num(med[i] / med["floor"], 2),
                    _bench.fmt_num(mbs, 1) if i == "carpool" else "",
                ]
            )
        label = (
            f"{ASYNC_TASKS} asyncio tasks, await infer(x)"
            if mode == "async"
            else f"{THREADS} threads, submit(x) with {WINDOW} outstanding each"
        )
        print(f"[{mode}] {label}")
        print(_bench.table(["impl", "req/s (median)", "min", "max", "x floor", "mean batch"], rows))
        nan = float("nan")
        vs_floor = med["carpool"] / med["floor"]
        vs_ray = med["carpool"] / med["ray"] if "ray" in med else nan
        print(
            f"  carpool/floor = {vs_floor:.2f}x (target >= 0.40: {_bench.verdict(vs_floor, 0.4)})"
            f"   carpool/ray = {vs_ray:.2f}x (target >= 5: {_bench.verdict(vs_ray, 5.0)})"
        )
        if "ray" in med:
            print(
                f"  ray/floor = {med['ray'] / med['floor']:.2f}x  (ray.is_initialized() in child: "
                f"{results[(mode, 'ray')][0].get('ray_initialized')})"
            )
        print()
        for impl in ("floor", "carpool", "ray"):
            figures.add(f"{mode}_{impl}_req_per_s", med.get(impl, nan), "req/s")
        carpool_batch = _bench.median(x["mean_batch_size"] for x in results[(mode, "carpool")])
        figures.add(f"{mode}_carpool_mean_batch", carpool_batch, "rows")
        figures.at_least(f"{mode}_carpool_over_floor", vs_floor, 0.4)
        figures.at_least(f"{mode}_carpool_over_ray", vs_ray, 5)
    return figures


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _child_main(json.loads(sys.argv[2]))
    else:
        raise SystemExit(run(measure, parser()))
