"""Large JSON arrays read piece by piece (:mod:`carpool.server.rest.json_arrays`): the same
answers and refusals as the whole text read at once, in a fraction of its memory.

Equivalence runs with tiny thresholds, so every array is cut and read in many pieces, and
compares :func:`~carpool.server.rest.codec.parse_infer_request` with cutting on and off.
Memory is measured by tracemalloc, which sees numpy's buffers as well as Python objects.
"""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from carpool.server.messages import ProtocolError
from carpool.server.rest import codec as rest_codec
from carpool.server.rest import json_arrays
from carpool.server.rest.codec import parse_infer_request
from carpool.server.rest.json_arrays import Lifted, lift

MAX = 2**31
BOUNDED = settings(max_examples=300, derandomize=True, deadline=None, database=None)


def _body(data: Any, *, datatype: str = "FP32", shape: list[int] | None = None) -> bytes:
    count = len(np.asarray(data, dtype=object).reshape(-1)) if shape is None else None
    entry = {"name": "X", "datatype": datatype, "shape": shape or [count], "data": data}
    return json.dumps({"inputs": [entry]}).encode()


def _outcome(body: bytes) -> tuple[str, Any]:
    try:
        request = parse_infer_request(body, None, max_elements=MAX)
    except (ProtocolError, ValueError) as exc:
        return "refused", str(exc)
    tensor = request.inputs[0]
    return "read", (tensor.data.dtype.str, tensor.data.tobytes(), tensor.shape)


def _both(body: bytes, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    # The body read whole, then cut into pieces of a few bytes.
    whole = _outcome(body)
    with monkeypatch.context() as m:
        m.setattr(json_arrays, "LIFT_BYTES", 8)
        m.setattr(json_arrays, "PIECE_BYTES", 3)
        cut = _outcome(body)
    return whole, cut


@pytest.mark.parametrize(
    "text",
    [
        b"[1, 2.5, -3e2, 4E-1, 0, -0.0, 7, 8, 9, 10, 11, 12]",
        b"[[1,2,3],[4,5,6],[7,8,9],[10,11,12]]",
        b"[[[1,2],[3,4]],[[5,6],[7,8]],[[9,10],[11,12]]]",
        b"[[1],[2,[3,4]],5,[[6]],7,8,9,10,11,12]",  # ragged: Triton reads it row-major
        b"[ 1 ,\n 2 ,\t3 , 4 , 5 , 6 , 7 , 8 , 9 , 10 , 11 , 12 ]",
    ],
)
@pytest.mark.parametrize("datatype", ["FP32", "FP64", "FP16", "INT32", "INT8", "UINT8", "INT64"])
def test_cut_arrays_read_as_the_whole_text_reads_them(
    text: bytes, datatype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = b'{"inputs":[{"name":"X","datatype":"%s","shape":[12],"data":%s}]}' % (
        datatype.encode(),
        text,
    )
    whole, cut = _both(body, monkeypatch)
    assert cut == whole
    if datatype.startswith("INT") and b"." in text:
        assert whole[0] == "refused"  # 2.5 is not an integer: the same message names it
    elif datatype in ("INT8", "UINT8") and b"-3e2" in text:
        assert whole[0] == "refused"


@pytest.mark.parametrize(
    "text",
    [
        b"[1,,2,3,4,5,6,7,8,9,10,11]",
        b"[1,2,3,4,5,6,7,8,9,10,11,]",
        b"[,1,2,3,4,5,6,7,8,9,10,11]",
        b"[1 2,3,4,5,6,7,8,9,10,11,12]",
        b"[01,2,3,4,5,6,7,8,9,10,11]",
        b"[1.,2,3,4,5,6,7,8,9,10,11]",
        b"[.5,2,3,4,5,6,7,8,9,10,11]",
        b"[+1,2,3,4,5,6,7,8,9,10,11]",
        b"[1e400,2,3,4,5,6,7,8,9,10,11]",
        b"[[1,2],[3,4][5,6],[7,8],[9,10],[11,12]]",
    ],
)
def test_json_the_whole_text_refuses_is_refused_with_its_message(
    text: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = b'{"inputs":[{"name":"X","datatype":"FP32","shape":[12],"data":%s}]}' % text
    whole, cut = _both(body, monkeypatch)
    assert whole[0] == "refused"
    assert cut == whole


@pytest.mark.parametrize(
    "text",
    [b"[[1,2],[3,4]],[5,6,7,8,9,10,11,12]", b"[[1,2],[3,4],[5,6],[7,8],[9,10],[11,12]]]"],
)
def test_brackets_that_close_the_array_early_or_late_are_refused(
    text: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The whole text's reader stops at the first bracket too many; the cut one sees the
    # run of numbers and brackets as one array that does not parse. Both say it is JSON.
    body = b'{"inputs":[{"name":"X","datatype":"FP32","shape":[12],"data":%s}]}' % text
    whole, cut = _both(body, monkeypatch)
    prefix = "failed to parse the request JSON buffer: "
    assert whole[0] == cut[0] == "refused"
    assert whole[1].startswith(prefix)
    assert cut[1].startswith(prefix)


def test_a_count_the_shape_does_not_take_is_refused_as_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for count in (11, 13):
        body = _body(list(range(12)), shape=[count])
        whole, cut = _both(body, monkeypatch)
        assert (
            cut
            == whole
            == (
                "refused",
                f"Unable to parse 'data' of input 'X': it holds 12 elements but the shape needs "
                f"{count}",
            )
        )


@pytest.mark.parametrize(
    "body",
    [
        # a cut-out array that is not an input's data: read again whole, and refused there
        b'{"parameters":{"data":[1,2,3,4,5,6,7,8]},"inputs":[]}',
        # the same input's data twice: the last one counts, as orjson has it
        b'{"inputs":[{"name":"X","datatype":"FP32","shape":[4],"data":[1,2,3,4,5],'
        b'"data":[5,6,7,8]}]}',
        # a key that only looks like "data" from the inside of a string
        b'{"id":"\\"data\\":[1,2,3,4,5,6,7,8]","inputs":[{"name":"X","datatype":"FP32",'
        b'"shape":[2],"data":[1,2]}]}',
        b'{"inputs":[{"name":"X","datatype":"BYTES","shape":[8],"data":[1,2,3,4,5,6,7,8]}]}',
        b'{"inputs":[{"name":"X","datatype":"BOOL","shape":[8],"data":[1,2,3,4,5,6,7,8]}]}',
        b'{"inputs":[{"name":"X","datatype":"BF16","shape":[8],"data":[1,2,3,4,5,6,7,8]}]}',
        b'{"inputs":[{"name":"X","datatype":"FP32","shape":[8],"data":[1,2,3,4,5,6,7,8]}],}',
        b'{"inputs":[{"name":"X","datatype":"FP32","shape":[8],"data":[1,2,3,4,5,6,7,NaN]}]}',
    ],
)
def test_cut_arrays_elsewhere_in_the_body_change_nothing(
    body: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole, cut = _both(body, monkeypatch)
    assert cut == whole


def test_a_syntax_error_after_a_cut_array_names_its_place_in_the_body_sent() -> None:
    numbers = ",".join(["0.5"] * 200_000)
    body = b'{"inputs":[{"name":"X","datatype":"FP32","shape":[200000],"data":[%s]}] x}' % (
        numbers.encode()
    )
    assert lift(body) is not None
    whole = _outcome(body)
    assert whole[0] == "refused"
    with pytest.raises(ProtocolError) as caught:
        rest_codec._read_header(body, MAX, cut=False)
    assert str(caught.value) == whole[1]
    at = body.rindex(b"x")
    assert f"(char {at})" in whole[1]


@BOUNDED
@given(
    st.lists(
        st.one_of(
            st.integers(-(2**70), 2**70),
            st.floats(allow_nan=False, allow_infinity=False),
            st.lists(st.integers(-300, 300), max_size=4),
        ),
        max_size=24,
    ),
    st.sampled_from(["FP32", "FP64", "INT16", "INT64", "UINT32"]),
    st.integers(0, 30),
)
def test_any_array_of_numbers_reads_the_same_cut_or_whole(
    data: list[Any], datatype: str, count: int
) -> None:
    body = _body(data, datatype=datatype, shape=[count])
    whole = _outcome(body)
    saved = json_arrays.LIFT_BYTES, json_arrays.PIECE_BYTES
    json_arrays.LIFT_BYTES, json_arrays.PIECE_BYTES = 8, 5
    try:
        cut = _outcome(body)
    finally:
        json_arrays.LIFT_BYTES, json_arrays.PIECE_BYTES = saved
    assert cut == whole


def _peak(body: bytes, *, cut: bool) -> int:
    tracemalloc.start()
    try:
        rest_codec._read_header(body, MAX, cut=cut)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_large_body_of_floats_costs_a_fraction_of_itself_not_many_times_itself() -> None:
    values = np.random.default_rng(0).random(1_000_000).round(3)
    body = _body(values.tolist(), shape=[values.size])
    flat, nested = body, _body(values.reshape(1000, 1000).tolist(), shape=[1000, 1000])
    for text in (flat, nested):
        lifted = lift(text)
        assert isinstance(lifted, Lifted)
        assert len(lifted.spans) == 1
        read = rest_codec._read_header(text, MAX).inputs[0].data
        assert read is not None
        assert np.array_equal(read, values.astype(np.float32))
        cut, whole = _peak(text, cut=True), _peak(text, cut=False)
        assert cut < 1.0 * len(text), (cut, len(text))  # the array, the skeleton, a piece
        assert whole > 4 * len(text), (whole, len(text))  # a Python float per element
