"""Ragged-input padding and allowed batch sizes: validation, keys, stack, unpad; pure."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from carpool.collation.collate import Collator, Span
from carpool.collation.padding import PaddedBatch, Padding, allowed_size, pad_rows, take_rows
from carpool.errors import CollationError


def exactly(message: str) -> str:
    """A ``pytest.raises`` pattern matching ``message`` and nothing more."""
    return f"^{re.escape(message)}$"


def ids(*values: int, dtype: Any = np.int64) -> np.ndarray:
    return np.array(values, dtype=dtype)


def tokens(length: int, start: int = 1, rows: int | None = None) -> np.ndarray:
    """One row (``rows=None``) or ``rows`` rows of ``length`` tokens counting from ``start``."""
    row = np.arange(start, start + length, dtype=np.int64)
    return row if rows is None else np.stack([row + 100 * r for r in range(rows)])


# ----------------------------------------------------------------------- validation


def test_padding_normalizes_its_fields() -> None:
    inputs = {"ids": 0, "pos": -1.5}
    padding = Padding(inputs, buckets=[16, 128], lengths="n", outputs={"tok": 0, "img": [0, 1]})
    inputs["ids"] = 99  # a copy was taken
    assert padding.inputs == {"ids": 0, "pos": -1.5}
    assert padding.buckets == (16, 128)
    assert padding.outputs == {"tok": (0,), "img": (0, 1)}
    assert padding.first == "ids"
    assert Padding({"b": 0, "a": 0}).first == "b"  # the first listed, not the first sorted


@pytest.mark.parametrize("inputs", [{}, {1: 0}])
def test_padding_needs_named_inputs(inputs: Any) -> None:
    with pytest.raises(ValueError, match=r"^padding inputs must map at least one input name"):
        Padding(inputs)


@pytest.mark.parametrize("value", ["0", None, True, [0]])
def test_pad_values_must_be_numbers(value: Any) -> None:
    with pytest.raises(
        ValueError, match=exactly("padding for input 'ids': pad value must be a number")
    ):
        Padding({"ids": value})


@pytest.mark.parametrize("buckets", [(16, 8), (8, 8), (0, 8), (-4,), (True,), (8.0,), ("8",)])
def test_buckets_must_be_ascending_positive_ints(buckets: Any) -> None:
    with pytest.raises(
        ValueError,
        match=exactly(f"padding buckets must be ascending ints >= 1, got {list(buckets)}"),
    ):
        Padding({"ids": 0}, buckets=buckets)


def bad_axes(axes: Any) -> str:
    return exactly(
        "padding for output 'tok': give the row axis (>= 0) that follows the input's "
        f"length, got {axes!r}"
    )


@pytest.mark.parametrize("axes", [-1, (), (0, -1), True, "0", (0.0,)])
def test_output_axes_must_be_non_negative_ints(axes: Any) -> None:
    with pytest.raises(ValueError, match=bad_axes(axes)):
        Padding({"ids": 0}, outputs={"tok": axes})


@pytest.mark.parametrize("axes", [None, 1.5])
def test_output_axes_that_are_not_iterable_are_a_value_error_too(axes: Any) -> None:
    # Validation at the door: a bad axis spec is the same ValueError whatever its type.
    with pytest.raises(ValueError, match=bad_axes(axes)):
        Padding({"ids": 0}, outputs={"tok": axes})


def test_lengths_input_must_not_be_a_ragged_input() -> None:
    with pytest.raises(
        ValueError, match=exactly("padding lengths input 'mask' is also a ragged input")
    ):
        Padding({"ids": 0, "mask": 0}, lengths="mask")


# ----------------------------------------------------------------------- buckets


def test_bucket_is_the_smallest_bound_that_holds_the_length() -> None:
    padding = Padding({"ids": 0}, buckets=(16, 128))
    got = {n: padding.bucket(n) for n in (1, 15, 16, 17, 127, 128, 129, 1000)}
    assert got == {1: 16, 15: 16, 16: 16, 17: 128, 127: 128, 128: 128, 129: 129, 1000: 1000}


def test_without_buckets_every_length_is_one_group() -> None:
    padding = Padding({"ids": 0})
    assert {padding.bucket(n) for n in (1, 7, 100_000)} == {0}


# ----------------------------------------------------------------------- keys


@pytest.fixture
def bucketed() -> Collator:
    return Padding({"ids": 0}, buckets=(16, 128)).collator()


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        (5, 16, True),
        (1, 5, True),
        (17, 128, True),
        (16, 17, False),
        (5, 100, False),
        (129, 129, True),
        (129, 130, False),  # beyond the last bound a length is its own group
    ],
)
def test_key_groups_rows_by_length_bucket(bucketed: Collator, a: int, b: int, same: bool) -> None:
    assert (bucketed.key({"ids": tokens(a)}) == bucketed.key({"ids": tokens(b)})) is same
    many_a = bucketed.key({"ids": tokens(a, rows=2)}, many=True)
    many_b = bucketed.key({"ids": tokens(b, rows=3)}, many=True)
    assert (many_a == many_b) is same


def test_without_buckets_all_lengths_share_a_key() -> None:
    c = Padding({"ids": 0}).collator()
    assert len({c.key({"ids": tokens(n)}) for n in (1, 2, 50, 4096)}) == 1


def test_single_rows_and_multi_row_requests_of_one_bucket_share_a_key(
    bucketed: Collator,
) -> None:
    # As with plain arrays (the key of a k-row request drops its batch axis), infer() of one
    # row and infer_many() of k rows of the same kind and bucket can share a batch.
    assert Collator().key(tokens(5)) == Collator().key(tokens(5, rows=2), many=True)
    assert bucketed.key({"ids": tokens(5)}) == bucketed.key({"ids": tokens(7, rows=2)}, many=True)


def test_non_ragged_inputs_must_still_match_exactly(bucketed: Collator) -> None:
    def req(length: int, width: int, dtype: Any = np.float32) -> dict[str, Any]:
        return {"ids": tokens(length), "x": np.zeros(width, dtype)}

    assert bucketed.key(req(3, 4)) == bucketed.key(req(9, 4))
    assert bucketed.key(req(3, 4)) != bucketed.key(req(3, 5))
    assert bucketed.key(req(3, 4)) != bucketed.key(req(3, 4, np.float64))


def test_dtypes_and_ranks_of_ragged_inputs_split_keys(bucketed: Collator) -> None:
    assert bucketed.key({"ids": tokens(3)}) != bucketed.key({"ids": tokens(3).astype(np.int32)})
    assert bucketed.key({"ids": np.zeros((3, 3))}) != bucketed.key({"ids": np.zeros(3)})


def test_multi_axis_ragged_inputs_bucket_every_axis() -> None:
    c = Padding({"img": 0}, buckets=(8, 32)).collator()
    key = c.key({"img": np.zeros((5, 7, 3), np.uint8)})
    assert key == c.key({"img": np.zeros((8, 1, 3), np.uint8)})
    assert key != c.key({"img": np.zeros((5, 9, 3), np.uint8)})
    assert key != c.key({"img": np.zeros((9, 7, 3), np.uint8)})


def test_key_refuses_a_request_without_the_first_ragged_input(bucketed: Collator) -> None:
    with pytest.raises(CollationError) as info:
        bucketed.key({"x": np.zeros(3)})
    assert info.value.field == "input"
    assert info.value.detail == "the ragged input 'ids' is missing"


@pytest.mark.parametrize(
    ("value", "many", "described"),
    [
        ([1, 2, 3], False, "list of shape []"),
        (np.int64(3), False, "int64 of shape []"),
        (np.array(3), False, "ndarray of shape []"),
        (np.arange(3), True, "ndarray of shape [3]"),
    ],
)
def test_key_refuses_ragged_inputs_without_a_length_axis(
    bucketed: Collator, value: Any, many: bool, described: str
) -> None:
    with pytest.raises(CollationError) as info:
        bucketed.key({"ids": value}, many=many)
    assert info.value.field == "ids"
    assert info.value.detail == (
        "ragged input 'ids' must be a numpy array with a batch axis and at least one more "
        f"axis, got {described}"
    )


# ----------------------------------------------------------------------- stack


def test_stack_pads_single_rows_to_the_longest_in_the_batch_not_the_bucket() -> None:
    padding = Padding({"ids": -1, "pos": 0.5}, buckets=(16,))
    batch = padding.collator().stack(
        [
            {"ids": ids(1, 2, 3), "pos": np.array([0.0, 1.0], np.float32)},
            {"ids": ids(4, 5, 6, 7, 8), "pos": np.array([2.0], np.float32)},
        ]
    )
    assert isinstance(batch, PaddedBatch)
    assert list(batch) == ["ids", "pos"]
    assert batch["ids"].dtype == np.int64
    assert batch["ids"].tolist() == [[1, 2, 3, -1, -1], [4, 5, 6, 7, 8]]
    assert batch["pos"].dtype == np.float32
    assert batch["pos"].tolist() == [[0.0, 1.0], [2.0, 0.5]]
    assert batch.lengths.dtype == np.int64
    assert batch.lengths.tolist() == [[3], [5]]


def test_stack_of_equal_lengths_adds_no_padding() -> None:
    batch = Padding({"ids": 0}).collator().stack([{"ids": ids(1, 2)}, {"ids": ids(3, 4)}])
    assert batch["ids"].tolist() == [[1, 2], [3, 4]]
    assert batch.lengths.tolist() == [[2], [2]]


def test_stack_pads_multi_row_segments_and_stacks_other_inputs_as_usual() -> None:
    padding = Padding({"ids": 0}, lengths="n")
    values = [
        {"ids": tokens(2, rows=2), "w": np.array([1.0, 2.0])},  # 2 rows of 2 tokens
        {"ids": tokens(4), "w": np.float64(3.0)},  # one row, no batch axis
        {"ids": tokens(3, rows=1), "w": np.array([4.0])},
    ]
    spans: list[Span] = [2, None, 1]
    batch = padding.collator().stack(values, spans)
    assert batch["ids"].tolist() == [
        [1, 2, 0, 0],
        [101, 102, 0, 0],
        [1, 2, 3, 4],
        [1, 2, 3, 0],
    ]
    assert batch["w"].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert batch.lengths.tolist() == [[2], [2], [4], [3]]
    assert batch["n"].dtype == np.int64
    assert batch["n"].tolist() == [2, 2, 4, 3]  # (rows,) for one ragged axis


def test_stack_pads_every_axis_of_multi_axis_inputs() -> None:
    padding = Padding({"img": 255}, lengths="hw")
    a = np.zeros((2, 3, 3), np.uint8)
    b = np.ones((1, 4, 3), np.uint8)
    batch = padding.collator().stack([{"img": a}, {"img": b}])
    assert batch["img"].shape == (2, 2, 4, 3)
    assert batch["img"].dtype == np.uint8
    np.testing.assert_array_equal(batch["img"][0, :2, :3], a)
    assert (batch["img"][0, :, 3] == 255).all()
    np.testing.assert_array_equal(batch["img"][1, :1, :4], b)
    assert (batch["img"][1, 1] == 255).all()
    assert batch.lengths.tolist() == [[2, 3, 3], [1, 4, 3]]
    assert batch["hw"].tolist() == [[2, 3, 3], [1, 4, 3]]  # (rows, ndim) for several axes


def test_split_and_concat_are_the_dict_handler_s() -> None:
    c = Padding({"ids": 0}, outputs={"tok": 0}).collator()
    output = {"s": np.arange(4), "tok": [ids(1), ids(2, 2), ids(3), ids(4, 4, 4)]}
    parts = c.split(output, [None, 2, 1], 4)
    assert len(parts) == 3
    assert parts[0]["s"] == 0
    assert parts[0]["tok"].tolist() == [1]
    assert parts[1]["s"].tolist() == [1, 2]
    assert [r.tolist() for r in parts[1]["tok"]] == [[2, 2], [3]]
    assert [r.tolist() for r in parts[2]["tok"]] == [[4, 4, 4]]
    whole = c.concat([parts[1], parts[2]])
    assert whole["s"].tolist() == [1, 2, 3]
    assert [r.tolist() for r in whole["tok"]] == [[2, 2], [3], [4, 4, 4]]


# ----------------------------------------------------------------------- unpad


def test_unpad_cuts_ragged_outputs_per_row_and_leaves_others_alone() -> None:
    padding = Padding({"ids": 0}, outputs={"tok": 0, "chan": 1, "absent": 0})
    tok = np.arange(8).reshape(2, 4)
    chan = np.arange(16).reshape(2, 2, 4)
    score = np.array([0.5, 1.5])
    outputs = {"tok": tok, "chan": chan, "score": score}
    got = padding.unpad(outputs, np.array([[3], [1]]))
    assert list(outputs) == ["tok", "chan", "score"]  # not mutated
    assert outputs["tok"] is tok
    assert list(got) == ["tok", "chan", "score"]
    assert isinstance(got["tok"], list)
    assert [r.tolist() for r in got["tok"]] == [[0, 1, 2], [4]]
    assert [r.tolist() for r in got["chan"]] == [[[0, 1, 2], [4, 5, 6]], [[8], [12]]]
    assert got["score"] is score


def test_unpad_cuts_several_axes_with_one_length_each() -> None:
    padding = Padding({"img": 0}, outputs={"mask": (0, 1)})
    mask = np.arange(2 * 3 * 4).reshape(2, 3, 4)
    got = padding.unpad({"mask": mask}, np.array([[2, 3, 3], [3, 1, 3]]))
    assert [r.shape for r in got["mask"]] == [(2, 3), (3, 1)]
    np.testing.assert_array_equal(got["mask"][0], mask[0, :2, :3])
    np.testing.assert_array_equal(got["mask"][1], mask[1, :3, :1])


@pytest.mark.parametrize(("axes", "shape"), [(0, (2,)), (1, (2, 4)), ((0, 2), (2, 4, 4))])
def test_unpad_refuses_an_output_without_the_axis(axes: Any, shape: tuple[int, ...]) -> None:
    padding = Padding({"ids": 0}, outputs={"tok": axes})
    last = max(axes) if isinstance(axes, tuple) else axes
    message = (
        f"padded output 'tok' has shape {list(shape)}; it has no row axis {last} to cut "
        "back to each row's length"
    )
    with pytest.raises(ValueError, match=exactly(message)):
        padding.unpad({"tok": np.zeros(shape)}, np.array([[1, 1], [2, 2]]))


# ----------------------------------------------------------------------- allowed batch sizes


def test_allowed_size_is_the_smallest_that_holds_the_rows() -> None:
    assert [allowed_size(n, (4, 8)) for n in (1, 3, 4, 5, 8)] == [4, 4, 4, 8, 8]
    assert allowed_size(1, (1,)) == 1


def test_allowed_size_refuses_more_rows_than_the_largest() -> None:
    with pytest.raises(
        ValueError, match=exactly("a batch of 9 rows exceeds the largest allowed size 8")
    ):
        allowed_size(9, (4, 8))


def test_pad_rows_repeats_the_last_row() -> None:
    array = np.arange(6).reshape(3, 2)
    padded = pad_rows(array, 5)
    assert padded.tolist() == [[0, 1], [2, 3], [4, 5], [4, 5], [4, 5]]
    assert array.shape == (3, 2)
    assert pad_rows(array, 3) is array
    assert pad_rows(array, 2) is array  # never shrinks
    assert pad_rows([[1], [2]], 3).tolist() == [[1], [2], [2]]


def test_pad_rows_pads_every_input_of_a_dict() -> None:
    padded = pad_rows({"a": np.array([1, 2]), "b": np.array([[1.0], [2.0]])}, 4)
    assert type(padded) is dict
    assert padded["a"].tolist() == [1, 2, 2, 2]
    assert padded["b"].tolist() == [[1.0], [2.0], [2.0], [2.0]]


def test_pad_rows_keeps_a_padded_batch_and_its_lengths() -> None:
    batch = Padding({"ids": 0}, lengths="n").collator().stack([{"ids": ids(1)}, {"ids": ids(2, 3)}])
    padded = pad_rows(batch, 4)
    assert isinstance(padded, PaddedBatch)
    assert padded["ids"].tolist() == [[1, 0], [2, 3], [2, 3], [2, 3]]
    assert padded["n"].tolist() == [1, 2, 2, 2]
    # The model gets one length per row it is given, filler rows included (copies of the
    # last real row's, like the "n" input); the first rows are the real rows' lengths.
    assert padded.lengths.tolist() == [[1], [2], [2], [2]]


def test_take_rows_keeps_the_first_rows_of_every_output() -> None:
    outputs = {
        "a": np.arange(8).reshape(4, 2),
        "b": [10, 11, 12, 13],
        "c": {"d": np.arange(4)},
        "e": (np.arange(4), [0, 1, 2, 3]),
    }
    got = take_rows(outputs, 2)
    assert got["a"].tolist() == [[0, 1], [2, 3]]
    assert got["b"] == [10, 11]
    assert got["c"]["d"].tolist() == [0, 1]
    assert got["e"][0].tolist() == [0, 1]
    assert got["e"][1] == [0, 1]
    assert take_rows(np.arange(3), 2).tolist() == [0, 1]


# ----------------------------------------------------------------------- round trip


PAD = -7  # never a real token (tokens are >= 1), so leaked padding shows


def echo(padding: Padding, batch: PaddedBatch) -> dict[str, Any]:
    """A model: doubled tokens (ragged) and each row's sum over its real tokens."""
    real = np.arange(batch["ids"].shape[1]) < batch["n"][:, np.newaxis]
    outputs = {"tok": batch["ids"] * 2, "sum": np.where(real, batch["ids"], 0).sum(axis=1)}
    return padding.unpad(outputs, batch.lengths)


requests = st.lists(
    st.tuples(st.integers(1, 12), st.one_of(st.none(), st.integers(1, 3))),
    min_size=1,
    max_size=8,
)


@settings(max_examples=150, deadline=None)
@given(requests=requests, buckets=st.sampled_from([(), (4,), (2, 8), (1, 3, 6, 12)]))
def test_each_segment_gets_exactly_its_own_unpadded_rows(
    requests: list[tuple[int, Span]], buckets: tuple[int, ...]
) -> None:
    padding = Padding({"ids": PAD}, buckets=buckets, lengths="n", outputs={"tok": 0})
    c = padding.collator()
    values = [
        {"ids": tokens(length, start=1000 * i + 1, rows=span)}
        for i, (length, span) in enumerate(requests)
    ]
    spans = [span for _, span in requests]
    groups: dict[Any, list[int]] = {}
    for i, (value, span) in enumerate(zip(values, spans, strict=True)):
        groups.setdefault(c.key(value, span is not None), []).append(i)
    for members in groups.values():
        seg_values = [values[i] for i in members]
        seg_spans = [spans[i] for i in members]
        batch = c.stack(seg_values, seg_spans)
        longest = max(requests[i][0] for i in members)
        assert batch["ids"].shape[1] == longest  # the longest in the batch, not the bucket
        total = sum(1 if s is None else s for s in seg_spans)
        parts = c.split(echo(padding, batch), seg_spans, total)
        for i, part in zip(members, parts, strict=True):
            own = values[i]["ids"]
            if spans[i] is None:
                assert part["tok"].tolist() == (own * 2).tolist()
                assert part["sum"] == own.sum()
            else:
                assert [r.tolist() for r in part["tok"]] == (own * 2).tolist()
                assert part["sum"].tolist() == own.sum(axis=1).tolist()
