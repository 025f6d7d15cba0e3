"""A model behind a v2 server (``carpool.bench.targets.http_target``): model URLs, and a server that
cannot be reached as a one-line usage error."""

from __future__ import annotations

import pytest

from carpool.bench.targets.base import BenchError
from carpool.bench.targets.http_target import HttpTarget, ModelURL, parse_url
from server.conftest import free_port


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http://127.0.0.1:8000/v2/models/demo", ModelURL("http://127.0.0.1:8000", "demo")),
        ("http://h:1/v2/models/demo/", ModelURL("http://h:1", "demo")),
        ("http://h:1/v2/models/demo/infer", ModelURL("http://h:1", "demo")),
        ("https://h/v2/models/m/versions/3", ModelURL("https://h", "m", "3")),
    ],
)
def test_model_urls(text: str, expected: ModelURL) -> None:
    url = parse_url(text)
    assert url == expected
    assert url.infer == url.metadata + "/infer"
    assert url.metrics == expected.base + "/metrics"


@pytest.mark.parametrize("text", ["http://h:1/", "http://h:1/v2/models", "http://h/v1/models/m"])
def test_a_url_that_names_no_model_is_refused(text: str) -> None:
    with pytest.raises(BenchError, match="must name a model"):
        parse_url(text)


async def test_an_unreachable_server_is_a_one_line_usage_error() -> None:
    url = f"http://127.0.0.1:{free_port()}/v2/models/demo"
    with pytest.raises(BenchError) as caught:
        async with HttpTarget.connect(url):
            pass
    assert str(caught.value) == f"cannot reach {url}: connection refused; is the server running?"
