"""A servable model: a batched function plus its signature and its batching settings. A
:class:`Model` declares its tensors as Triton's model config does, so metadata is exact and
mismatched requests are refused before they queue; it may also preprocess, pad ragged inputs
and pad batches to allowed sizes. :class:`Batching` is checked by the batcher's own rules."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import partial
from typing import Any

import numpy as np

from carpool.collation.collate import Collator
from carpool.collation.padding import PaddedBatch, Padding, allowed_size, pad_rows, take_rows
from carpool.datatypes import DATATYPES
from carpool.engine.batcher import Batcher
from carpool.engine.options import (
    DEFAULTS,
    BatcherOptions,
    check_int,
    check_ms,
    check_sizes,
    option,
)
from carpool.errors import ConfigError, ConfigTypeError
from carpool.policies.base import Policy
from carpool.runners.threads import is_async_callable

__all__ = ["Batching", "Model", "Tensor"]

Preprocess = Callable[[dict[str, np.ndarray[Any, Any]]], Mapping[str, np.ndarray[Any, Any]]]
TokenCount = Callable[[Mapping[str, np.ndarray[Any, Any]]], int]


@dataclass(frozen=True, slots=True)
class Tensor:
    """One input or output: v2 datatype and the shape of ONE row (no batch dimension);
    ``-1`` marks a dimension of any size."""

    name: str
    datatype: str = "FP32"
    shape: tuple[int, ...] = (-1,)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"tensor name must be a non-empty string, got {self.name!r}")
        if self.datatype not in DATATYPES:
            raise ValueError(
                f"tensor {self.name!r}: datatype must be one of {sorted(DATATYPES)}, "
                f"got {self.datatype!r}"
            )
        shape = tuple(self.shape)
        if any(not isinstance(d, int) or isinstance(d, bool) or d < -1 for d in shape):
            raise ValueError(f"tensor {self.name!r}: shape dims must be ints >= -1, got {shape}")
        object.__setattr__(self, "shape", shape)


@dataclass(frozen=True, slots=True)
class Batching:
    """How requests for one model are batched (``carpool.Batcher``'s options) and admitted.

    ``default_timeout_ms``: queue timeout for requests that give none; a request's own
    ``timeout`` parameter may shorten it, never extend it (Triton's rule).
    ``default_priority_level``: the level of requests sending ``priority`` 0 (or none);
    lower levels are served first.
    ``max_batch_size=0`` turns batching off, as in Triton: the model's tensors have no batch
    dimension, and each request reaches the model on its own with exactly its shape.
    ``allowed_batch_sizes``: for static-shape models, the only batch sizes the model is
    called with; a batch is padded up to the next one and the padding rows' outputs dropped.
    ``latency_slo_ms``: with ``policy="adaptive"``, the latency objective it batches for and
    refuses requests that cannot make it (``carpool.Overloaded``, a 503).
    """

    # A field named as one of BatcherOptions' is that option: its type, default and help.
    max_batch_size: int = DEFAULTS.max_batch_size  # here 0 is allowed: batching off
    max_wait_ms: float = DEFAULTS.max_wait_ms
    policy: str | Policy = DEFAULTS.policy
    workers: int = DEFAULTS.workers
    max_queue_size: int | None = DEFAULTS.max_queue_size
    isolate_errors: bool = DEFAULTS.isolate_errors
    # None: a request waits as long as it says
    default_timeout_ms: float | None = option(
        None, help="queue timeout for requests that send none; then 503", shown="none"
    )
    priority_levels: int = 0  # 0: any priority >= 1 is accepted
    default_priority_level: int = 1
    allowed_batch_sizes: tuple[int, ...] = ()  # (): any size up to max_batch_size
    latency_slo_ms: float | None = DEFAULTS.latency_slo_ms
    runner: str = DEFAULTS.runner
    batch_timeout_ms: float | None = DEFAULTS.batch_timeout_ms
    retry: bool = DEFAULTS.retry
    # runner="ray": the cluster (None: as ray.init finds it)
    ray_address: str | None = option(
        None,
        help="with --runner ray: the Ray cluster, e.g. 10.0.0.5:6379 or ray://head:10001",
        shown="the running cluster ray.init() finds",
    )
    ray: Mapping[str, Any] | None = None  # runner="ray": num_cpus, num_gpus, resources, ...
    # Rows one request may hold; None: 4 x max_batch_size (a request past max_batch_size is
    # split over batches, as far as this).
    max_rows_per_request: int | None = option(
        None,
        help="rows one request may hold (each model); more get 400 naming it; below it, a "
        "request larger than --max-batch-size is split over batches",
        shown="4 x --max-batch-size",
    )
    max_batch_tokens: int | None = DEFAULTS.max_batch_tokens

    def __post_init__(self) -> None:
        """Checked with the batcher's own rules (``carpool.engine.options``): a bad setting is a
        :class:`~carpool.errors.ConfigError` (a ``ValueError``) naming it, at construction."""
        check_int("max_batch_size", self.max_batch_size, 0, note="0 turns batching off")
        allowed = check_sizes("allowed_batch_sizes", self.allowed_batch_sizes)
        object.__setattr__(self, "allowed_batch_sizes", allowed)
        if allowed and self.max_batch_size > allowed[-1]:
            raise ConfigError(
                f"max_batch_size={self.max_batch_size} exceeds the largest allowed batch size "
                f"{allowed[-1]}; lower max_batch_size or allow a larger size"
            )
        if self.max_batch_size == 0 and allowed:
            raise ConfigError("allowed_batch_sizes needs batching on (max_batch_size >= 1)")
        if self.default_timeout_ms is not None:
            check_ms("default_timeout_ms", self.default_timeout_ms, positive=True)
        check_int("priority_levels", self.priority_levels, 0)
        check_int("default_priority_level", self.default_priority_level, 1)
        if self.priority_levels and self.default_priority_level > self.priority_levels:
            raise ConfigError(
                f"default_priority_level={self.default_priority_level} must be within "
                f"priority_levels={self.priority_levels}"
            )
        if self.max_rows_per_request is not None:
            check_int("max_rows_per_request", self.max_rows_per_request, 1)
        if self.ray is not None and not isinstance(self.ray, Mapping):
            raise ConfigTypeError(f"ray must be a table (mapping), got {type(self.ray).__name__}")
        self.options()  # the batcher's options, checked as a batcher checks them

    def merged(self, overrides: Mapping[str, Any]) -> Batching:
        """These settings with ``overrides`` applied (unknown keys are a ValueError)."""
        unknown = set(overrides) - set(self.__dataclass_fields__)
        if unknown:
            known = ", ".join(sorted(self.__dataclass_fields__))
            raise ValueError(f"unknown batching settings {sorted(unknown)}; known: {known}")
        overrides = dict(overrides)
        allowed = overrides.get("allowed_batch_sizes")
        if allowed and "max_batch_size" not in overrides:
            overrides["max_batch_size"] = max(allowed)  # the sizes say how large batches get
        return replace(self, **overrides)

    @property
    def batched(self) -> bool:
        return self.max_batch_size > 0

    @property
    def rows_per_request(self) -> int:
        """The rows one request may hold: ``max_rows_per_request``, or 4 x
        ``max_batch_size`` (1 with batching off: a request is one call)."""
        if self.max_rows_per_request is not None:
            return self.max_rows_per_request
        return 4 * self.max_batch_size if self.batched else 1

    def options(self) -> BatcherOptions:
        """The options of a batcher for this model, validated (the model names it)."""
        return BatcherOptions(**self.batcher_options())

    def batcher_options(self) -> dict[str, Any]:
        """The keyword arguments of ``carpool.Batcher`` these settings give: each batcher
        option that is a field here, one row a batch with batching off, and the runner's
        options from ``ray`` and ``ray_address``."""
        options = {name: getattr(self, name) for name in _BATCHER_FIELDS}
        options["max_batch_size"] = max(1, self.max_batch_size)
        options["runner_options"] = self._runner_options()
        return options

    def _runner_options(self) -> dict[str, Any] | None:
        if self.runner != "ray":
            return None
        options = dict(self.ray or {})
        if self.ray_address is not None:
            options["address"] = self.ray_address
        return options


# The batcher's options that are settings of a model too, each with the record's name,
# type and default; the rest a model gives otherwise (its name, count_tokens, ray).
_BATCHER_FIELDS = tuple(
    f.name for f in fields(BatcherOptions) if f.name in Batching.__dataclass_fields__
)


@dataclass
class Model:
    """A batched function with a declared signature.

    ``fn`` receives one stacked batch and returns one output row per input row:
    with one input, the batch is that input's array; with several, a dict of arrays by input
    name. It returns an array (the one output) or a dict of arrays by output name.
    ``inputs=None`` accepts one input of whatever datatype and row shape requests send
    (named ``INPUT0`` in metadata); ``outputs=None`` names the single output ``OUTPUT0``.

    ``preprocess`` runs once per request, on arrival and outside the batch: it maps the
    request's decoded inputs (k rows each) to what ``fn`` takes (k rows each), e.g. text to
    token ids. ``carpool serve`` runs a large request's in one of a few threads, so that
    several may run at once: it must be thread-safe (Hugging Face tokenizers are).
    ``padding`` batches inputs whose rows differ in length (see
    :class:`carpool.collation.padding.Padding`); ``fn`` then receives a dict. With ``preprocess`` or
    ``padding``, ``fn`` always receives a dict of arrays by name; with several declared
    inputs, in their declared order. Several outputs come back as a dict by name, or a tuple
    in declared order.

    ``openai``: also serve the model over OpenAI's ``/v1/embeddings`` (the server's
    ``carpool.server.openai.codec``); it needs one declared BYTES input (a string per row), one
    declared FP32 output (a vector per row) and batching on. A step-wise model with a BYTES
    ``text_input`` and ``text_output`` is served over OpenAI's text generation instead.
    ``count_tokens``: the tokens one request holds as the model sees them, from the inputs
    ``fn`` gets (after ``preprocess``), which OpenAI's ``usage`` reports; None counts 0.
    ``response_cache``: ``carpool serve`` answers a request identical to one already answered
    from its response cache (for models whose answer depends on their inputs alone).
    """

    fn: Callable[[Any], Any]
    name: str | None = None
    inputs: Sequence[Tensor] | None = None
    outputs: Sequence[Tensor] | None = None
    batching: Batching = field(default_factory=Batching)
    version: str = "1"
    platform: str = "python"
    preprocess: Preprocess | None = None
    padding: Padding | None = None
    # off: a model is served over the v2 routes unless it opts in
    openai: bool = option(
        False,
        help="also serve the models over OpenAI's /v1/embeddings and /v1/models (true/false); "
        "each must take text (one BYTES input) to one FP32 vector, or be a step-wise model "
        "that generates text (/v1/chat/completions, /v1/completions)",
        shown="true for minilm and smollm2, else false",
    )
    count_tokens: TokenCount | None = None
    response_cache: bool = False  # off: every request is computed
    # How to build this model again in another process (process workers): a picklable
    # zero-argument function returning the Model as loaded, before settings are applied.
    recipe: Callable[[], Model] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"Model fn must be callable, got {type(self.fn).__name__}")
        for hook in ("preprocess", "count_tokens"):
            value = getattr(self, hook)
            if value is not None and not callable(value):
                raise TypeError(f"Model {hook} must be callable, got {type(value).__name__}")
        if self.padding is not None and not self.batching.batched:
            raise ValueError("padding needs batching on (max_batch_size >= 1)")
        if self.batching.max_batch_tokens is not None and not (self.padding or self.count_tokens):
            raise ConfigError(
                "max_batch_tokens needs a model that counts its tokens (count_tokens=) or pads "
                "its inputs (padding=); this one does neither, so nothing could count"
            )
        for kind in ("inputs", "outputs"):
            tensors = getattr(self, kind)
            if tensors is not None:
                setattr(self, kind, _tensors(kind, tensors))
        for flag in ("openai", "response_cache"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"Model {flag} must be True or False, got {getattr(self, flag)!r}")
        if self.openai and not self.generates_text:
            _check_text_to_vector(self)

    @property
    def generates_text(self) -> bool:
        """Whether OpenAI's text generation routes can serve it: a step-wise model (one with
        a ``stepper``) taking a BYTES ``text_input`` and giving a BYTES ``text_output``."""
        ins = {t.name: t.datatype for t in self.inputs or ()}
        outs = {t.name: t.datatype for t in self.outputs or ()}
        stepwise = getattr(self, "stepper", None) is not None
        return stepwise and ins.get("text_input") == "BYTES" and outs.get("text_output") == "BYTES"

    @property
    def declared(self) -> bool:
        """Whether the inputs are declared (requests are checked against them)."""
        return self.inputs is not None

    @property
    def input_specs(self) -> tuple[Tensor, ...]:
        return tuple(self.inputs) if self.inputs is not None else (Tensor("INPUT0"),)

    @property
    def output_specs(self) -> tuple[Tensor, ...]:
        return tuple(self.outputs) if self.outputs is not None else (Tensor("OUTPUT0"),)

    @property
    def takes_dict(self) -> bool:
        """Whether ``fn`` receives a dict of arrays rather than its single input's array."""
        return len(self.input_specs) > 1 or self.preprocess is not None or self.padding is not None

    def collator(self) -> Collator:
        """How requests for this model are grouped and stacked (padded, if ragged)."""
        return self.padding.collator() if self.padding is not None else Collator()

    def batcher(self, **options: Any) -> Batcher:
        """A :class:`Batcher` for this model, from its batching settings and ``options``.

        Submit dicts of arrays by input name, ``k`` rows each, with ``infer_many`` (after
        :attr:`preprocess`, which the server applies on arrival).
        """
        name = self.name if self.name is not None else getattr(self.fn, "__name__", None)
        settings = {"name": name, **self.batching.batcher_options(), **options}
        if self.count_tokens is not None:  # what a token budget and the stats count with
            settings.setdefault("token_count", self.count_tokens)
        if settings.get("policy") == "adaptive" and "warmup" not in settings:
            settings["warmup"] = self.example()
        fn = self.batched_fn() if settings["runner"] == "thread" else self.worker_spec()
        return Batcher(fn, collator=self.collator(), **settings)

    def worker_spec(self) -> Callable[[], Callable[[dict[str, Any]], Any]]:
        """What each replica (a child process, a Ray actor) loads once: a plain zero-argument
        factory that rebuilds this model from its :attr:`recipe`, with this model's
        signature and settings, and gives :meth:`batched_fn` (the exact function the thread
        runner calls). The runners need not know a Model (see
        :func:`carpool.runners.replicas.replica_fn`). Preprocessing stays where requests
        arrive."""
        if self.recipe is None:
            raise ConfigError(
                f"model {self.name!r} cannot be loaded in a worker process: serve it from a "
                "target (module:attr, a model file, a repository folder or a built-in), or "
                "give Model(recipe=...) a picklable zero-argument function that builds it"
            )
        shell = replace(
            self,
            fn=_in_replica,
            preprocess=None if self.preprocess is None else _in_replica,
            recipe=None,
            batching=replace(self.batching, policy="eager"),  # a policy need not cross
        )
        return partial(_rebuilt_batched_fn, self.recipe, shell)

    def example(self) -> dict[str, np.ndarray[Any, Any]] | None:
        """One row of zeros in the batcher's form, for warming a cost model up; None when
        the inputs do not say their whole shape (undeclared, ``-1`` dims, text)."""
        if self.inputs is None or self.preprocess is not None:
            return None
        row = {}
        for spec in self.inputs:
            if spec.datatype == "BYTES" or any(d < 0 for d in spec.shape):
                return None
            row[spec.name] = np.zeros(spec.shape, dtype=DATATYPES[spec.datatype])
        return row

    def batched_fn(self) -> Callable[[dict[str, Any]], Any]:
        """``fn`` as the batcher calls it: a dict of stacked inputs in, a dict of outputs out.

        Around the call: strip the batch axis when batching is off, pad to an allowed batch
        size and drop the filler rows' outputs, cut ragged outputs back to each row's length.
        """
        fn, adapt = self.fn, _Adapter(self)
        if is_async_callable(fn):

            async def call_async(batch: dict[str, Any]) -> dict[str, Any]:
                arg, rows = adapt.before(batch)
                return adapt.after(await fn(adapt.argument(arg)), arg, rows)

            return call_async

        def call(batch: dict[str, Any]) -> dict[str, Any]:
            arg, rows = adapt.before(batch)
            return adapt.after(fn(adapt.argument(arg)), arg, rows)

        return call


def _tensors(kind: str, tensors: Sequence[Tensor]) -> tuple[Tensor, ...]:
    """A model's ``inputs`` or ``outputs``, checked: some, and each name once."""
    tensors = tuple(tensors)
    if not tensors:
        raise ValueError(f"{kind} must name at least one tensor, or be None")
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        raise ValueError(f"{kind} has duplicate names: {names}")
    return tensors


def _check_text_to_vector(model: Model) -> None:
    """What OpenAI's embeddings route needs: text in, one vector out, per row, batched.
    Raises ValueError naming what the model has instead."""
    ins, outs = model.inputs or (), model.outputs or ()
    fits = (
        len(ins) == 1
        and ins[0].datatype == "BYTES"
        and ins[0].shape in ((), (1,), (-1,))
        and len(outs) == 1
        and outs[0].datatype == "FP32"
        and len(outs[0].shape) == 1
        and model.batching.batched
    )
    if not fits:
        shown = [f"{t.name}:{t.datatype}:{list(t.shape)}" for t in (*ins, *outs)]
        raise ValueError(
            "openai = true (serving OpenAI's /v1/embeddings) needs one declared BYTES input "
            "of one string per row (shape [1]), one declared FP32 output of one vector per "
            f"row (shape [N]) and batching on; the model declares {shown or 'nothing'} with "
            f"max_batch_size={model.batching.max_batch_size}: declare inputs and outputs "
            "that fit, or leave openai off"
        )


def _in_replica(value: Any) -> Any:
    """Stands in for what a replica loads itself (see :meth:`Model.worker_spec`)."""
    raise RuntimeError("the model function is loaded in the replica")


def _rebuilt_batched_fn(recipe: Callable[[], Model], shell: Model) -> Callable[[Any], Any]:
    """In a replica: load the model, then call it as ``shell`` declares it."""
    return replace(shell, fn=recipe().fn).batched_fn()


class _Adapter:
    """What :meth:`Model.batched_fn` does before and after each call of ``fn``."""

    def __init__(self, model: Model) -> None:
        self.name = model.name
        self.outputs = model.output_specs
        self.names = [t.name for t in model.input_specs]
        self.takes_dict = model.takes_dict
        # Requests name inputs in any order; fn gets the declared one.
        self.in_order = (
            self.takes_dict
            and model.padding is None
            and model.preprocess is None
            and len(self.names) > 1
        )
        self.batched = model.batching.batched
        self.allowed = model.batching.allowed_batch_sizes
        self.padding = model.padding

    def before(self, batch: dict[str, Any]) -> tuple[Any, int]:
        """The batch as ``fn`` gets it (reordered, unbatched or padded), and its real rows."""
        rows = len(next(iter(batch.values())))
        if self.in_order:
            batch = {name: batch[name] for name in self.names}
        if not self.batched:
            return {k: v[0] for k, v in batch.items()}, rows
        if self.allowed:
            batch = pad_rows(batch, allowed_size(rows, self.allowed))
        return batch, rows

    def argument(self, batch: Any) -> Any:
        """A dict for ``fn`` that takes one; else its single input's array."""
        return batch if self.takes_dict else batch[self.names[0]]

    def after(self, result: Any, batch: Any, rows: int) -> dict[str, Any]:
        """``fn``'s result as a dict of outputs, one row per real input row."""
        out = self.as_dict(result)
        if not self.batched:
            return {k: np.asarray(v)[np.newaxis] for k, v in out.items()}
        if self.allowed:
            out = take_rows(out, rows)
        if self.padding is not None and isinstance(batch, PaddedBatch):
            out = self.padding.unpad(out, batch.lengths[:rows])
        return out

    def as_dict(self, result: Any) -> dict[str, Any]:
        """Raises TypeError when ``result`` does not match the declared outputs."""
        outputs = self.outputs
        if isinstance(result, Mapping):
            return dict(result)
        if isinstance(result, tuple) and len(outputs) > 1:
            if len(result) != len(outputs):
                raise TypeError(
                    f"model {self.name!r} returned {len(result)} outputs; it declares "
                    f"{[t.name for t in outputs]}"
                )
            return {t.name: value for t, value in zip(outputs, result, strict=True)}
        if len(outputs) != 1:
            names = [t.name for t in outputs]
            raise TypeError(
                f"model {self.name!r} declares outputs {names}; return a dict of arrays "
                "(or a tuple, in that order)"
            )
        return {outputs[0].name: np.asarray(result) if isinstance(result, list) else result}
