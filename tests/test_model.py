"""Model and Batching: validation, and what the model function sees through Model.batcher().

End-to-end tests run the batcher on the test's event loop. A gate holds the first batch in
the model so that the requests sent meanwhile queue up and leave as one batch when it opens:
events order them, never timers. Each runs with a plain function (in the batcher's worker
threads) and with an ``async def``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from typing import Any, get_type_hints

import numpy as np
import pytest

from carpool import Batcher, Batching, ConfigError, Model, Tensor
from carpool.collation.padding import PaddedBatch, Padding
from carpool.engine.options import DEFAULTS, BatcherOptions
from carpool.errors import ConfigTypeError
from conftest import ThreadGate, settle

GateKind = type[ThreadGate]  # the gate_kind fixture: ThreadGate or AsyncGate


def exactly(message: str) -> str:
    """A ``pytest.raises`` pattern matching ``message`` and nothing more."""
    return f"^{re.escape(message)}$"


# ----------------------------------------------------------------------- helpers


async def through_gate(
    batcher: Batcher, gate: ThreadGate, first: Any, rest: list[Any]
) -> tuple[Any, list[Any]]:
    """``first`` runs alone and holds the model while ``rest`` queue up; then all finish."""
    head = asyncio.ensure_future(batcher.infer_many(first))
    await gate.entered()
    tail = [asyncio.ensure_future(batcher.infer_many(value)) for value in rest]
    await settle()
    gate.open()
    return await head, list(await asyncio.gather(*tail))


def tokens(length: int, start: int = 1, rows: int = 1) -> np.ndarray:
    """``rows`` rows of ``length`` tokens counting from ``start`` (each row +100)."""
    row = np.arange(start, start + length, dtype=np.int64)
    return np.stack([row + 100 * r for r in range(rows)])


def as_rows(value: Any) -> list[Any]:
    """A ragged output's rows as lists (it is a list of arrays or an array)."""
    return [np.asarray(row).tolist() for row in value]


# ----------------------------------------------------------------------- Batching


def test_batching_defaults() -> None:
    batching = Batching()
    assert batching.batched
    assert batching.allowed_batch_sizes == ()
    assert batching.batcher_options() == {
        "max_batch_size": 32,
        "max_wait_ms": 5.0,
        "policy": "eager",
        "workers": 1,
        "max_queue_size": None,
        "isolate_errors": True,
        "latency_slo_ms": None,
        "runner": "thread",
        "batch_timeout_ms": None,
        "retry": True,
        "runner_options": None,
        "max_batch_tokens": None,
    }


def test_batching_takes_each_batcher_option_from_the_record() -> None:
    # Every batcher option is a Batching field of the same type and default, but those a
    # model gives otherwise: its name, count_tokens, and ray / ray_address for the runner.
    options = {f.name: f for f in dataclasses.fields(BatcherOptions)}
    settings = {f.name: f for f in dataclasses.fields(Batching)}
    shared = set(options) - {"name", "token_count", "runner_options"}
    assert shared <= set(settings)
    option_types, setting_types = get_type_hints(BatcherOptions), get_type_hints(Batching)
    for name in shared:
        assert settings[name].default == getattr(DEFAULTS, name), name
        assert setting_types[name] == option_types[name], name
        assert not settings[name].metadata, name  # its help is the record's, once
    given = Batching(max_wait_ms=1.0, runner="ray", ray_address="auto", max_batch_tokens=64)
    assert given.batcher_options() == {
        **{name: getattr(given, name) for name in shared},
        "runner_options": {"address": "auto"},
    }


def test_max_batch_size_must_be_a_non_negative_int() -> None:
    with pytest.raises(
        ConfigError, match=exactly("max_batch_size must be >= 0 (0 turns batching off), got -1")
    ):
        Batching(max_batch_size=-1)


@pytest.mark.parametrize("size", [True, 2.0, "4", None])
def test_max_batch_size_of_another_type_is_a_type_error(size: Any) -> None:
    # A ConfigError (so a ValueError, as before) that is also a TypeError.
    message = f"max_batch_size must be an int, got {type(size).__name__}"
    with pytest.raises(ConfigTypeError, match=exactly(message)) as info:
        Batching(max_batch_size=size)
    assert isinstance(info.value, TypeError)
    assert isinstance(info.value, ValueError)


def test_max_batch_size_message_for_minus_one() -> None:
    with pytest.raises(
        ValueError, match=exactly("max_batch_size must be >= 0 (0 turns batching off), got -1")
    ):
        Batching(max_batch_size=-1)


def test_zero_turns_batching_off_and_the_batcher_runs_one_request_at_a_time() -> None:
    batching = Batching(max_batch_size=0)
    assert not batching.batched
    assert batching.batcher_options()["max_batch_size"] == 1
    assert Batching(max_batch_size=1).batched


@pytest.mark.parametrize("allowed", [(8, 4), (4, 4), (0, 4), (True, 4), (2.0, 4), ("4",)])
def test_allowed_batch_sizes_must_be_ascending_positive_ints(allowed: Any) -> None:
    with pytest.raises(
        ValueError,
        match=exactly(f"allowed_batch_sizes must be ascending ints >= 1, got {list(allowed)}"),
    ):
        Batching(max_batch_size=4, allowed_batch_sizes=allowed)


def test_allowed_batch_sizes_become_a_tuple() -> None:
    batching = Batching(max_batch_size=8, allowed_batch_sizes=[4, 8])  # type: ignore[arg-type]
    assert batching.allowed_batch_sizes == (4, 8)
    assert Batching(max_batch_size=6, allowed_batch_sizes=(4, 8)).max_batch_size == 6


def test_max_batch_size_may_not_exceed_the_largest_allowed_size() -> None:
    message = (
        "max_batch_size=16 exceeds the largest allowed batch size 8; lower max_batch_size "
        "or allow a larger size"
    )
    with pytest.raises(ValueError, match=exactly(message)):
        Batching(max_batch_size=16, allowed_batch_sizes=(4, 8))


def test_allowed_batch_sizes_need_batching_on() -> None:
    with pytest.raises(
        ValueError, match=exactly("allowed_batch_sizes needs batching on (max_batch_size >= 1)")
    ):
        Batching(max_batch_size=0, allowed_batch_sizes=(4,))


def test_merged_allowed_sizes_set_max_batch_size_unless_given() -> None:
    base = Batching(max_wait_ms=2.0)
    merged = base.merged({"allowed_batch_sizes": (2, 4)})
    assert (merged.max_batch_size, merged.allowed_batch_sizes) == (4, (2, 4))
    assert merged.max_wait_ms == 2.0
    assert base == Batching(max_wait_ms=2.0)  # unchanged
    given = base.merged({"allowed_batch_sizes": [2, 4], "max_batch_size": 3})
    assert (given.max_batch_size, given.allowed_batch_sizes) == (3, (2, 4))
    assert base.merged({"max_batch_size": 0}).batched is False
    assert base.merged({}) == base


def test_merged_refuses_unknown_settings() -> None:
    known = ", ".join(sorted(f.name for f in dataclasses.fields(Batching)))
    with pytest.raises(
        ValueError,
        match=exactly(f"unknown batching settings ['bogus', 'max_batch']; known: {known}"),
    ):
        Batching().merged({"max_batch": 4, "bogus": 1})


def test_merged_settings_are_validated() -> None:
    with pytest.raises(ValueError, match=r"^max_batch_size=16 exceeds"):
        Batching().merged({"allowed_batch_sizes": (4, 8), "max_batch_size": 16})


# ----------------------------------------------------------------------- Model


def double(x: np.ndarray) -> np.ndarray:
    return x * 2


def test_model_fn_must_be_callable() -> None:
    with pytest.raises(TypeError, match=exactly("Model fn must be callable, got int")):
        Model(3)  # type: ignore[arg-type]


def test_model_preprocess_must_be_callable() -> None:
    with pytest.raises(TypeError, match=exactly("Model preprocess must be callable, got str")):
        Model(double, preprocess="tokenize")  # type: ignore[arg-type]


def test_model_padding_needs_batching_on() -> None:
    with pytest.raises(
        ValueError, match=exactly("padding needs batching on (max_batch_size >= 1)")
    ):
        Model(double, batching=Batching(max_batch_size=0), padding=Padding({"ids": 0}))


def test_model_takes_a_dict_with_several_inputs_preprocess_or_padding() -> None:
    assert not Model(double).takes_dict
    assert not Model(double, inputs=[Tensor("x")]).takes_dict
    assert Model(double, inputs=[Tensor("a"), Tensor("b")]).takes_dict
    assert Model(double, preprocess=dict).takes_dict
    assert Model(double, padding=Padding({"INPUT0": 0})).takes_dict


def test_batcher_takes_the_model_s_settings_and_overrides() -> None:
    model = Model(double, name="scorer", batching=Batching(max_batch_size=7, workers=2))
    batcher = model.batcher()
    assert (batcher.name, batcher.max_batch_size, batcher.workers) == ("scorer", 7, 2)
    batcher = model.batcher(max_batch_size=3, name="other")
    assert (batcher.name, batcher.max_batch_size) == ("other", 3)


def test_an_unnamed_model_s_batcher_is_named_after_its_fn() -> None:
    # The Batcher's own default: model_fn.__name__, used in errors, logs and stats; not the
    # name of Model's internal wrapper.
    assert Model(double).batcher().name == "double"


def test_batched_fn_is_async_for_an_async_fn() -> None:
    async def fn(x: np.ndarray) -> np.ndarray:
        return x

    assert asyncio.iscoroutinefunction(Model(fn).batched_fn())
    assert not asyncio.iscoroutinefunction(Model(double).batched_fn())


def test_batched_fn_returns_a_dict_of_outputs() -> None:
    call = Model(lambda x: [row.sum() for row in x], outputs=[Tensor("s")]).batched_fn()
    out = call({"INPUT0": np.arange(6).reshape(2, 3)})
    assert list(out) == ["s"]
    assert isinstance(out["s"], np.ndarray)
    assert out["s"].tolist() == [3, 12]


def test_batched_fn_needs_a_dict_for_several_outputs() -> None:
    model = Model(double, name="m", outputs=[Tensor("a"), Tensor("b")])
    with pytest.raises(
        TypeError,
        match=exactly(
            "model 'm' declares outputs ['a', 'b']; return a dict of arrays "
            "(or a tuple, in that order)"
        ),
    ):
        model.batched_fn()({"INPUT0": np.arange(3)})


# ----------------------------------------------------------------------- end to end


async def test_batching_off_gives_fn_each_request_exactly_as_sent(gate_kind: GateKind) -> None:
    gate = gate_kind(lambda x: x.sum(axis=0))
    model = Model(gate, batching=Batching(max_batch_size=0))
    sent = [np.arange(6).reshape(2, 3) + 10 * i for i in range(4)]
    async with model.batcher() as batcher:
        assert batcher.max_batch_size == 1
        # What the server submits when the model does not batch: a batch of one.
        first, rest = await through_gate(
            batcher, gate, {"INPUT0": sent[0][np.newaxis]}, [{"INPUT0": x[None]} for x in sent[1:]]
        )
    assert [b.tolist() for b in gate.batches] == [x.tolist() for x in sent]
    assert [out["OUTPUT0"].tolist() for out in [first, *rest]] == [
        [x.sum(axis=0).tolist()]
        for x in sent  # with the batch axis back
    ]


async def test_batching_off_with_other_shapes_and_several_inputs() -> None:
    seen: list[Any] = []

    def fn(batch: dict[str, np.ndarray]) -> dict[str, Any]:
        seen.append({k: v.shape for k, v in batch.items()})
        return {"y": batch["a"].sum() + batch["b"].sum()}

    model = Model(
        fn,
        inputs=[Tensor("a", "INT64", (-1, -1)), Tensor("b", "INT64", (-1,))],
        outputs=[Tensor("y", "INT64", ())],
        batching=Batching(max_batch_size=0),
    )
    async with model.batcher() as batcher:
        out = await batcher.infer_many({"a": np.ones((1, 2, 5), int), "b": np.ones((1, 4), int)})
        again = await batcher.infer_many({"a": np.ones((1, 3, 1), int), "b": np.ones((1, 1), int)})
    assert seen == [{"a": (2, 5), "b": (4,)}, {"a": (3, 1), "b": (1,)}]
    assert out["y"].tolist() == [14]
    assert again["y"].tolist() == [4]


async def test_allowed_batch_sizes_are_the_only_sizes_fn_sees(gate_kind: GateKind) -> None:
    gate = gate_kind(lambda x: x * 10 + 1)
    model = Model(gate, batching=Batching(max_batch_size=8, allowed_batch_sizes=(4, 8)))
    requests = [
        np.arange(start, start + k)[:, None]
        for start, k in ((0, 1), (10, 2), (20, 3), (30, 1), (40, 5))
    ]
    async with model.batcher() as batcher:
        first, rest = await through_gate(
            batcher, gate, {"INPUT0": requests[0]}, [{"INPUT0": r} for r in requests[1:]]
        )
    for sent, out in zip(requests, [first, *rest], strict=True):
        assert out["OUTPUT0"].tolist() == (sent * 10 + 1).tolist()  # exactly its rows
    # 1 row -> 4; then 2 + 3 + 1 and two of the five -> 8; the other three -> 4.
    assert [b.ravel().tolist() for b in gate.batches] == [
        [0, 0, 0, 0],
        [10, 11, 20, 21, 22, 30, 40, 41],
        [42, 43, 44, 44],  # filler rows: copies of the last real row
    ]


async def test_allowed_batch_sizes_with_a_plain_fn() -> None:
    sizes: list[int] = []

    def fn(x: np.ndarray) -> list[np.ndarray]:
        sizes.append(len(x))
        return [row.sum() for row in x]  # a list output is one output

    model = Model(fn, batching=Batching(max_batch_size=8, allowed_batch_sizes=(2, 8)))
    async with model.batcher() as batcher:
        for k in (1, 2, 3, 8, 9):
            out = await batcher.infer_many({"INPUT0": np.ones((k, 2), int)})
            assert out["OUTPUT0"].tolist() == [2] * k
    assert sizes == [2, 2, 8, 8, 8, 2]


def echo_tokens(batch: PaddedBatch) -> dict[str, Any]:
    return {"tok": batch["ids"] * 2, "sum": batch["ids"].sum(axis=1)}


async def test_padding_pads_to_the_longest_row_and_cuts_ragged_outputs(
    gate_kind: GateKind,
) -> None:
    gate = gate_kind(echo_tokens)
    model = Model(
        gate,
        outputs=[Tensor("tok", "INT64"), Tensor("sum", "INT64", ())],
        padding=Padding({"ids": 0}, lengths="n", outputs={"tok": 0}),
    )
    a, b, c = tokens(3, 1, rows=2), tokens(5, 11), tokens(1, 21)
    async with model.batcher() as batcher:
        first, (out_a, out_b, out_c) = await through_gate(
            batcher, gate, {"ids": tokens(2, 31)}, [{"ids": a}, {"ids": b}, {"ids": c}]
        )
    assert [type(batch) for batch in gate.batches] == [PaddedBatch, PaddedBatch]
    batch = gate.batches[1]
    assert batch["ids"].tolist() == [
        [1, 2, 3, 0, 0],
        [101, 102, 103, 0, 0],
        [11, 12, 13, 14, 15],
        [21, 0, 0, 0, 0],
    ]
    assert batch["n"].tolist() == [3, 3, 5, 1]
    assert batch.lengths.tolist() == [[3], [3], [5], [1]]
    assert as_rows(first["tok"]) == [[62, 64]]
    assert as_rows(out_a["tok"]) == (a * 2).tolist()
    assert out_a["sum"].tolist() == [6, 306]
    assert as_rows(out_b["tok"]) == (b * 2).tolist()
    assert out_b["sum"].tolist() == [65]
    assert as_rows(out_c["tok"]) == [[42]]
    assert out_c["sum"].tolist() == [21]


def echo_real_tokens(batch: PaddedBatch) -> dict[str, Any]:
    real = np.arange(batch["ids"].shape[1]) < batch["n"][:, np.newaxis]
    return {"tok": batch["ids"] * 2, "sum": np.where(real, batch["ids"], 0).sum(axis=1)}


async def test_padding_with_allowed_batch_sizes(gate_kind: GateKind) -> None:
    gate = gate_kind(echo_real_tokens)
    model = Model(
        gate,
        outputs=[Tensor("tok", "INT64"), Tensor("sum", "INT64", ())],
        batching=Batching(max_batch_size=4, allowed_batch_sizes=(2, 4)),
        padding=Padding({"ids": -1}, lengths="n", outputs={"tok": 0}),
    )
    a, b = tokens(2, 1, rows=2), tokens(3, 11)
    async with model.batcher() as batcher:
        first, (out_a, out_b) = await through_gate(
            batcher, gate, {"ids": tokens(1, 7)}, [{"ids": a}, {"ids": b}]
        )
        single = await batcher.infer_many({"ids": tokens(4, 50)})
    assert [batch["ids"].shape for batch in gate.batches] == [(2, 1), (4, 3), (2, 4)]
    assert gate.batches[1]["ids"].tolist() == [
        [1, 2, -1],
        [101, 102, -1],
        [11, 12, 13],
        [11, 12, 13],  # the filler row: a copy of the last real row
    ]
    assert gate.batches[1]["n"].tolist() == [2, 2, 3, 3]
    assert as_rows(first["tok"]) == [[14]]
    assert first["sum"].tolist() == [7]
    assert as_rows(out_a["tok"]) == [[2, 4], [202, 204]]
    assert out_a["sum"].tolist() == [3, 203]
    assert as_rows(out_b["tok"]) == [[22, 24, 26]]
    assert out_b["sum"].tolist() == [36]
    assert as_rows(single["tok"]) == [[100, 102, 104, 106]]
    assert single["sum"].tolist() == [206]


async def test_requests_in_different_buckets_never_share_a_batch(gate_kind: GateKind) -> None:
    gate = gate_kind(echo_tokens)
    model = Model(
        gate,
        outputs=[Tensor("tok", "INT64"), Tensor("sum", "INT64", ())],
        padding=Padding({"ids": 0}, buckets=(16, 128), outputs={"tok": 0}),
    )
    lengths = [5, 100, 7, 120, 16]
    async with model.batcher() as batcher:
        first, rest = await through_gate(
            batcher, gate, {"ids": tokens(5)}, [{"ids": tokens(n)} for n in lengths]
        )
    assert [b.lengths.ravel().tolist() for b in gate.batches] == [[5], [5, 7, 16], [100, 120]]
    assert [b["ids"].shape for b in gate.batches] == [(1, 5), (3, 16), (2, 120)]
    for n, out in zip(lengths, rest, strict=True):
        assert as_rows(out["tok"]) == (tokens(n) * 2).tolist()
    assert as_rows(first["tok"]) == (tokens(5) * 2).tolist()


async def test_one_input_reaches_fn_as_a_bare_array(gate_kind: GateKind) -> None:
    gate = gate_kind(double)
    gate.open()
    async with Model(gate, inputs=[Tensor("x", "INT64", (2,))]).batcher() as batcher:
        out = await batcher.infer_many({"x": np.array([[1, 2]])})
    assert type(gate.batches[0]) is np.ndarray
    assert gate.batches[0].tolist() == [[1, 2]]
    assert list(out) == ["OUTPUT0"]
    assert out["OUTPUT0"].tolist() == [[2, 4]]


async def test_several_inputs_reach_fn_as_a_dict(gate_kind: GateKind) -> None:
    gate = gate_kind(lambda b: {"y": b["a"] + b["b"]})
    gate.open()
    model = Model(gate, inputs=[Tensor("a"), Tensor("b")], outputs=[Tensor("y")])
    async with model.batcher() as batcher:
        out = await batcher.infer_many({"a": np.array([1.0, 2.0]), "b": np.array([10.0, 20.0])})
    assert type(gate.batches[0]) is dict
    assert sorted(gate.batches[0]) == ["a", "b"]
    assert out["y"].tolist() == [11.0, 22.0]


async def test_preprocess_is_the_server_s_step_not_the_batcher_s(gate_kind: GateKind) -> None:
    def tokenize(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"ids": inputs["INPUT0"] * 100}

    gate = gate_kind(lambda b: next(iter(b.values())) + 1)
    gate.open()
    model = Model(gate, preprocess=tokenize)
    raw = {"INPUT0": np.array([1, 2])}
    async with model.batcher() as batcher:
        untouched = await batcher.infer_many(raw)  # a dict with one input, as sent
        assert model.preprocess is not None
        processed = await batcher.infer_many(dict(model.preprocess(raw)))  # as the server does
    assert [sorted(b) for b in gate.batches] == [["INPUT0"], ["ids"]]
    assert gate.batches[0]["INPUT0"].tolist() == [1, 2]
    assert gate.batches[1]["ids"].tolist() == [100, 200]
    assert untouched["OUTPUT0"].tolist() == [2, 3]
    assert processed["OUTPUT0"].tolist() == [101, 201]


# ----------------------------------------------------------------- openai and count_tokens


def _text_lengths(batch: Any) -> Any:
    return np.array([[len(bytes(t))] for t in batch.reshape(-1)], dtype=np.float32)


TEXT = Tensor("TEXT", "BYTES", (1,))
VECTOR = Tensor("VECTOR", "FP32", (4,))


@pytest.mark.parametrize("text_shape", [(), (1,), (-1,)])
def test_openai_takes_a_model_of_text_to_one_vector(text_shape: tuple[int, ...]) -> None:
    model = Model(
        _text_lengths, inputs=[Tensor("T", "BYTES", text_shape)], outputs=[VECTOR], openai=True
    )
    assert model.openai


@pytest.mark.parametrize(
    ("changes", "declared"),
    [
        ({"inputs": None}, "['VECTOR:FP32:[4]']"),
        ({"outputs": None}, "['TEXT:BYTES:[1]']"),
        ({"inputs": [Tensor("X", "FP32", (1,))]}, "['X:FP32:[1]', 'VECTOR:FP32:[4]']"),
        ({"inputs": [TEXT, Tensor("B", "BYTES", (1,))]}, "['TEXT:BYTES:[1]', 'B:BYTES:[1]', "),
        ({"inputs": [Tensor("T", "BYTES", (2,))]}, "['T:BYTES:[2]', 'VECTOR:FP32:[4]']"),
        ({"outputs": [Tensor("U", "BYTES", (1,))]}, "['TEXT:BYTES:[1]', 'U:BYTES:[1]']"),
        ({"outputs": [Tensor("M", "FP32", (2, 2))]}, "['TEXT:BYTES:[1]', 'M:FP32:[2, 2]']"),
        ({"batching": Batching(max_batch_size=0)}, "with max_batch_size=0"),
    ],
)
def test_openai_refuses_a_model_that_is_not_text_to_one_vector(
    changes: dict[str, Any], declared: str
) -> None:
    settings: dict[str, Any] = {"inputs": [TEXT], "outputs": [VECTOR], **changes}
    with pytest.raises(
        ValueError, match=r"^openai = true \(serving OpenAI's /v1/embeddings\) "
    ) as info:
        Model(_text_lengths, openai=True, **settings)
    assert declared in str(info.value)
    assert str(info.value).endswith("declare inputs and outputs that fit, or leave openai off")


def test_openai_is_off_unless_asked_and_hooks_are_checked() -> None:
    assert Model(_text_lengths).openai is False
    assert Model(_text_lengths).count_tokens is None
    with pytest.raises(TypeError, match=exactly("Model openai must be True or False, got 'yes'")):
        Model(_text_lengths, inputs=[TEXT], outputs=[VECTOR], openai="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=exactly("Model count_tokens must be callable, got int")):
        Model(_text_lengths, count_tokens=3)  # type: ignore[arg-type]
