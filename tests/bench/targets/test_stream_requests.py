"""A streaming run's requests (``carpool.bench.targets.stream_requests``): inputs paired with
drawn lengths, and the bodies generate_stream and ModelStreamInfer are sent."""

from __future__ import annotations

import dataclasses

import numpy as np
import orjson
from tritonclient.grpc import service_pb2 as pb

from carpool.bench.lengths import Lengths
from carpool.bench.options import Options
from carpool.bench.targets.payload import InputSpec, RequestSpec
from carpool.bench.targets.stream_clients import EMPTY_FINAL, encode_stream_request
from carpool.bench.targets.stream_requests import (
    LENGTHS_DRAWN,
    StreamRequest,
    generate_body,
    stream_requests,
)

TEXTS = [{"text_input": np.array([[t.encode()]], dtype=object)} for t in ("a b", "c d e")]
BASE = Options(target="http://h/v2/models/words", mode="concurrency", stream=True, seed=4)


def test_without_lengths_each_request_is_sent_as_it_is() -> None:
    got = stream_requests(TEXTS, BASE)
    assert [r.parameters for r in got] == [{}, {}]
    assert [r.values["text_input"].tolist() for r in got] == [[[b"a b"]], [[b"c d e"]]]


def test_fixed_lengths_pair_each_request_with_the_one_length() -> None:
    options = dataclasses.replace(BASE, lengths=Lengths("fixed", 9), length_parameter="n")
    assert [r.parameters for r in stream_requests(TEXTS, options)] == [{"n": 9}, {"n": 9}]


def test_varying_lengths_cycle_the_inputs_over_their_draws() -> None:
    lengths = Lengths("uniform", 1, 50)
    got = stream_requests(TEXTS, dataclasses.replace(BASE, lengths=lengths))
    assert len(got) == LENGTHS_DRAWN
    assert [r.parameters["max_tokens"] for r in got] == lengths.draw(LENGTHS_DRAWN, seed=4)
    assert got[2].values["text_input"].tolist() == [[b"a b"]]


def test_a_generate_body_is_flat_json_with_its_parameters() -> None:
    request = StreamRequest(dict(TEXTS[1]), {"max_tokens": 3})
    body = orjson.loads(generate_body(request))
    assert body == {"text_input": "c d e", "parameters": {"max_tokens": 3}}
    several = StreamRequest({"x": np.array([[1, 2]], dtype=np.int32)}, {})
    assert orjson.loads(generate_body(several)) == {"x": [1, 2]}


def test_a_stream_request_asks_for_an_empty_final_response() -> None:
    spec = RequestSpec((InputSpec("text_input", "BYTES", (1, 1)),))
    request = StreamRequest(dict(TEXTS[0]), {"max_tokens": 5})
    message = pb.ModelInferRequest.FromString(encode_stream_request(request, spec, model="words"))
    assert message.model_name == "words"
    assert [(i.name, i.datatype, list(i.shape)) for i in message.inputs] == [
        ("text_input", "BYTES", [1, 1])
    ]
    assert message.parameters["max_tokens"].int64_param == 5
    assert message.parameters[EMPTY_FINAL].bool_param is True
