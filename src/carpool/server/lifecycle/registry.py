"""The models a server holds, each with its batcher, and how each describes itself: v2 metadata,
and Triton's ``config`` and ``statistics`` as perf_analyzer reads them. Readiness lives here,
so that every protocol answers it alike. Nothing of HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from importlib.metadata import version as _version
from itertools import count
from typing import TYPE_CHECKING, Any, Protocol

from carpool.engine.stats import BatcherStats, BatchTimes
from carpool.errors import ConfigError, WorkerStartError
from carpool.loading import LoadFailure
from carpool.model import Model, Tensor
from carpool.server.failures import ModelNotFound, ModelUnavailable
from carpool.server.telemetry.statistics import CacheCounts, batch_stats, compute_phases, duration
from carpool.stepwise import StepwiseModel

__all__ = [
    "ModelNotFound",
    "ModelUnavailable",
    "Registry",
    "ServedModel",
    "ServerCounts",
    "server_metadata",
]

if TYPE_CHECKING:
    from carpool.server.inference.cache import ResponseCache

log = logging.getLogger("carpool.server")
_GENERATIONS = count(1)  # each ServedModel's, so that no answer outlives its model
VERSION = _version("carpool")  # from the installed metadata: pyproject.toml holds it once
EXTENSIONS = ["binary_tensor_data", "model_configuration", "statistics", "schedule_policy"]


def server_metadata() -> dict[str, Any]:
    """The server's v2 metadata: its name, version and the protocol extensions it serves."""
    return {"name": "carpool", "version": VERSION, "extensions": EXTENSIONS}


def _tensor(spec: Tensor, batched: bool) -> dict[str, Any]:
    shape = [-1, *spec.shape] if batched else list(spec.shape)
    return {"name": spec.name, "datatype": spec.datatype, "shape": shape}


def _config_tensor(spec: Tensor) -> dict[str, Any]:
    datatype = "TYPE_STRING" if spec.datatype == "BYTES" else f"TYPE_{spec.datatype}"
    return {"name": spec.name, "data_type": datatype, "dims": list(spec.shape)}


def _entry(name: str, version: str, state: str, reason: str = "") -> dict[str, str]:
    """One model's line in the repository index."""
    return {"name": name, "version": version, "state": state, "reason": reason}


class ServedBatcher(Protocol):
    """What the server asks of a model's batcher: a :class:`~carpool.engine.batcher.Batcher`, or
    in a front-end process its link to the one in the main process
    (:class:`carpool.server.frontends.remote.RemoteBatcher`)."""

    async def __aenter__(self) -> Any: ...
    async def aclose(self, *, timeout: float | None = None) -> None: ...  # noqa: ASYNC109
    async def infer_many(
        self, xs: Any, *, timeout_ms: float | None = None, priority: int = 0
    ) -> Any: ...
    def stats(self) -> BatcherStats: ...
    def learned(self) -> str: ...
    @property
    def workers_alive(self) -> int: ...


class ServedModel:
    """One model behind the server: its signature, its batcher, its request outcomes."""

    def __init__(self, model: Model, batcher: ServedBatcher | None = None) -> None:
        if model.name is None:
            raise ValueError("a served model needs a name")
        self.model = model
        self.name: str = model.name
        self.version = model.version
        self.batcher: ServedBatcher = model.batcher() if batcher is None else batcher
        # protocol ("http", "grpc", ...) -> HTTP status (gRPC's too: its code follows) -> requests
        self.statuses: defaultdict[str, Counter[int]] = defaultdict(Counter)
        self.request_seconds = 0.0  # summed over successful requests, for Triton's stats
        self.created = int(time.time())  # Unix seconds: OpenAI's /v1/models "created"
        self.cache_counts = CacheCounts()
        # Unique per load of a model (a reload of the same version gets a new one): the
        # response cache keys answers by it.
        self.generation = next(_GENERATIONS)
        # Requests on their way through this version (the inference path's), and once it is
        # replaced or unloaded, set when the last of them has reached its batcher or ended.
        self.users = 0
        self._retired: asyncio.Event | None = None

    def enter(self) -> None:
        """A request starts its way through this version."""
        self.users += 1

    def leave(self) -> None:
        """A request is done with this version (answered, or through its batcher)."""
        self.users -= 1
        if self.users == 0 and self._retired is not None:
            self._retired.set()

    async def retire(self, *, timeout: float) -> None:  # noqa: ASYNC109 - a drain bound
        """Wait (``timeout`` seconds at most) until no request is on its way to this
        version's batcher any more, so that closing it refuses none of them: once it is out
        of the registry (replaced, unloaded), no new request finds it."""
        self._retired = asyncio.Event()
        if self.users == 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._retired.wait(), timeout)

    def record(self, protocol: str, status: int, seconds: float = 0.0) -> None:
        """One request that came by ``protocol`` (any name: a label in ``/metrics``) and
        ended in ``status``, :func:`~carpool.server.inference.outcomes.error_status`'s, after
        ``seconds`` (counted for successes only, as Triton's statistics do)."""
        self.statuses[protocol][status] += 1
        self.request_seconds += seconds

    def describe(self) -> str:
        model = self.model
        b = model.batching
        inputs = ", ".join(f"{t.name}:{t.datatype}{list(t.shape)}" for t in model.input_specs)
        text = f"{model.platform} v{self.version}, inputs [{inputs}], "
        if not b.batched:
            return text + f"batching off, workers={b.workers}, max_queue_size={b.max_queue_size}"
        text += (
            f"max_batch_size={b.max_batch_size}, max_wait_ms={b.max_wait_ms:g}, "
            f"policy={b.policy}, workers={b.workers}, max_queue_size={b.max_queue_size}"
        )
        if b.latency_slo_ms is not None:
            text += f", latency_slo_ms={b.latency_slo_ms:g}"
        if b.runner != "thread":
            text += f", runner={b.runner}"
        if b.batch_timeout_ms is not None:
            text += f", batch_timeout_ms={b.batch_timeout_ms:g}"
        if b.allowed_batch_sizes:
            text += f", allowed_batch_sizes={list(b.allowed_batch_sizes)}"
        if model.padding is not None:
            buckets = list(model.padding.buckets) or "none"
            text += f", padding {sorted(model.padding.inputs)} in buckets {buckets}"
        return text

    def metadata(self) -> dict[str, Any]:
        model = self.model
        return {
            "name": self.name,
            "versions": [self.version],
            "platform": model.platform,
            "inputs": [_tensor(t, model.batching.batched) for t in model.input_specs],
            "outputs": [_tensor(t, model.batching.batched) for t in model.output_specs],
        }

    def config(self) -> dict[str, Any]:
        b = self.model.batching
        policy: dict[str, Any] = {}
        if b.default_timeout_ms is not None:
            policy = {
                "timeout_action": "REJECT",
                "default_timeout_microseconds": int(b.default_timeout_ms * 1000),
                "allow_timeout_override": True,
            }
        config: dict[str, Any] = {
            "name": self.name,
            "platform": self.model.platform,
            "backend": "carpool",
            "version_policy": {"specific": {"versions": [self.version]}},
            "max_batch_size": b.max_batch_size,
            "input": [_config_tensor(t) for t in self.model.input_specs],
            "output": [_config_tensor(t) for t in self.model.output_specs],
            "instance_group": [{"count": b.workers, "kind": "KIND_CPU"}],
            # a step-wise model answers in steps (generate_stream, ModelStreamInfer)
            "model_transaction_policy": {"decoupled": isinstance(self.model, StepwiseModel)},
        }
        if self.model.response_cache:  # perf_analyzer reports cache hits and misses then
            config["response_cache"] = {"enable": True}
        if isinstance(self.model, StepwiseModel):  # batched per step, not per request
            config["parameters"] = {
                "max_sequences": {"string_value": str(self.model.max_sequences)},
                "step_tokens": {"string_value": str(self.model.step_tokens or "")},
            }
        elif b.batched:  # Triton leaves dynamic_batching out of a model that does not batch
            config["dynamic_batching"] = {
                "max_queue_delay_microseconds": int(b.max_wait_ms * 1000),
                "preferred_batch_size": list(b.allowed_batch_sizes) or [b.max_batch_size],
                "priority_levels": b.priority_levels,
                "default_priority_level": b.default_priority_level,
                "default_queue_policy": policy,
                "policy": str(b.policy),
                "max_queue_size": b.max_queue_size or 0,
            }
        return config

    def statistics(self, stats: BatcherStats | None = None) -> dict[str, Any]:
        s = stats if stats is not None else self.batcher.stats()
        failed = s.failed + s.expired + s.rejected
        cache = self.cache_counts
        # Triton counts compute per request (perf_analyzer requires the three phases' counts
        # to agree); the seconds are the model calls', summed over every batch size.
        computed = s.completed + s.failed
        # A cache hit counts as in Triton: a success through the queue (in no time), with no
        # inference, execution or compute (perf_analyzer needs the queue count to rise).
        return {
            "name": self.name,
            "version": self.version,
            "inference_count": s.rows,
            "execution_count": s.batches,
            "inference_stats": {
                "success": duration(s.completed + cache.hits, self.request_seconds),
                "fail": duration(failed, 0.0),
                "queue": duration(
                    s.queue_wait_seconds.count + cache.hits, s.queue_wait_seconds.sum
                ),
                **compute_phases(computed, sum(s.batch_times.values(), BatchTimes())),
                "cache_hit": duration(cache.hits, cache.hit_seconds),
                "cache_miss": duration(cache.misses, cache.miss_seconds),
            },
            "batch_stats": batch_stats(s),
            "dispatch_reasons": dict(s.dispatch_reasons),
            "pending": s.pending,
            "queued_rows": s.queued_rows,
            "workers": {
                "runner": self.model.batching.runner,
                "alive": s.workers_alive,
                "restarts": s.worker_restarts,
                "retried_batches": s.retried_batches,
                "timed_out_batches": s.timed_out_batches,
            },
            **self._adaptive(s),
        }

    def _adaptive(self, s: BatcherStats) -> dict[str, Any]:
        """What a learning policy knows: its objective, cost curve, how well it predicts."""
        slo = self.model.batching.latency_slo_ms
        if slo is None:
            return {}
        curve = s.cost_curve
        ratio = s.prediction_ratio
        return {
            "adaptive": {
                "latency_slo_ms": slo,
                "overloaded": s.overloaded,
                "cost": None
                if curve is None
                else {
                    "fixed_ms": curve.fixed_s * 1e3,
                    "per_row_ms": curve.per_row_s * 1e3,
                    "margin": curve.margin,
                    "batches": curve.samples,
                },
                "measured_over_predicted": None
                if ratio is None
                else {"p50": ratio.p50, "p90": ratio.p90, "p99": ratio.p99},
            }
        }


class ServerCounts:
    """The answers of one server that no model counts, by protocol and status (as
    ``ServedModel.statuses``): ``carpool_server_requests_total`` in ``/metrics``.

    ``counted`` is this process's. A front-end process (``--frontends``) counts in memory
    shared with the main process instead, and shows every front end's, summed there as of
    the last query: ``shown``, set by its
    :class:`~carpool.server.frontends.remote.FrontEndRegistry`.
    """

    def __init__(self) -> None:
        self.counted: defaultdict[str, Counter[int]] = defaultdict(Counter)
        self.shown: Mapping[str, Mapping[int, int]] | None = None  # None: ``counted``

    def record(self, protocol: str, status: int) -> None:
        """One answer, by ``protocol`` (a label, as the models'), that ended in ``status``."""
        self.counted[protocol][status] += 1

    def totals(self) -> Mapping[str, Mapping[int, int]]:
        """What ``/metrics`` shows."""
        return self.counted if self.shown is None else self.shown


class Registry:
    """Models by name; iteration order is the order they were given.

    ``load_failures`` are the repository's models that failed to load: not served, but
    listed in the index, and asked for by name they are :class:`ModelUnavailable`.
    """

    local = True  # the batchers are in this process (a front end's are the main one's)

    def __init__(
        self,
        models: Sequence[Model],
        load_failures: Sequence[LoadFailure] = (),
        serve: Callable[[Model], ServedModel] = ServedModel,
    ) -> None:
        self.load_failures = {failure.name: failure for failure in load_failures}
        self.ready = False  # true between the app's startup and the start of its drain
        self.server_counts = ServerCounts()  # the answers no model counts
        self.cache: ResponseCache | None = None  # the models' answers (--response-cache)
        # Model control's: the index state of names serving no version (name -> version,
        # state, reason), and the names the repository holds (never loaded: name only).
        self.states: dict[str, tuple[str, str, str]] = {}
        self.known: Callable[[], Sequence[str]] = tuple
        self.needs_a_model = True  # False under model control: models may come later
        self._models: dict[str, ServedModel] = {}
        for model in models:
            served = serve(model)
            if served.name in self._models:
                raise ValueError(
                    f"two models are named {served.name!r}; give one another name (--name)"
                )
            self._models[served.name] = served

    def __iter__(self) -> Iterator[ServedModel]:
        return iter(self._models.values())

    def fail(self, name: str, reason: str, version: str | None = None) -> None:
        """``name`` could not start (no worker process loaded it, or model control could
        not load it): unavailable from now on, showing ``reason``; ``version`` is the one
        it would have served (None: the one it was registered with)."""
        served = self._models.pop(name, None)
        self.states.pop(name, None)
        if version is None:
            assert served is not None, "a model never registered names its version"
            version = served.version
        self.load_failures[name] = LoadFailure(name, version, reason)

    def __len__(self) -> int:
        return len(self._models)

    async def start(self) -> list[ServedModel]:
        """Start every model's batcher on this loop: the started ones. A model whose worker
        processes all failed to load is unavailable from now on (:meth:`fail`), with the
        reason, like a broken repository folder; if none is left, ConfigError. An
        unexpected failure closes the batchers already started."""
        started: list[ServedModel] = []
        try:
            for served in list(self):
                try:
                    await served.batcher.__aenter__()
                except WorkerStartError as exc:
                    self.fail(served.name, exc.reason)
                    continue
                started.append(served)
        except BaseException:
            await self.close(started, timeout=0.0)
            raise
        if not started and self.needs_a_model:
            problems = "; ".join(f"{f.name}: {f.reason}" for f in self.load_failures.values())
            raise ConfigError(f"no model could start ({problems})")
        return started

    async def close(self, started: Sequence[ServedModel], *, timeout: float) -> None:  # noqa: ASYNC109 - a drain bound
        """Close the batchers of ``started``: each finishes what it accepted within
        ``timeout`` seconds, then answers what is left with 503. Logs what an adaptive
        policy learned."""
        await asyncio.gather(*(served.batcher.aclose(timeout=timeout) for served in started))
        for served in started:
            if self.local and served.model.batching.latency_slo_ms is not None:
                log.info("model %r learned: %s", served.name, served.batcher.learned())

    def describe(self) -> None:
        """Log what is served, how, and what is not and why."""
        for served in self:
            log.info("serving model %r: %s", served.name, served.describe())
        for failure in self.load_failures.values():
            log.error("model %r is unavailable: %s", failure.name, failure.reason)

    async def refresh(self) -> None:
        """Bring the counts up to date before they are shown: here they always are; a
        front-end process's registry gathers every front end's from the main process."""

    def is_ready(self) -> bool:
        """The server is ready: started, not draining, and every model has a worker."""
        return self.ready and all(m.batcher.workers_alive for m in self)

    def model_ready(self, served: ServedModel) -> bool:
        """``served`` is ready: the server started, is not draining, and it has a worker."""
        return self.ready and bool(served.batcher.workers_alive)

    def index(self, *, ready_only: bool = False) -> list[dict[str, str]]:
        """Triton's repository index: every model, loaded or not, by name; with
        ``ready_only``, the loaded ones only. A model being loaded, unloaded or unloaded
        shows its state (:meth:`mark`); one the repository holds that was never loaded,
        its name alone, as Triton lists it."""
        if ready_only:
            return [entry for entry in self.index() if entry.get("state") == "READY"]
        entries = {m.name: _entry(m.name, m.version, "READY") for m in self}
        for f in self.load_failures.values():
            entries.setdefault(f.name, _entry(f.name, f.version, "UNAVAILABLE", f.reason))
        for name, (version, state, reason) in self.states.items():
            if name not in entries or state == "UNLOADING":
                entries[name] = _entry(name, version, state, reason)
        for name in self.known():
            entries.setdefault(name, {"name": name})
        return [entries[name] for name in sorted(entries)]

    def find(self, name: str) -> ServedModel | None:
        """The version serving ``name``, if one is."""
        return self._models.get(name)

    def put(self, served: ServedModel) -> ServedModel | None:
        """Serve ``served`` under its name from now on: the version it replaces, if any.
        (Model control: a model loaded or reloaded while the server runs.)"""
        self.load_failures.pop(served.name, None)
        self.states.pop(served.name, None)
        old = self._models.get(served.name)
        self._models[served.name] = served
        return old

    def remove(self, name: str) -> ServedModel | None:
        """Serve nothing under ``name`` from now on: what served it, if anything."""
        self.load_failures.pop(name, None)
        return self._models.pop(name, None)

    def mark(self, name: str, version: str, state: str, reason: str = "") -> None:
        """Show ``name`` in the index as ``state`` (LOADING, UNLOADING, UNAVAILABLE), with
        ``reason``, while it serves no version (or, UNLOADING, while it drains)."""
        self.states[name] = (version, state, reason)

    def get(self, name: str, version: str | None = None) -> ServedModel:
        served = self._models.get(name)
        if served is None:
            failure = self.load_failures.get(name)
            if failure is not None:
                raise ModelUnavailable(name, failure.reason)
            raise ModelNotFound(name)
        if version not in (None, "", served.version):
            raise ModelNotFound(name, version)
        return served
