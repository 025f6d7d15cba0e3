"""Request shapes from metadata, generated and read data, and v2 bodies checked two ways:
decoded by carpool's own server parser, and byte for byte against tritonclient's."""

from __future__ import annotations

import json
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as httpclient

from carpool.bench.targets.payload import (
    HEADER_LENGTH,
    InputSpec,
    RequestSpec,
    encode,
    generate,
    is_unique,
    spec_from_metadata,
)
from carpool.datatypes import DATATYPES
from carpool.server.rest.codec import parse_header_length, parse_infer_request

ALL_TYPES = list(DATATYPES)
JSON_TYPES = [t for t in ALL_TYPES if t != "BF16"]


def _metadata(*inputs: tuple[str, str, list[int]]) -> dict[str, Any]:
    return {
        "name": "m",
        "inputs": [{"name": n, "datatype": d, "shape": s} for n, d, s in inputs],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 1]}],
    }


DEMO = _metadata(("INPUT0", "FP32", [-1, 256]))
EVERY_TYPE = _metadata(*[(f"x_{t.lower()}", t, [-1, 2, 3]) for t in ALL_TYPES])
EVERY_TYPE_SPEC = spec_from_metadata(EVERY_TYPE, rows=2)

# spec_from_metadata


def test_spec_from_metadata_batch_axis_becomes_rows() -> None:
    assert spec_from_metadata(DEMO) == RequestSpec((InputSpec("INPUT0", "FP32", (1, 256)),))
    assert spec_from_metadata(DEMO, rows=8).inputs[0].shape == (8, 256)


def test_spec_from_metadata_keeps_input_order_and_datatypes() -> None:
    meta = _metadata(("ids", "INT64", [-1, 16]), ("mask", "BOOL", [-1, 16]))
    assert spec_from_metadata(meta, rows=3) == RequestSpec(
        (InputSpec("ids", "INT64", (3, 16)), InputSpec("mask", "BOOL", (3, 16)))
    )


def test_spec_from_metadata_other_dims_of_any_size_come_from_shapes() -> None:
    meta = _metadata(("x", "FP32", [-1, -1, 4]), ("y", "INT32", [-1, 2]))
    spec = spec_from_metadata(meta, rows=2, shapes={"x": (7, 4)})
    assert spec.inputs == (InputSpec("x", "FP32", (2, 7, 4)), InputSpec("y", "INT32", (2, 2)))


def test_spec_from_metadata_names_the_shape_option_for_an_open_dimension() -> None:
    meta = _metadata(("x", "FP32", [-1, -1]))
    with pytest.raises(
        ValueError, match=r"^input 'x' has a dimension of any size \(\[-1, -1\]\); "
    ) as e:
        spec_from_metadata(meta)
    assert str(e.value).endswith("give it with --shape x:DIMS")


def test_spec_from_metadata_without_batching_uses_the_shape_as_is() -> None:
    meta = _metadata(("x", "FP32", [3, 4]))
    assert spec_from_metadata(meta, rows=16).inputs[0].shape == (3, 4)  # rows ignored
    open_meta = _metadata(("x", "FP32", [-1, 4]))
    spec = spec_from_metadata(open_meta, rows=16, batched=False, shapes={"x": (5, 4)})
    assert spec.inputs[0].shape == (5, 4)  # -1 is not a batch axis here
    with pytest.raises(ValueError, match="dimension of any size"):
        spec_from_metadata(open_meta, batched=False)


def test_spec_from_metadata_decides_batching_from_every_input() -> None:
    meta = _metadata(("x", "FP32", [-1, 4]), ("y", "FP32", [4]))
    with pytest.raises(ValueError, match="input 'x' has a dimension of any size"):
        spec_from_metadata(meta, rows=2)  # not batched: y has no leading -1
    spec = spec_from_metadata(meta, rows=2, batched=True)
    assert [i.shape for i in spec.inputs] == [(2, 4), (2,)]  # y's leading dim is its batch


@pytest.mark.parametrize(
    ("metadata", "kwargs", "message"),
    [
        ({}, {}, "model metadata has no 'inputs' list"),
        ({"inputs": []}, {}, "model metadata has no 'inputs' list"),
        ({"inputs": [{"datatype": "FP32"}]}, {}, r"inputs\[0\] has no name"),
        (_metadata(("x", "FP8", [-1])), {}, "input 'x' has datatype 'FP8', expected one of BOOL"),
        (_metadata(("x", "FP32", [-1, -2])), {}, r"input 'x' has shape \[-1, -2\]"),
        (DEMO, {"rows": 0}, "rows must be an int >= 1, got 0"),
        (DEMO, {"shapes": {"y": (3,)}}, "--shape names input 'y', which the model does not have"),
        (DEMO, {"shapes": {"INPUT0": (255,)}}, r"--shape INPUT0:255 does not fit input 'INPUT0'"),
        (DEMO, {"shapes": {"INPUT0": (256, 1)}}, r"give 1 dims of one row"),
        (_metadata(("x", "FP32", [])), {"batched": True}, "has shape \\[\\], so it has no batch"),
    ],
)
def test_spec_from_metadata_refuses(
    metadata: dict[str, Any], kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        spec_from_metadata(metadata, **kwargs)


# generate


def test_generate_every_datatype_in_carpools_dtype_and_range() -> None:
    requests = generate(EVERY_TYPE_SPEC, 4, seed=0)
    assert len(requests) == 4
    for request in requests:
        assert list(request) == [i.name for i in EVERY_TYPE_SPEC.inputs]
        for spec_input in EVERY_TYPE_SPEC.inputs:
            array = request[spec_input.name]
            assert array.shape == (2, 2, 3)
            assert array.dtype == DATATYPES[spec_input.datatype]
            if spec_input.datatype in ("FP16", "FP32", "FP64", "BF16"):
                assert np.all((array >= -1) & (array <= 1))
            elif spec_input.datatype == "BYTES":
                assert all(isinstance(b, bytes) and b for b in array.reshape(-1))
            elif spec_input.datatype != "BOOL":
                assert np.all((array >= 0) & (array < 100))


def test_generate_bf16_values_are_exactly_representable() -> None:
    spec = RequestSpec((InputSpec("x", "BF16", (1, 64)),))
    [request] = generate(spec, 1, seed=0)
    bits = request["x"].view(np.uint32)
    assert np.all(bits & 0xFFFF == 0)  # the lower half of each float32 is zero


def test_generate_is_deterministic_and_requests_differ() -> None:
    a = generate(EVERY_TYPE_SPEC, 3, seed=11)
    b = generate(EVERY_TYPE_SPEC, 3, seed=11)
    c = generate(EVERY_TYPE_SPEC, 3, seed=12)
    for name in a[0]:
        for i in range(3):
            np.testing.assert_array_equal(a[i][name], b[i][name])
        assert not np.array_equal(a[0][name], a[1][name])
        assert not np.array_equal(a[0][name], c[0][name])


def test_generate_bytes_cycle_through_strings() -> None:
    spec = RequestSpec((InputSpec("text", "BYTES", (2,)),))
    requests = generate(spec, 3, seed=0, strings=["héllo", "a", "b"])
    assert [r["text"].tolist() for r in requests] == [
        ["héllo".encode(), b"a"],
        [b"b", "héllo".encode()],
        [b"a", b"b"],
    ]


def test_generate_random_words_are_lowercase_ascii() -> None:
    spec = RequestSpec((InputSpec("text", "BYTES", (50,)),))
    [request] = generate(spec, 1, seed=0)
    for item in request["text"]:
        words = item.split(b" ")
        assert 1 <= len(words) <= 8
        assert all(2 <= len(w) <= 9 and w.isalpha() and w.islower() for w in words)


def test_generate_refuses() -> None:
    assert generate(EVERY_TYPE_SPEC, 0, seed=0) == []
    with pytest.raises(ValueError, match="count must be an int >= 0, got -1"):
        generate(EVERY_TYPE_SPEC, -1, seed=0)
    with pytest.raises(ValueError, match="strings is empty"):
        generate(EVERY_TYPE_SPEC, 1, seed=0, strings=[])


# encode: what carpool's server decodes


def _decode(body: bytes, headers: dict[str, str]) -> dict[str, np.ndarray[Any, Any]]:
    length = parse_header_length(headers.get(HEADER_LENGTH), len(body))
    request = parse_infer_request(body, length, max_elements=1 << 20)
    return {i.name: i.data for i in request.inputs}


@pytest.mark.parametrize("binary", [True, False])
def test_encode_round_trips_through_the_server_parser(binary: bool) -> None:
    types = ALL_TYPES if binary else JSON_TYPES
    spec = RequestSpec(tuple(i for i in EVERY_TYPE_SPEC.inputs if i.datatype in types))
    for request in generate(spec, 3, seed=1):
        body, headers = encode(request, spec, binary=binary)
        decoded = _decode(body, headers)
        assert list(decoded) == [i.name for i in spec.inputs]
        for name, array in request.items():
            assert decoded[name].dtype == array.dtype
            np.testing.assert_array_equal(decoded[name], array, strict=True)


def test_encode_headers_and_output_parameters() -> None:
    spec = spec_from_metadata(DEMO)
    [request] = generate(spec, 1, seed=0)
    body, headers = encode(request, spec, binary=False)
    assert headers == {"Content-Type": "application/json"}
    assert "parameters" not in json.loads(body)  # JSON outputs: the server's default
    body, headers = encode(request, spec, binary=False, binary_output=True)
    assert json.loads(body)["parameters"] == {"binary_data_output": True}
    body, headers = encode(request, spec, binary=True)
    header = (
        b'{"inputs":[{"name":"INPUT0","shape":[1,256],"datatype":"FP32",'
        b'"parameters":{"binary_data_size":1024}}],"parameters":{"binary_data_output":true}}'
    )
    assert headers == {
        "Content-Type": "application/octet-stream",
        HEADER_LENGTH: str(len(header)),
    }
    assert body == header + request["INPUT0"].astype("<f4").tobytes()
    body, headers = encode(request, spec, binary=True, binary_output=False)
    assert "parameters" not in json.loads(body[: int(headers[HEADER_LENGTH])])


@pytest.mark.parametrize("fraction", [0.0, 0.25, 0.5, 0.9, 1.0])
def test_the_share_of_others_is_spread_over_any_stride(fraction: float) -> None:
    for first, stride in ((0, 1), (0, 2), (1, 2), (2, 3)):  # client processes take strides
        indices = range(first, 20_000, stride)
        others = sum(is_unique(i, fraction) for i in indices) / len(indices)
        assert others == pytest.approx(1.0 - fraction, abs=0.02)


def test_encode_uses_the_arrays_shapes() -> None:
    spec = spec_from_metadata(DEMO)
    body, headers = encode({"INPUT0": np.zeros((3, 256), np.float32)}, spec, binary=True)
    assert _decode(body, headers)["INPUT0"].shape == (3, 256)


@pytest.mark.parametrize(
    ("datatype", "array", "binary", "message"),
    [
        ("FP32", np.zeros(2, np.float32), True, r"the request has no input 'x' \(it has y\)"),
        ("INT32", np.zeros(2, np.float64), True, "input 'x': a float64 array cannot be sent"),
        ("BYTES", np.zeros(2, np.int8), True, "input 'x': a int8 array cannot be sent as BYTES"),
        ("BF16", np.zeros(2, np.float32), False, "input 'x' is BF16, which JSON cannot carry"),
        ("BYTES", np.array([b"\xff"], object), False, "element 0 is not UTF-8"),
        ("BYTES", np.array([3], object), False, "BYTES element 0 is int"),
    ],
)
def test_encode_refuses(datatype: str, array: Any, binary: bool, message: str) -> None:
    spec = RequestSpec((InputSpec("x", datatype, (2,)),))
    name = "y" if "no input" in message else "x"
    with pytest.raises(ValueError, match=message):
        encode({name: array}, spec, binary=binary)


def test_encode_bytes_that_are_not_utf8_go_binary() -> None:
    spec = RequestSpec((InputSpec("x", "BYTES", (2,)),))
    request = {"x": np.array([b"\xff\x00", b""], dtype=object)}
    body, headers = encode(request, spec, binary=True)
    assert _decode(body, headers)["x"].tolist() == [b"\xff\x00", b""]


# encode: what tritonclient sends


def _tritonclient_body(
    request: dict[str, np.ndarray[Any, Any]], spec: RequestSpec, *, binary: bool
) -> tuple[bytes, int | None]:
    generate_body = httpclient.InferenceServerClient.generate_request_body
    inputs = []
    for spec_input in spec.inputs:
        array = request[spec_input.name]
        if spec_input.datatype == "BF16":
            array = array.astype(ml_dtypes.bfloat16)
        tensor = httpclient.InferInput(spec_input.name, list(array.shape), spec_input.datatype)
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    body, json_size = generate_body(inputs)
    return bytes(body), json_size


@pytest.mark.parametrize("binary", [True, False])
def test_encode_matches_tritonclient_byte_for_byte(binary: bool) -> None:
    types = ALL_TYPES if binary else JSON_TYPES
    spec = RequestSpec(tuple(i for i in EVERY_TYPE_SPEC.inputs if i.datatype in types))
    for request in generate(spec, 2, seed=3):
        # tritonclient asks for binary outputs whenever no outputs are named
        body, headers = encode(request, spec, binary=binary, binary_output=True)
        expected, json_size = _tritonclient_body(request, spec, binary=binary)
        assert body == expected
        if binary:
            assert headers[HEADER_LENGTH] == str(json_size)
        else:
            assert json_size is None
            assert HEADER_LENGTH not in headers


def test_encode_non_ascii_text_decodes_as_tritonclients_does() -> None:
    spec = RequestSpec((InputSpec("text", "BYTES", (1, 2)),))
    [request] = generate(spec, 1, seed=0, strings=["naïve café", "日本語"])
    for binary in (True, False):
        body, headers = encode(request, spec, binary=binary, binary_output=True)
        expected, json_size = _tritonclient_body(request, spec, binary=binary)
        length = int(headers[HEADER_LENGTH]) if binary else len(body)
        assert json.loads(body[:length]) == json.loads(expected[: json_size or len(expected)])
        assert body[length:] == expected[json_size or len(expected) :]
        assert _decode(body, headers)["text"].tolist() == request["text"].tolist()
