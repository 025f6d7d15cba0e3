"""Rows <-> batches for every kind of value: stack, split, keys, errors; pure."""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from carpool.collation.collate import Collator, Span
from carpool.errors import BatchSizeMismatch, CollationError


@pytest.fixture
def c() -> Collator:
    return Collator()


def row(i: int, width: int = 3) -> np.ndarray:
    return np.arange(i * 10, i * 10 + width, dtype=np.float32)


# numpy: single rows


def test_numpy_single_rows_stack_along_a_new_axis(c: Collator) -> None:
    batch = c.stack([row(0), row(1)])
    assert batch.dtype == np.float32
    np.testing.assert_array_equal(batch, [[0, 1, 2], [10, 11, 12]])


def test_numpy_split_gives_each_row_as_a_view_of_the_output(c: Collator) -> None:
    output = np.arange(6).reshape(3, 2)
    pieces = c.split(output, None, 3)
    assert len(pieces) == 3
    for i, piece in enumerate(pieces):
        assert piece.shape == (2,)
        np.testing.assert_array_equal(piece, [2 * i, 2 * i + 1])
        assert np.shares_memory(piece, output)


def test_numpy_multi_row_spans_concatenate_and_split_back(c: Collator) -> None:
    values = [np.ones((2, 3)), np.full(3, 2.0), np.full((3, 3), 3.0)]
    spans: list[Span] = [2, None, 3]
    batch = c.stack(values, spans)
    assert batch.shape == (6, 3)
    np.testing.assert_array_equal(batch[:, 0], [1, 1, 2, 3, 3, 3])
    pieces = c.split(batch * 10, spans, 6)
    assert [p.shape for p in pieces] == [(2, 3), (3,), (3, 3)]
    np.testing.assert_array_equal(pieces[0], np.full((2, 3), 10.0))
    np.testing.assert_array_equal(pieces[1], np.full(3, 20.0))
    np.testing.assert_array_equal(pieces[2], np.full((3, 3), 30.0))


def test_numpy_rows_take_and_concat(c: Collator) -> None:
    value = np.arange(10).reshape(5, 2)
    assert c.rows(value) == 5
    middle = c.take(value, 1, 3)
    np.testing.assert_array_equal(middle, [[2, 3], [4, 5]])
    assert np.shares_memory(middle, value)
    whole = c.concat([c.take(value, 0, 2), c.take(value, 2, 5)])
    np.testing.assert_array_equal(whole, value)


def test_numpy_keys_group_by_shape_and_dtype(c: Collator) -> None:
    f32 = np.zeros(3, np.float32)
    assert c.key(f32) == c.key(np.ones(3, np.float32))
    assert c.key(f32) == (np.ndarray, (3,), np.dtype(np.float32))
    assert c.key(f32) != c.key(np.zeros(3, np.float64))
    assert c.key(f32) != c.key(np.zeros(4, np.float32))
    assert c.key(f32) != c.key(np.zeros((1, 3), np.float32))


def test_numpy_multi_row_key_is_the_row_shape(c: Collator) -> None:
    assert c.key(np.zeros((7, 3), np.float32), many=True) == c.key(np.zeros(3, np.float32))
    assert c.key(np.zeros((1, 3)), many=True) == c.key(np.zeros((9, 3)), many=True)


def test_numpy_zero_d_arrays_stack_into_a_vector(c: Collator) -> None:
    a, b = np.array(1.5), np.array(2.5)
    assert c.key(a) == c.key(b) == (np.ndarray, (), np.dtype(np.float64))
    batch = c.stack([a, b])
    assert batch.shape == (2,)
    pieces = c.split(batch, None, 2)
    assert [float(p) for p in pieces] == [1.5, 2.5]


def test_numpy_zero_d_array_cannot_be_a_multi_row_request(c: Collator) -> None:
    with pytest.raises(CollationError) as info:
        c.key(np.array(1.0), many=True)
    assert info.value.field == "input"
    assert str(info.value) == "input: a multi-row request needs a batch axis, got a 0-d array"


def test_numpy_scalars_stack_like_zero_d_arrays(c: Collator) -> None:
    x, y = np.float32(1.5), np.float32(-2.0)
    assert c.key(x) == c.key(np.array(0, np.float32))
    assert c.key(x) != c.key(np.int64(1))
    batch = c.stack([x, y])
    assert batch.dtype == np.float32
    np.testing.assert_array_equal(batch, [1.5, -2.0])


def test_numpy_zero_d_output_has_no_rows(c: Collator) -> None:
    for output in (np.array(3.0), np.float64(3.0)):
        with pytest.raises(CollationError) as info:
            c.split(output, None, 1)
        assert info.value.field == "output"
        assert str(info.value) == "output: model_fn returned a 0-d array; it has no rows"


@pytest.mark.parametrize(("spans", "total"), [(None, 3), ([2, None], 3)])
def test_numpy_split_row_count_mismatch(c: Collator, spans: list[Span] | None, total: int) -> None:
    with pytest.raises(BatchSizeMismatch) as info:
        c.split(np.zeros((4, 2)), spans, total)
    error = info.value
    assert (error.expected, error.actual, error.field) == (3, 4, "output")
    assert str(error) == (
        "model_fn returned 4 rows in output for a batch of 3 rows; "
        "it must return exactly one output row per input row, along axis 0."
    )


# torch


def test_torch_single_rows_stack_and_unbind(c: Collator) -> None:
    batch = c.stack([torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])])
    assert torch.equal(batch, torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    pieces = c.split(batch * 2, None, 2)
    assert len(pieces) == 2
    assert torch.equal(pieces[0], torch.tensor([2.0, 4.0]))
    assert torch.equal(pieces[1], torch.tensor([6.0, 8.0]))


def test_torch_multi_row_spans_cat_and_split(c: Collator) -> None:
    values = [torch.zeros(2, 2), torch.ones(2), torch.full((1, 2), 2.0)]
    spans: list[Span] = [2, None, 1]
    batch = c.stack(values, spans)
    assert batch.shape == (4, 2)
    assert batch[:, 0].tolist() == [0.0, 0.0, 1.0, 2.0]
    pieces = c.split(batch, spans, 4)
    assert [tuple(p.shape) for p in pieces] == [(2, 2), (2,), (1, 2)]
    assert pieces[1].tolist() == [1.0, 1.0]


def test_torch_rows_take_concat(c: Collator) -> None:
    value = torch.arange(10).reshape(5, 2)
    assert c.rows(value) == 5
    part = c.take(value, 1, 3)
    assert part.tolist() == [[2, 3], [4, 5]]
    assert part.data_ptr() == value[1].data_ptr()  # a view, not a copy
    assert torch.equal(c.concat([c.take(value, 0, 1), c.take(value, 1, 5)]), value)


def test_torch_keys_include_shape_dtype_and_device(c: Collator) -> None:
    base = torch.zeros(3)
    assert c.key(base) == (torch.Tensor, (3,), torch.float32, torch.device("cpu"))
    assert c.key(base) == c.key(torch.ones(3))
    assert c.key(base) != c.key(torch.zeros(3, dtype=torch.float64))
    assert c.key(base) != c.key(torch.zeros(4))
    assert c.key(base) != c.key(torch.zeros(3, device="meta"))
    assert c.key(torch.zeros(6, 3), many=True) == c.key(base)


def test_torch_tensor_and_numpy_array_never_share_a_key(c: Collator) -> None:
    assert c.key(torch.zeros(3)) != c.key(np.zeros(3, np.float32))


def test_torch_zero_d(c: Collator) -> None:
    with pytest.raises(CollationError, match=r"^input: .*0-d tensor"):
        c.key(torch.tensor(1.0), many=True)
    with pytest.raises(CollationError) as info:
        c.split(torch.tensor(1.0), None, 1)
    assert str(info.value) == "output: model_fn returned a 0-d tensor; it has no rows"


def test_torch_split_row_count_mismatch(c: Collator) -> None:
    with pytest.raises(BatchSizeMismatch) as info:
        c.split(torch.zeros(2, 5), None, 3)
    assert (info.value.expected, info.value.actual, info.value.field) == (3, 2, "output")


def test_torch_subclass_uses_the_tensor_handler(c: Collator) -> None:
    param = torch.nn.Parameter(torch.zeros(2))
    assert c.key(param) == (torch.Tensor, (2,), torch.float32, torch.device("cpu"))


# lists and other objects


def test_objects_batch_as_a_python_list(c: Collator) -> None:
    assert c.key("a") is c.key(3) is c.key(None) is list
    assert c.stack(["a", "b", "c"]) == ["a", "b", "c"]
    assert c.split(["A", "B", "C"], None, 3) == ["A", "B", "C"]


def test_objects_multi_row_spans(c: Collator) -> None:
    spans: list[Span] = [None, 2, None]
    batch = c.stack(["a", ["b", "c"], "d"], spans)
    assert batch == ["a", "b", "c", "d"]
    assert c.split(["A", "B", "C", "D"], [4], 4) == [["A", "B", "C", "D"]]
    assert c.split(["A", "B", "C", "D"], spans, 4) == ["A", ["B", "C"], "D"]


def test_python_lists_are_rows_of_a_list(c: Collator) -> None:
    # a list value is one row (an object); a multi-row request carries rows along axis 0
    assert c.stack([[1, 2], [3, 4]]) == [[1, 2], [3, 4]]
    assert c.rows([[1, 2], [3, 4], [5, 6]]) == 3
    assert c.take([1, 2, 3, 4], 1, 3) == [2, 3]
    assert c.concat([[1, 2], [3]]) == [1, 2, 3]


def test_objects_multi_row_request_must_be_a_sequence(c: Collator) -> None:
    with pytest.raises(CollationError) as info:
        c.key(7, many=True, field="input")
    assert info.value.field == "input"
    assert str(info.value) == "input: a multi-row request must be a sequence of rows, got int"
    assert c.key(["a", "b"], many=True) is list


@pytest.mark.parametrize("output", [None, 5, 2.5, object()])
def test_non_sequence_output_names_the_output_field(c: Collator, output: object) -> None:
    with pytest.raises(CollationError) as info:
        c.split(output, None, 2)
    error = info.value
    assert isinstance(error, TypeError)
    assert error.field == "output"
    assert str(error) == (
        f"output: model_fn returned {type(output).__name__}, which has no rows; return a "
        "list (or array) with one output per input row"
    )
    assert error.__cause__ is None
    assert error.__suppress_context__


def test_list_split_row_count_mismatch(c: Collator) -> None:
    with pytest.raises(BatchSizeMismatch) as info:
        c.split(["x"], None, 2)
    assert (info.value.expected, info.value.actual, info.value.field) == (2, 1, "output")


def test_output_kind_follows_the_output_not_the_input(c: Collator) -> None:
    # numpy rows in, a list out: each caller gets an element of the list
    batch = c.stack([row(0), row(1)])
    assert c.split([float(r.sum()) for r in batch], None, 2) == [3.0, 33.0]


# dicts


def test_dict_stacks_and_splits_per_key(c: Collator) -> None:
    values = [{"ids": row(0), "tag": "a"}, {"ids": row(1), "tag": "b"}]
    batch = c.stack(values)
    assert list(batch) == ["ids", "tag"]
    np.testing.assert_array_equal(batch["ids"], [[0, 1, 2], [10, 11, 12]])
    assert batch["tag"] == ["a", "b"]
    pieces = c.split({"score": np.array([0.5, 0.25]), "tag": ["A", "B"]}, None, 2)
    assert [p["tag"] for p in pieces] == ["A", "B"]
    assert [float(p["score"]) for p in pieces] == [0.5, 0.25]


def test_dict_mixed_single_and_multi_row_spans(c: Collator) -> None:
    values = [
        {"x": np.zeros((2, 2)), "t": ["p", "q"]},
        {"x": np.ones(2), "t": "r"},
    ]
    spans: list[Span] = [2, None]
    batch = c.stack(values, spans)
    assert batch["x"].shape == (3, 2)
    assert batch["t"] == ["p", "q", "r"]
    pieces = c.split(batch, spans, 3)
    assert pieces[0]["t"] == ["p", "q"]
    assert pieces[0]["x"].shape == (2, 2)
    assert pieces[1]["t"] == "r"
    np.testing.assert_array_equal(pieces[1]["x"], [1.0, 1.0])


def test_dict_key_is_per_key_and_field_names_the_key(c: Collator) -> None:
    a = {"x": np.zeros(2), "t": "s"}
    assert c.key(a) == c.key({"x": np.ones(2), "t": "u"})
    assert c.key(a) != c.key({"x": np.zeros(3), "t": "s"})
    assert c.key(a) != c.key({"x": np.zeros(2)})
    assert c.key(a) != c.key({"y": np.zeros(2), "t": "s"})
    with pytest.raises(CollationError) as info:
        c.key({"x": np.array(1.0)}, many=True)
    assert info.value.field == "input['x']"
    assert str(info.value).startswith("input['x']: a multi-row request needs a batch axis")


def test_dict_key_does_not_depend_on_insertion_order(c: Collator) -> None:
    # {"a": ..., "b": ...} and {"b": ..., "a": ...} stack together (stack reads by key), so
    # they must share a key; otherwise clients sending JSON fields in another order never
    # share a batch.
    x, y = np.zeros(2), np.zeros(3)
    assert c.key({"a": x, "b": y}) == c.key({"b": y, "a": x})


def test_dict_rows_must_agree_across_keys(c: Collator) -> None:
    assert c.rows({"x": np.zeros((3, 2)), "t": ["a", "b", "c"]}) == 3
    with pytest.raises(CollationError) as info:
        c.rows({"x": np.zeros((3, 2)), "t": ["a", "b"]})
    assert isinstance(info.value, TypeError)
    assert info.value.field == "input"
    assert str(info.value) == "input: keys carry different numbers of rows: {'x': 3, 't': 2}"


def test_empty_dict_has_no_rows(c: Collator) -> None:
    with pytest.raises(CollationError, match=r"^input: an empty dict carries no rows$"):
        c.rows({})


def test_dict_output_mismatch_names_the_key(c: Collator) -> None:
    with pytest.raises(BatchSizeMismatch) as info:
        c.split({"a": np.zeros(2), "b": np.zeros(3)}, None, 2)
    assert (info.value.expected, info.value.actual, info.value.field) == (2, 3, "output['b']")


def test_dict_take_and_concat(c: Collator) -> None:
    value = {"x": np.arange(4), "t": ["a", "b", "c", "d"]}
    first, rest = c.take(value, 0, 1), c.take(value, 1, 4)
    assert first["t"] == ["a"]
    whole = c.concat([first, rest])
    np.testing.assert_array_equal(whole["x"], [0, 1, 2, 3])
    assert whole["t"] == ["a", "b", "c", "d"]


def test_dict_subclass_uses_the_dict_handler(c: Collator) -> None:
    ordered = OrderedDict(x=np.zeros(2))
    assert c.key(ordered) == c.key({"x": np.zeros(2)})


# tuples


def test_tuple_stacks_and_splits_per_position(c: Collator) -> None:
    batch = c.stack([(row(0), "a"), (row(1), "b")])
    assert isinstance(batch, tuple)
    assert batch[0].shape == (2, 3)
    assert batch[1] == ["a", "b"]
    pieces = c.split((np.array([1, 2]), ["A", "B"]), None, 2)
    assert [(int(p[0]), p[1]) for p in pieces] == [(1, "A"), (2, "B")]
    assert all(isinstance(p, tuple) for p in pieces)


def test_tuple_mixed_spans(c: Collator) -> None:
    spans: list[Span] = [None, 2]
    batch = c.stack([(np.ones(2), "a"), (np.zeros((2, 2)), ["b", "c"])], spans)
    assert batch[0].shape == (3, 2)
    assert batch[1] == ["a", "b", "c"]
    pieces = c.split(batch, spans, 3)
    assert pieces[0][1] == "a"
    assert pieces[1][1] == ["b", "c"]
    assert pieces[1][0].shape == (2, 2)


def test_tuple_keys_and_rows(c: Collator) -> None:
    assert c.key((np.zeros(2), "s")) == c.key((np.ones(2), "t"))
    assert c.key((np.zeros(2), "s")) != c.key((np.zeros(2),))
    assert c.rows((np.zeros((2, 1)), ["a", "b"])) == 2
    with pytest.raises(CollationError) as info:
        c.rows((np.zeros((2, 1)), ["a", "b", "c"]))
    assert str(info.value) == "input: positions carry different numbers of rows: [2, 3]"
    with pytest.raises(CollationError, match=r"^input: an empty tuple carries no rows$"):
        c.rows(())
    with pytest.raises(CollationError) as nested:
        c.key((np.zeros(2), np.array(1.0)), many=True)
    assert nested.value.field == "input[1]"


def test_tuple_output_mismatch_names_the_position(c: Collator) -> None:
    with pytest.raises(BatchSizeMismatch) as info:
        c.split((np.zeros(3), np.zeros(2)), None, 3)
    assert (info.value.expected, info.value.actual, info.value.field) == (3, 2, "output[1]")


def test_tuple_take_and_concat(c: Collator) -> None:
    value = (np.arange(3), ["a", "b", "c"])
    pieces = [c.take(value, 0, 2), c.take(value, 2, 3)]
    whole = c.concat(pieces)
    np.testing.assert_array_equal(whole[0], [0, 1, 2])
    assert whole[1] == ["a", "b", "c"]


def test_namedtuple_uses_the_tuple_handler(c: Collator) -> None:
    class Pair(NamedTuple):
        x: np.ndarray
        y: str

    assert c.key(Pair(np.zeros(2), "a")) == c.key((np.zeros(2), "b"))


# custom handlers


class Box:
    def __init__(self, n: int) -> None:
        self.n = n


class SmallBox(Box):
    pass


class BoxHandler:
    """Boxes stack into one Box holding the sum; outputs are lists of Boxes."""

    def key(self, collator: Collator, value: Any, many: bool, field: str) -> Hashable:
        return ("box", many)

    def rows(self, collator: Collator, value: Any, field: str) -> int:
        return int(value.n)

    def take(self, collator: Collator, value: Any, start: int, stop: int) -> Any:
        return Box(stop - start)

    def stack(self, collator: Collator, values: list[Any], spans: list[Span] | None) -> Any:
        return Box(sum(v.n for v in values))

    def split(
        self, collator: Collator, output: Any, spans: list[Span] | None, total: int, field: str
    ) -> list[Any]:
        return [Box(output.n)] * total

    def concat(self, collator: Collator, pieces: list[Any]) -> Any:
        return Box(sum(p.n for p in pieces))


def test_custom_handler_for_a_type() -> None:
    c = Collator({Box: BoxHandler()})
    assert c.key(Box(1)) == ("box", False)
    assert c.rows(Box(4)) == 4
    assert c.take(Box(4), 1, 3).n == 2
    assert c.stack([Box(1), Box(2)]).n == 3
    assert [b.n for b in c.split(Box(7), None, 2)] == [7, 7]
    assert c.concat([Box(1), Box(5)]).n == 6


def test_custom_handler_applies_to_subclasses_through_the_mro() -> None:
    handler = BoxHandler()
    c = Collator({Box: handler})
    assert c.handler(SmallBox(1)) is handler
    assert c.key(SmallBox(1)) == ("box", False)


def test_custom_handler_for_a_subclass_wins_over_its_base() -> None:
    base, small = BoxHandler(), BoxHandler()
    c = Collator({Box: base, SmallBox: small})
    assert c.handler(Box(1)) is base
    assert c.handler(SmallBox(1)) is small


def test_custom_handlers_keep_the_builtin_kinds(c: Collator) -> None:
    custom = Collator({Box: BoxHandler()})
    assert custom.key(np.zeros(2)) == c.key(np.zeros(2))
    assert custom.stack(["a", "b"]) == ["a", "b"]
    # handlers belong to the collator they were given to
    assert c.key(Box(1)) is list


def test_custom_handler_inside_a_dict() -> None:
    c = Collator({Box: BoxHandler()})
    batch = c.stack([{"b": Box(1), "s": "x"}, {"b": Box(2), "s": "y"}])
    assert batch["b"].n == 3
    assert batch["s"] == ["x", "y"]


def test_custom_handler_can_override_a_builtin_kind() -> None:
    handler = BoxHandler()
    c = Collator({dict: handler})
    assert c.handler({}) is handler
    assert c.handler(OrderedDict()) is handler


# round trips


spans_strategy = st.lists(st.one_of(st.none(), st.integers(1, 4)), min_size=1, max_size=8)


def numbered(spans: list[Span], width: int) -> list[np.ndarray]:
    """Distinct rows: row r of the batch is [r*width, ..., r*width + width - 1]."""
    values, pos = [], 0
    for span in spans:
        n = 1 if span is None else span
        block = np.arange(pos * width, (pos + n) * width).reshape(n, width)
        values.append(block[0] if span is None else block)
        pos += n
    return values


@settings(max_examples=100, deadline=None)
@given(spans=spans_strategy, width=st.integers(1, 4))
def test_numpy_stack_split_round_trip(spans: list[Span], width: int) -> None:
    c = Collator()
    values = numbered(spans, width)
    total = sum(1 if s is None else s for s in spans)
    if all(s is None for s in spans):
        batch = c.stack(values)
        pieces = c.split(batch, None, total)
    else:
        batch = c.stack(values, spans)
        pieces = c.split(batch, spans, total)
    assert batch.shape == (total, width)
    np.testing.assert_array_equal(batch.ravel(), np.arange(total * width))
    assert len(pieces) == len(values)
    for piece, value in zip(pieces, values, strict=True):
        assert piece.shape == value.shape
        np.testing.assert_array_equal(piece, value)


@settings(max_examples=100, deadline=None)
@given(spans=spans_strategy)
def test_dict_of_array_and_objects_round_trip(spans: list[Span]) -> None:
    c = Collator()
    values = [{"x": a, "tag": a[..., 0].tolist()} for a in numbered(spans, 2)]
    total = sum(1 if s is None else s for s in spans)
    batch = c.stack(values, spans)
    assert batch["tag"] == list(range(0, 2 * total, 2))
    pieces = c.split(batch, spans, total)
    for piece, value in zip(pieces, values, strict=True):
        assert piece["tag"] == value["tag"]
        np.testing.assert_array_equal(piece["x"], value["x"])


@settings(max_examples=100, deadline=None)
@given(rows=st.integers(1, 12), cuts=st.lists(st.integers(0, 12), max_size=4))
def test_take_then_concat_reassembles_a_request(rows: int, cuts: list[int]) -> None:
    c = Collator()
    value = {"x": np.arange(rows * 2).reshape(rows, 2), "t": [f"r{i}" for i in range(rows)]}
    bounds = sorted({0, rows, *(min(cut, rows) for cut in cuts)})
    pieces = [c.take(value, a, b) for a, b in itertools.pairwise(bounds)]
    whole = c.concat(pieces)
    np.testing.assert_array_equal(whole["x"], value["x"])
    assert whole["t"] == value["t"]


# import hygiene


def test_carpool_does_not_import_torch() -> None:
    code = "import carpool, sys; assert 'torch' not in sys.modules, 'carpool imported torch'"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("many", [True, False])
@pytest.mark.parametrize(
    "array",
    [np.zeros((3, 4), np.float32), np.arange(2), np.float32(1.5)],
    ids=["2-d", "1-d", "scalar"],
)
def test_a_one_array_dict_keys_and_counts_as_every_dict_does(
    c: Collator, array: Any, many: bool
) -> None:
    # The one-array case has a shortcut (the server's every request): the same answers.
    if many and np.ndim(array) == 0:
        with pytest.raises(CollationError, match="needs a batch axis"):
            c.key({"x": array}, many=True)
        return
    pair = c.key({"x": array, "y": array}, many)
    assert c.key({"x": array}, many) == (dict, pair[1])
    if np.ndim(array):
        assert c.rows({"x": array}) == c.rows({"x": array, "y": array}) == len(array)


def test_a_one_array_dict_takes_a_custom_array_handler() -> None:
    class Tagged:
        def key(self, collator: Collator, value: Any, many: bool, field: str) -> Hashable:
            return ("tagged", value.dtype)

        def rows(self, collator: Collator, value: Any, field: str) -> int:
            return 7

    collator = Collator(handlers={np.ndarray: Tagged()})  # type: ignore[dict-item]
    assert collator.key({"x": np.zeros(3)}, many=True) == (dict, ("x", ("tagged", np.float64)))
    assert collator.rows({"x": np.zeros(3)}) == 7
