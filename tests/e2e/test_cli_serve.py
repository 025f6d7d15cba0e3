"""``carpool serve`` on the command line: its help, its refusals (exit 2, one clear line, no
traceback, before binding a port), and its ``CARPOOL_*`` environment variables."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from carpool.cli import build_parser, main
from server.conftest import HERE, POLL_S, READY_WITHIN_S, Launcher, free_port, json_tensor

FLAGS = {
    "--host": "CARPOOL_HOST",
    "--port": "CARPOOL_PORT",
    "--grpc-port": "CARPOOL_GRPC_PORT",
    "--name": "CARPOOL_NAME",
    "--config": "CARPOOL_CONFIG",
    "--max-batch-size": "CARPOOL_MAX_BATCH_SIZE",
    "--max-wait-ms": "CARPOOL_MAX_WAIT_MS",
    "--policy": "CARPOOL_POLICY",
    "--latency-slo-ms": "CARPOOL_LATENCY_SLO_MS",
    "--workers": "CARPOOL_WORKERS",
    "--runner": "CARPOOL_RUNNER",
    "--ray-address": "CARPOOL_RAY_ADDRESS",
    "--batch-timeout-ms": "CARPOOL_BATCH_TIMEOUT_MS",
    "--max-queue-size": "CARPOOL_MAX_QUEUE_SIZE",
    "--default-timeout-ms": "CARPOOL_DEFAULT_TIMEOUT_MS",
    "--openai": "CARPOOL_OPENAI",
    "--max-body-bytes": "CARPOOL_MAX_BODY_BYTES",
    "--drain-timeout": "CARPOOL_DRAIN_TIMEOUT",
    "--log-level": "CARPOOL_LOG_LEVEL",
    "--log-format": "CARPOOL_LOG_FORMAT",
    "--access-log": "CARPOOL_ACCESS_LOG",
    "--api-key": "CARPOOL_API_KEY",
    "--metrics-need-key": "CARPOOL_METRICS_NEED_KEY",
    "--ssl-certfile": "CARPOOL_SSL_CERTFILE",
    "--ssl-keyfile": "CARPOOL_SSL_KEYFILE",
    "--header-timeout": "CARPOOL_HEADER_TIMEOUT",
    "--body-timeout": "CARPOOL_BODY_TIMEOUT",
    "--limit-concurrency": "CARPOOL_LIMIT_CONCURRENCY",
    "--frontends": "CARPOOL_FRONTENDS",
    "--max-rows-per-request": "CARPOOL_MAX_ROWS_PER_REQUEST",
    "--max-batch-tokens": "CARPOOL_MAX_BATCH_TOKENS",
    "--max-client-batch-size": "CARPOOL_MAX_CLIENT_BATCH_SIZE",
    "--grpc-max-concurrent-rpcs": "CARPOOL_GRPC_MAX_CONCURRENT_RPCS",
    "--model-control-mode": "CARPOOL_MODEL_CONTROL_MODE",
    "--load-model": "CARPOOL_LOAD_MODEL",
    "--repository-poll-secs": "CARPOOL_REPOSITORY_POLL_SECS",
    "--repository-poll-settle-secs": "CARPOOL_REPOSITORY_POLL_SETTLE_SECS",
    "--response-cache": "CARPOOL_RESPONSE_CACHE",
    "--cache-size": "CARPOOL_CACHE_SIZE",
    "--prefix-cache-size": "CARPOOL_PREFIX_CACHE_SIZE",
}


def test_help_lists_every_flag_with_its_environment_variable() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "carpool", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())  # argparse wraps lines anywhere
    options = text.partition("options:")[2]
    entries = {  # flag -> its help text
        entry.split()[0]: entry
        for entry in re.split(r" (?=--[a-z][a-z-]+ [A-Z_]+ )", options)
        if entry.startswith("--")
    }
    assert set(entries) == set(FLAGS)
    for flag, env in FLAGS.items():
        assert f"(env {env})" in entries[flag] or f"(env {env};" in entries[flag], entries[flag]
    assert "TARGET" in text
    assert "'demo'" in text


def run_serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``carpool serve`` expecting it to refuse to start; fail at once if it serves."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("CARPOOL_")}
    environment.update(env or {})
    port = free_port()
    command = [sys.executable, "-m", "carpool", "serve", *args, "--port", str(port)]
    with subprocess.Popen(
        command,
        cwd=HERE,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        deadline = time.monotonic() + READY_WITHIN_S
        with httpx.Client(timeout=1.0) as probe:  # one SSL context, not one a poll
            while process.poll() is None:
                try:
                    started = probe.get(f"http://127.0.0.1:{port}/v2/health/live")
                except httpx.TransportError:
                    started = None
                if started is not None or time.monotonic() > deadline:
                    process.kill()
                    process.communicate()
                    pytest.fail(f"carpool serve {' '.join(args)} started serving; it should refuse")
                time.sleep(POLL_S)
        stdout, stderr = process.communicate()
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def assert_refused(result: subprocess.CompletedProcess[str], message: str) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, result.stderr
    assert message in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("carpool_nope:f", "carpool serve: cannot import module 'carpool_nope' of target"),
        ("models:nope", "carpool serve: module 'models' has no attribute 'nope'"),
        ("models:NEGATIVE", "carpool serve: target 'models:NEGATIVE' is a str"),
        ("models", "carpool serve: target 'models' must look like 'module:attr'"),
    ],
)  # fmt: skip
def test_unusable_target_exits_2(target: str, message: str) -> None:
    assert_refused(run_serve(target), message)


def test_name_with_several_targets_exits_2() -> None:
    result = run_serve("models:add_one", "models:identity", "--name", "x")
    assert_refused(result, "carpool serve: --name applies to a single model")


def test_two_models_of_one_name_exit_2() -> None:
    result = run_serve("models:add_one", "models:add_one")
    assert_refused(result, "two models are named 'add_one'")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-batch-size", "-1"], "max_batch_size must be >= 0 (0 turns batching off), got -1"),
        (["--workers", "0"], "workers must be >= 1, got 0"),
        (["--max-queue-size", "0"], "max_queue_size must be >= 1, got 0"),
        (["--policy", "bogus"], "policy must be one of"),
        (["--default-timeout-ms", "-5"], "default_timeout_ms"),
        (["--log-level", "loud"], "log level must be debug, info, warning, error or critical"),
        (["--log-format", "xml"], "log format must be 'text' or 'json', got 'xml'"),
    ],
    ids=[
        "max-batch-size",
        "workers",
        "max-queue-size",
        "policy",
        "default-timeout",
        "log-level",
        "log-format",
    ],
)
def test_invalid_settings_exit_2_before_serving(flags: list[str], message: str) -> None:
    assert_refused(run_serve("demo", *flags), message)


def test_flag_of_the_wrong_type_exits_2() -> None:
    result = run_serve("--max-batch-size", "many")
    assert_refused(result, "argument --max-batch-size: invalid int value: 'many'")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[server\n", "is not valid TOML"),
        (None, "cannot read config file"),
        ("[server]\nbogus = 1\n", "config file [server]:"),
        ("[models.other]\nworkers = 2\n", "settings for models ['other'] that are not served"),
        ("[models.demo]\nbogus = 2\n", "unknown batching settings ['bogus']"),
        ('[models.demo]\nmax_batch_size = "big"\n', "max_batch_size"),
    ],
    ids=["not-toml", "missing", "server-key", "unserved", "model-key", "wrong-type"],
)
def test_bad_config_file_exits_2(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "carpool.toml"
    if content is not None:
        path.write_text(content)
    assert_refused(run_serve("demo", "--config", str(path)), message)


def test_invalid_environment_variable_exits_2() -> None:
    result = run_serve("demo", env={"CARPOOL_MAX_BATCH_SIZE": "abc"})
    assert_refused(result, "CARPOOL_MAX_BATCH_SIZE='abc' is invalid")


def test_serve_variables_do_not_concern_other_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    """``carpool demo`` has no --port: an unusable CARPOOL_PORT is none of its business."""
    monkeypatch.setenv("CARPOOL_PORT", "not-a-port")
    assert build_parser().parse_args(["demo"]).command == "demo"


def test_flags_read_their_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CARPOOL_MAX_BATCH_SIZE", "4")
    monkeypatch.setenv("CARPOOL_ACCESS_LOG", "off")
    monkeypatch.setenv("CARPOOL_MAX_WAIT_MS", "7")
    args = build_parser().parse_args(["serve", "--max-wait-ms", "3"])
    assert (args.max_batch_size, args.access_log, args.max_wait_ms) == (4, False, 3.0)
    assert args.workers is None  # unset: the config file, the Model or the default decides


def test_unknown_command_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["sever"])
    assert info.value.code == 2
    assert "invalid choice: 'sever'" in capsys.readouterr().err


def test_environment_variables_reach_the_server(serve: Launcher, tmp_path: Path) -> None:
    config = tmp_path / "carpool.toml"
    config.write_text("[models.mlp]\nmax_batch_size = 16\nmax_queue_size = 5\n")
    server = serve(
        "demo",
        "--max-wait-ms",
        "3",  # the flag beats CARPOOL_MAX_WAIT_MS
        env={
            "CARPOOL_MAX_BATCH_SIZE": "4",  # beats the file's 16
            "CARPOOL_MAX_WAIT_MS": "7",
            "CARPOOL_WORKERS": "2",
            "CARPOOL_NAME": "mlp",
            "CARPOOL_CONFIG": str(config),
            "CARPOOL_MAX_BODY_BYTES": "1000",
        },
    )
    config_json = server.get_json("/v2/models/mlp/config")
    assert config_json["max_batch_size"] == 4
    assert config_json["instance_group"] == [{"count": 2, "kind": "KIND_CPU"}]
    batching = config_json["dynamic_batching"]
    assert (batching["max_queue_delay_microseconds"], batching["max_queue_size"]) == (3000, 5)
    assert server.http.get("/v2/models/demo").status_code == 404
    response = server.http.post("/v2/models/mlp/infer", content=b" " * 1001)
    assert response.status_code == 413
    assert "exceeds the limit of 1000 bytes" in response.json()["error"]


def test_json_log_format_writes_one_object_per_line(serve: Launcher) -> None:
    server = serve("demo", "--log-format", "json", access_log=True)
    assert server.http.get("/v2/models/demo/ready").status_code == 200
    assert server.http.get("/v2/models/nope").status_code == 404
    server.stop()
    entries = [json.loads(line) for line in server.stderr().splitlines()]
    assert {"time", "level", "logger", "message"} <= set(entries[0])
    access = [e for e in entries if e["logger"] == "carpool.access"]
    assert [(e["method"], e["path"], e["status"]) for e in access] == [
        ("GET", "/v2/health/ready", 200),  # the fixture's readiness probe
        ("GET", "/v2/models/demo/ready", 200),
        ("GET", "/v2/models/nope", 404),
    ]
    assert all(isinstance(e["duration_ms"], float) for e in access)


def test_input_and_output_flags_declare_a_functions_signature(serve: Launcher) -> None:
    server = serve("models:add_one", "--input", "INPUT0:INT32:3", "--output", "OUTPUT0:INT32:3")
    metadata = server.get_json("/v2/models/add_one")
    assert metadata["inputs"] == [{"name": "INPUT0", "datatype": "INT32", "shape": [-1, 3]}]
    assert metadata["outputs"] == [{"name": "OUTPUT0", "datatype": "INT32", "shape": [-1, 3]}]

    def infer(datatype: str, shape: list[int], data: list[int]) -> httpx.Response:
        return server.infer("add_one", {"inputs": [json_tensor("INPUT0", datatype, shape, data)]})

    ok = infer("INT32", [1, 3], [1, 2, 3])
    assert ok.status_code == 200
    assert ok.json()["outputs"][0]["data"] == [2, 3, 4]
    wrong_type = infer("FP32", [1, 3], [1, 2, 3])
    assert wrong_type.status_code == 400
    assert "expects 'INT32'" in wrong_type.json()["error"]
    wrong_shape = infer("INT32", [1, 2], [1, 2])
    assert wrong_shape.status_code == 400
    assert "unexpected shape for input 'INPUT0'" in wrong_shape.json()["error"]
