"""The response cache on a real ``carpool serve`` (``--response-cache``, ``[models.NAME]
response_cache``, ``--cache-size``), through tritonclient (HTTP JSON and binary, gRPC) and
the ``openai`` client: a repeated request reaches no model (one repeated byte for byte is
replayed, its headers still checked), identical requests in flight share one computation,
failures are never stored, a model without the cache computes every request, the least
recently used answers go first, an unload or a reload drops the model's answers, and the
counts show in Triton's statistics and ``/metrics``.

One server per module serves every model; each test uses inputs of its own and compares
before/after snapshots. Computations are seen in the gated models' logs of the batches they
started (tests/server/models.py); requests are held in flight by a closed gate, never by
sleeping.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import openai
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from carpool import Model
from carpool.errors import ConfigError
from carpool.server.config import ServerConfig
from carpool.server.inference.cache import ENTRY_OVERHEAD, REPLAY_OVERHEAD
from server.conftest import Launcher, Server, float_request, json_tensor, wait_until
from server.models import add_one

CONFIG = """
[models.lengths]
openai = true
response_cache = true
"""
CACHED = ("--response-cache", "gated", "--response-cache", "not_numbers")
CALLERS = 6  # identical requests sent together
INFER = "/v2/models/gated/infer"
JSON_BODY = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def server(serve_module: Launcher, tmp_path_factory: pytest.TempPathFactory) -> Server:
    config = tmp_path_factory.mktemp("cache") / "carpool.toml"
    config.write_text(CONFIG)
    models = ("models:gated", "models:not_numbers", "models:lengths", "models:identity")
    return serve_module(*models, *CACHED, "--config", str(config), grpc=True)


@pytest.fixture(scope="module")
def http(server: Server) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.address)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc(server: Server) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(server.grpc_address)
    yield client
    client.close()


def computed(server: Server, model: str = "gated") -> int:
    """Rows the gated ``model`` has computed so far."""
    return sum(server.batches_started(model))


def counts(server: Server, model: str = "gated") -> dict[str, int]:
    stats = server.stats(model)
    inference = stats["inference_stats"]
    return {
        "hit": inference["cache_hit"]["count"],
        "miss": inference["cache_miss"]["count"],
        "success": inference["success"]["count"],
        "inferences": stats["inference_count"],
        "executions": stats["execution_count"],
    }


def gauge(server: Server, name: str) -> float:
    """A family's one unlabelled sample in ``/metrics``."""
    (line,) = [line for line in server.metrics().splitlines() if line.startswith(f"{name} ")]
    return float(line.split()[-1])


def since(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {name: after[name] - before[name] for name in after}


def row(value: float, *, binary: bool, client: Any = httpclient) -> Any:
    tensor = client.InferInput("INPUT0", [1, 4], "FP32")
    array = np.full((1, 4), value, np.float32)
    if client is httpclient:
        tensor.set_data_from_numpy(array, binary_data=binary)
    else:
        tensor.set_data_from_numpy(array)
    return [tensor]


def test_a_repeated_json_request_reaches_no_model(server: Server) -> None:
    before, rows = counts(server), computed(server)
    first = server.infer("gated", float_request(1.5, id="first"))
    again = server.infer("gated", float_request(1.5, id="again"))
    assert first.status_code == again.status_code == 200
    assert [r.json()["id"] for r in (first, again)] == ["first", "again"]  # each its own
    assert first.json()["outputs"] == again.json()["outputs"]
    assert computed(server) - rows == 1
    assert since(before, counts(server)) == {
        "hit": 1,
        "miss": 1,
        "success": 2,
        "inferences": 1,  # the rows the model ran: as in Triton's, a hit ran nothing
        "executions": 1,
    }


def test_binary_requests_over_http_are_cached(
    server: Server, http: httpclient.InferenceServerClient
) -> None:
    rows = computed(server)
    wanted = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)]
    answers = [
        http.infer("gated", row(2.5, binary=True), outputs=wanted, request_id=str(i))
        for i in range(3)
    ]
    for index, answer in enumerate(answers):
        assert answer.get_response()["id"] == str(index)
        assert answer.as_numpy("OUTPUT0").tolist() == [[2.5] * 4]
    assert computed(server) - rows == 1
    json_answer = http.infer("gated", row(2.5, binary=False))  # outputs as JSON: another key
    assert json_answer.as_numpy("OUTPUT0").tolist() == [[2.5] * 4]
    assert computed(server) - rows == 2


def test_grpc_requests_are_cached_and_counted_in_model_statistics(
    server: Server, grpc: grpcclient.InferenceServerClient
) -> None:
    (before,) = grpc.get_inference_statistics("gated").model_stats
    rows = computed(server)
    inputs = row(3.5, binary=True, client=grpcclient)
    for request_id in ("a", "b", "c"):
        answer = grpc.infer("gated", inputs, request_id=request_id)
        assert answer.get_response().id == request_id
        assert answer.as_numpy("OUTPUT0").tolist() == [[3.5] * 4]
    assert computed(server) - rows == 1
    (after,) = grpc.get_inference_statistics("gated").model_stats
    hits = after.inference_stats.cache_hit
    misses = after.inference_stats.cache_miss
    assert hits.count - before.inference_stats.cache_hit.count == 2
    assert misses.count - before.inference_stats.cache_miss.count == 1
    assert hits.ns > before.inference_stats.cache_hit.ns
    assert after.execution_count - before.execution_count == 1


def test_the_same_text_embedded_twice_is_one_computation(server: Server) -> None:
    before = counts(server, "lengths")
    with openai.OpenAI(
        base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=30.0
    ) as client:
        first = client.embeddings.create(model="lengths", input=["a cached text", "two"])
        again = client.embeddings.create(model="lengths", input=["a cached text", "two"])
        base64 = client.embeddings.create(
            model="lengths", input=["a cached text", "two"], encoding_format="base64"
        )
    assert [d.embedding for d in first.data] == [[13.0, 3.0], [3.0, 1.0]]
    assert [d.embedding for d in again.data] == [d.embedding for d in first.data]
    assert len(base64.data) == 2  # the same v2 request: a hit, encoded its own way
    assert since(before, counts(server, "lengths")) == {
        "hit": 2,
        "miss": 1,
        "success": 3,
        "inferences": 2,  # the first request's two texts
        "executions": 1,
    }


def test_identical_requests_in_flight_share_one_computation(
    server: Server, threads: ThreadPoolExecutor
) -> None:
    before, rows = counts(server), computed(server)
    tasks = gauge(server, "carpool_event_loop_tasks")
    body = float_request(4.5)
    with server.gate_closed("gated"):
        first = threads.submit(server.infer_alone, "gated", body)
        server.wait_started("gated", len(server.batches_started("gated")) + 1)
        others = [threads.submit(server.infer_alone, "gated", body) for _ in range(CALLERS - 1)]
        # Each in flight on the server (a task each, and their computation one), held: the
        # computation is gated.
        wait_until(
            lambda: gauge(server, "carpool_event_loop_tasks") >= tasks + CALLERS + 1,
            f"{CALLERS} requests in flight",
        )
    answers = [call.result() for call in [first, *others]]
    assert {a.status_code for a in answers} == {200}
    assert {str(a.json()["outputs"][0]["data"]) for a in answers} == {"[4.5]"}
    assert computed(server) - rows == 1
    changed = since(before, counts(server))
    assert (changed["miss"], changed["hit"], changed["executions"]) == (1, CALLERS - 1, 1)


def test_a_request_repeated_byte_for_byte_is_replayed_and_still_checked(server: Server) -> None:
    body = orjson.dumps(float_request(8.5, id="replayed"))
    before, rows = counts(server), computed(server)
    bytes_before = gauge(server, "carpool_cache_bytes")
    answers = [server.http.post(INFER, content=body, headers=JSON_BODY) for _ in range(4)]
    assert [a.status_code for a in answers] == [200] * 4
    assert len({a.content for a in answers}) == 1  # the same bytes, the id echoed
    assert answers[0].json()["id"] == "replayed"
    assert computed(server) - rows == 1
    assert since(before, counts(server))["hit"] == 3  # one stored it, two were replayed
    kept = gauge(server, "carpool_cache_bytes") - bytes_before
    assert kept == ENTRY_OVERHEAD + 4 + REPLAY_OVERHEAD + len(answers[0].content)
    # Its headers are part of what was replayed, and checked as for any request.
    whole = {**JSON_BODY, "inference-header-content-length": str(len(body))}  # all JSON
    assert server.http.post(INFER, content=body, headers=whole).content == answers[0].content
    bad = {**JSON_BODY, "inference-header-content-length": "many"}
    refused = server.http.post(INFER, content=body, headers=bad)
    assert refused.status_code == 400
    assert "Inference-Header-Content-Length" in refused.json()["error"]
    twice = [*JSON_BODY.items(), ("content-encoding", "identity"), ("content-encoding", "gzip")]
    refused = server.http.post(INFER, content=body, headers=twice)
    assert refused.status_code == 400
    assert "content-encoding header came more than once" in refused.json()["error"]
    assert computed(server) - rows == 1


def test_a_failed_request_is_not_cached(server: Server) -> None:
    before, rows = counts(server, "not_numbers"), computed(server, "not_numbers")
    for _ in range(2):
        failed = server.infer("not_numbers", float_request(-1.0))
        assert failed.status_code == 500, failed.text
    assert computed(server, "not_numbers") - rows == 2  # computed each time
    changed = since(before, counts(server, "not_numbers"))
    assert (changed["hit"], changed["miss"]) == (0, 0)


def test_a_model_without_the_cache_computes_every_request(server: Server) -> None:
    before = server.stats("identity")
    for _ in range(2):
        assert server.infer("identity", float_request(5.5)).status_code == 200
    after = server.stats("identity")
    assert after["execution_count"] - before["execution_count"] == 2
    assert after["inference_stats"]["cache_hit"]["count"] == 0
    assert 'carpool_cache_hits_total{model="identity"}' not in server.metrics()


def test_metrics_show_the_counts_and_the_bytes_held(server: Server) -> None:
    server.infer("gated", float_request(6.5))
    server.infer("gated", float_request(6.5))
    stats = server.stats("gated")["inference_stats"]
    for family, kind in (("hits", "cache_hit"), ("misses", "cache_miss")):
        assert server.metric(f"carpool_cache_{family}_total", model="gated") == stats[kind]["count"]
    assert gauge(server, "carpool_cache_bytes") >= ENTRY_OVERHEAD


def test_the_least_recently_used_answers_go_first(server: Server, serve: Launcher) -> None:
    # An answer of one FP32 row [v] holds ENTRY_OVERHEAD + 4 bytes; once the cache has
    # answered a request, its JSON body is kept for a replay too: REPLAY_OVERHEAD + its bytes.
    # Room for two answers and one replay.
    body = len(server.infer("gated", float_request(2.0)).content)
    room = 2 * (ENTRY_OVERHEAD + 4) + REPLAY_OVERHEAD + body
    server = serve("models:gated", "--response-cache", "gated", "--cache-size", str(room + 50))
    for value in (1.0, 2.0, 3.0, 2.0):  # 1.0 goes when 3.0 comes; 2.0 was used again
        assert server.infer("gated", float_request(value)).status_code == 200
    assert computed(server) == 3
    assert server.infer("gated", float_request(1.0)).status_code == 200  # gone: computed
    assert computed(server) == 4  # ... and 3.0, least recently used now, went for it
    assert len(server.infer("gated", float_request(2.0)).content) == body  # its replay
    assert computed(server) == 4
    assert gauge(server, "carpool_cache_bytes") == room
    assert server.stats("gated")["inference_stats"]["cache_hit"]["count"] == 2
    again = server.infer("gated", float_request(2.0, id="again"))  # other bytes, same inputs
    assert again.json()["id"] == "again"
    assert computed(server) == 4  # its answer was kept while its replay was used
    assert server.stats("gated")["inference_stats"]["cache_hit"]["count"] == 3


def test_an_unload_or_a_reload_drops_the_models_answers(serve: Launcher, tmp_path: Path) -> None:
    folder = tmp_path / "models" / "m"
    folder.mkdir(parents=True)
    (folder / "carpool.toml").write_text('inputs = ["x:FP32:1"]\noutputs = ["y:FP32:1"]\n')
    (folder / "model.py").write_text("def model(x):\n    return x + 1\n")
    server = serve(str(folder.parent), "--model-control-mode", "explicit", "--load-model", "m",
                   "--response-cache", "m")  # fmt: skip
    body = {"inputs": [json_tensor("x", "FP32", [1, 1], [1.0])]}

    def answer() -> list[float]:
        response = server.infer("m", body)
        assert response.status_code == 200, response.text
        return list(response.json()["outputs"][0]["data"])

    assert answer() == answer() == [2.0]
    assert gauge(server, "carpool_cache_bytes") > 0
    (folder / "model.py").write_text("def model(x):\n    return x + 20\n")
    assert server.http.post("/v2/repository/models/m/load").status_code == 200  # a reload
    assert gauge(server, "carpool_cache_bytes") == 0
    assert answer() == [21.0]  # the new version's, not the answer kept of the old one
    assert server.stats("m")["inference_stats"]["cache_miss"]["count"] == 1
    assert answer() == [21.0]
    assert gauge(server, "carpool_cache_bytes") > 0
    assert server.http.post("/v2/repository/models/m/unload").status_code == 200
    assert gauge(server, "carpool_cache_bytes") == 0


def test_the_cache_runs_with_one_front_end() -> None:
    cached = Model(add_one, name="m", response_cache=True)
    with pytest.raises(ConfigError, match="runs with one front end"):
        ServerConfig(models=(cached,), frontends=2)
    ServerConfig(models=(cached,), frontends=1)


def test_concurrent_callers_on_threads_agree(server: Server) -> None:
    """Many callers, repeated inputs among them: every answer is its own input's."""
    values = [7.0 + (i % 3) for i in range(24)]
    with ThreadPoolExecutor(8) as threads:
        answers = list(
            threads.map(lambda v: server.infer_alone("gated", float_request(v)).json(), values)
        )
    assert [a["outputs"][0]["data"] for a in answers] == [[v] for v in values]
