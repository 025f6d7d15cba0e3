"""deploy/ against the Kubernetes schemas and against carpool itself.

Every manifest validates offline (``kubernetes_validate``, strict: unknown fields fail) for
every Kubernetes version the package ships; KServe's kinds, which it has no schema for,
have their containers validated as a Pod's and their contract checked here. Then the
manifests and the Containerfile are held to the real CLI (flags in ``carpool serve
--help``, ``CARPOOL_*`` variables it reads, the port it would listen on, parsed by its own
parser), to a real server (the probes' paths, the scraped path, the series the
prometheus-adapter rule reads), and to the drain: the grace period outlasts the worst one.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import all_versions, major_minor

from carpool.cli import build_parser
from carpool.server.config import ServerConfig
from server.conftest import Launcher, Server

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CONTAINERFILE = DEPLOY / "Containerfile"
GUIDE = ROOT / "docs" / "kubernetes.md"

# Every document deploy/ holds, by file: the core kinds are validated against the schemas,
# KServe's (custom resources) by the tests that name them.
DOCUMENTS = {
    ("deployment.yaml", "apps/v1", "Deployment"),
    ("service.yaml", "v1", "Service"),
    ("hpa.yaml", "autoscaling/v2", "HorizontalPodAutoscaler"),
    ("prometheus-adapter.yaml", "v1", "ConfigMap"),
    ("kserve-runtime.yaml", "serving.kserve.io/v1alpha1", "ServingRuntime"),
    ("kserve-inferenceservice.yaml", "serving.kserve.io/v1beta1", "InferenceService"),
}
CUSTOM_KINDS = {"ServingRuntime", "InferenceService"}
# Each minor version kubernetes_validate ships schemas for (1.25 to 1.37 in 1.37.0).
VERSIONS = sorted(
    {major_minor(v) for v in all_versions()}, key=lambda v: tuple(map(int, v.split(".")))
)
# What SIGTERM costs besides the drain (src/carpool/server/serve.py): uvicorn's pause
# after closing the listener (0.1 s), then the wait for model threads (_stuck_threads, 1 s).
SHUTDOWN_OVERHEAD_S = 0.1 + 1.0
# InferenceService predictor.model fields that are KServe's; the rest are a container's.
KSERVE_MODEL_FIELDS = {"modelFormat", "runtime", "protocolVersion", "storageUri"}
DEFAULT_GRACE_S = 30  # a pod's terminationGracePeriodSeconds when it names none


# ----------------------------------------------------------------- reading deploy/


def _documents() -> list[tuple[str, dict[str, Any]]]:
    return [
        (path.name, doc)
        for path in sorted(DEPLOY.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8"))
        if doc is not None
    ]


def _one(kind: str) -> dict[str, Any]:
    (doc,) = [doc for _, doc in _documents() if doc["kind"] == kind]
    return doc


def _deployment_container() -> dict[str, Any]:
    (container,) = _one("Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def _runtime_container() -> dict[str, Any]:
    (container,) = _one("ServingRuntime")["spec"]["containers"]
    return container


def _containers() -> list[dict[str, Any]]:
    return [_deployment_container(), _runtime_container()]


def _instructions() -> list[tuple[str, str]]:
    """The Containerfile's instructions as (KEYWORD, rest), continuation lines joined."""
    logical = re.sub(r"\\\n", " ", CONTAINERFILE.read_text(encoding="utf-8"))
    lines = [line.strip() for line in logical.splitlines()]
    return [
        (keyword.upper(), rest.strip())
        for keyword, _, rest in (line.partition(" ") for line in lines)
        if keyword and not keyword.startswith("#")
    ]


def _instruction(keyword: str) -> str:
    (rest,) = [rest for kw, rest in _instructions() if kw == keyword]
    return rest


def _image_env() -> dict[str, str]:
    pairs = [shlex.split(rest) for kw, rest in _instructions() if kw == "ENV"]
    return dict(pair.split("=", 1) for line in pairs for pair in line)


def _validate(name: str, doc: dict[str, Any], version: str) -> None:
    """``doc`` against Kubernetes ``version``'s schema, strictly; a failure names the file,
    the field and the problem (not the whole schema)."""
    try:
        validated = kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = ".".join(str(part) for part in exc.absolute_path)
        problem = f"{name}: {doc['kind']} {where}: {exc.message} (Kubernetes {version})"
    else:
        assert validated == version
        return
    pytest.fail(problem, pytrace=False)  # outside the except: no schema dump chained to it


def _adapter_rules() -> list[dict[str, Any]]:
    config = yaml.safe_load(_one("ConfigMap")["data"]["config.yaml"])
    return config["rules"]


def _settings(container: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    """What ``carpool serve`` would run with in ``container``: its arguments through the real
    parser, with the image's environment and then the container's as the only variables."""
    assert container["command"] == ["carpool", "serve"]
    for name in [n for n in os.environ if n.startswith("CARPOOL_")]:
        monkeypatch.delenv(name)
    environment = _image_env() | {e["name"]: e["value"] for e in container.get("env", [])}
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    return build_parser().parse_args(["serve", *container["args"]])


def _port(container: dict[str, Any], port: int | str) -> int:
    """A probe's or a Service's port: a number, or the name of one of the container's."""
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container["ports"] if p.get("name") == port]
    return number


def _probes(container: dict[str, Any]) -> list[dict[str, Any]]:
    kinds = ("startupProbe", "livenessProbe", "readinessProbe")
    return [container[kind]["httpGet"] for kind in kinds if kind in container]


# ----------------------------------------------------------------- the real CLI and server


@pytest.fixture(scope="module")
def serve_help() -> str:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("CARPOOL_")}
    environment["COLUMNS"] = "200"
    result = subprocess.run(
        [sys.executable, "-m", "carpool", "serve", "--help"],
        capture_output=True,
        text=True,
        env=environment,
        check=True,
    )
    return result.stdout


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The Deployment's container, run here: its arguments and environment, on loopback and a
    free port (the launcher's ``--port`` comes last and wins)."""
    container = _deployment_container()
    args = list(container["args"])
    args[args.index("--host") + 1] = "127.0.0.1"
    env = {e["name"]: e["value"] for e in container["env"]}
    launcher = Launcher(tmp_path_factory.mktemp("deploy"))
    try:
        yield launcher(*args, env=env)
    finally:
        launcher.close()


# ----------------------------------------------------------------- schemas


def test_deploy_holds_exactly_the_documents_these_tests_check() -> None:
    found = [(name, doc["apiVersion"], doc["kind"]) for name, doc in _documents()]
    assert sorted(found) == sorted(DOCUMENTS)


@pytest.mark.parametrize("version", VERSIONS)
def test_manifests_validate_against_the_kubernetes_schemas(version: str) -> None:
    core = [(name, doc) for name, doc in _documents() if doc["kind"] not in CUSTOM_KINDS]
    assert len(core) == len(DOCUMENTS) - len(CUSTOM_KINDS)
    for name, doc in core:
        _validate(name, doc, version)


@pytest.mark.parametrize("version", VERSIONS)
def test_kserve_containers_validate_as_a_pods_containers(version: str) -> None:
    """KServe's ServingRuntime containers and an InferenceService's model are core
    containers (the model with KServe's own fields besides): the Pod schema checks them."""
    model = _one("InferenceService")["spec"]["predictor"]["model"]
    assert set(model) - {"resources"} == KSERVE_MODEL_FIELDS
    as_container = {k: v for k, v in model.items() if k not in KSERVE_MODEL_FIELDS}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "kserve"},
        "spec": {"containers": [_runtime_container(), {"name": "model", **as_container}]},
    }
    _validate("kserve-*.yaml", pod, version)


def test_kserve_runtime_serves_v2_from_the_model_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = _one("ServingRuntime")
    assert (runtime["apiVersion"], runtime["kind"]) == (
        "serving.kserve.io/v1alpha1",
        "ServingRuntime",
    )
    spec = runtime["spec"]
    assert spec["protocolVersions"] == ["v2"]
    formats = {(f["name"], f["autoSelect"]) for f in spec["supportedModelFormats"]}
    assert formats == {("carpool", True), ("onnx", False), ("pytorch", False)}
    container = _runtime_container()
    assert container["name"] == "kserve-container"
    settings = _settings(container, monkeypatch)
    assert (settings.targets, settings.host, settings.port) == (["/mnt/models"], "0.0.0.0", 8080)
    assert [p["containerPort"] for p in container["ports"]] == [settings.port]
    assert [_port(container, p["port"]) for p in _probes(container)] == [settings.port] * 2
    assert spec["annotations"]["prometheus.kserve.io/port"] == str(settings.port)


def test_inference_service_names_the_runtime_and_a_format_it_serves() -> None:
    service = _one("InferenceService")
    assert (service["apiVersion"], service["kind"]) == (
        "serving.kserve.io/v1beta1",
        "InferenceService",
    )
    runtime = _one("ServingRuntime")
    model = service["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    formats = [f["name"] for f in runtime["spec"]["supportedModelFormats"]]
    assert model["modelFormat"]["name"] in formats
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]


# ----------------------------------------------------------------- against the CLI


def test_every_flag_used_is_one_carpool_serve_has(serve_help: str) -> None:
    offered = set(re.findall(r"^\s+(--[a-z][a-z-]*)", serve_help, flags=re.MULTILINE))
    image_args = json.loads(_instruction("CMD"))
    used = {a for c in _containers() for a in c["args"] if a.startswith("-")}
    used |= {a for a in image_args if a.startswith("-")}
    assert used == {"--host", "--port", "--grpc-port"}
    assert used - offered == set()


def test_every_carpool_variable_used_is_one_the_cli_reads(serve_help: str) -> None:
    read = set(re.findall(r"\(env (CARPOOL_[A-Z_]+)", serve_help))
    names = {e["name"] for c in _containers() for e in c["env"]}
    assert {n for n in names if not n.startswith("CARPOOL_")} == set()
    names |= {n for n in _image_env() if n.startswith("CARPOOL_")}
    assert names - read == set()
    assert {"CARPOOL_DRAIN_TIMEOUT", "CARPOOL_HOST", "CARPOOL_PORT"} <= names


def test_deployment_ports_are_the_port_the_server_listens_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    deployment = _one("Deployment")
    container = _deployment_container()
    settings = _settings(container, monkeypatch)
    assert (settings.targets, settings.host, settings.port) == (["demo"], "0.0.0.0", 8000)
    assert settings.grpc_port == 8001
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": settings.port, "grpc": settings.grpc_port}
    assert [_port(container, p["port"]) for p in _probes(container)] == [settings.port] * 3
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(settings.port)
    service = {p["name"]: p for p in _one("Service")["spec"]["ports"]}
    assert {n: _port(container, p["targetPort"]) for n, p in service.items()} == ports
    assert {n: p["port"] for n, p in service.items()} == ports


def test_service_and_hpa_select_the_deployments_pods() -> None:
    deployment = _one("Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"] == labels
    assert _one("Service")["spec"]["selector"] == labels
    target = _one("HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]
    assert target == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "carpool"}
    assert deployment["metadata"]["name"] == target["name"]
    assert "replicas" not in deployment["spec"]  # the HPA owns the count


def test_termination_grace_outlasts_the_prestop_sleep_and_the_worst_drain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """From deletion to SIGKILL: the preStop sleep, then on SIGTERM the drain (uvicorn
    waits ceil(drain) s; the batchers get what is left of drain), then the overhead; see
    deployment.yaml's comment."""
    pod = _one("Deployment")["spec"]["template"]["spec"]
    container = _deployment_container()
    drain = _settings(container, monkeypatch).drain_timeout
    sleep, seconds = container["lifecycle"]["preStop"]["exec"]["command"]
    assert (sleep, drain) == ("sleep", 30.0)
    worst = int(seconds) + math.ceil(drain) + SHUTDOWN_OVERHEAD_S
    assert pod["terminationGracePeriodSeconds"] > worst


def test_kserve_drain_fits_the_default_grace_period(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither KServe manifest sets a grace period, so the pod gets Kubernetes' default
    (raw deployment mode; Knative gives more); no preStop sleep, Knative refuses one."""
    runtime, service = _one("ServingRuntime"), _one("InferenceService")
    assert "terminationGracePeriodSeconds" not in runtime["spec"]
    assert "terminationGracePeriodSeconds" not in service["spec"]["predictor"]
    assert "lifecycle" not in _runtime_container()
    drain = _settings(_runtime_container(), monkeypatch).drain_timeout
    assert drain == 10.0
    assert math.ceil(drain) + SHUTDOWN_OVERHEAD_S < DEFAULT_GRACE_S


# ----------------------------------------------------------------- against a real server


def test_probes_hit_routes_the_server_answers(server: Server) -> None:
    paths = {probe["path"] for c in _containers() for probe in _probes(c)}
    assert paths == {"/v2/health/live", "/v2/health/ready"}
    for path in sorted(paths):
        response = httpx.get(f"{server.url}{path}", timeout=5.0)
        assert response.status_code == 200, (path, response.text)
        assert response.json() == {path.rsplit("/", 1)[1]: True}


def test_hpa_metric_is_the_adapter_rule_over_series_the_server_exports(server: Server) -> None:
    (metric,) = _one("HorizontalPodAutoscaler")["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["target"]["type"] == "AverageValue"
    (rule,) = _adapter_rules()
    assert rule["name"]["as"] == metric["pods"]["metric"]["name"] == "carpool_queue_wait_ms"
    assert rule["resources"]["overrides"] == {
        "namespace": {"resource": "namespace"},
        "pod": {"resource": "pod"},
    }
    read = set(re.findall(r"carpool_[a-z_]+", rule["seriesQuery"] + rule["metricsQuery"]))
    assert read == {"carpool_queue_wait_seconds_count", "carpool_queue_wait_seconds_sum"}
    path = _one("Deployment")["spec"]["template"]["metadata"]["annotations"]["prometheus.io/path"]
    response = httpx.get(f"{server.url}{path}", timeout=5.0)
    assert response.status_code == 200
    exported = set(re.findall(r"^(carpool_[a-z_]+)\{", response.text, flags=re.MULTILINE))
    assert read - exported == set()


# ----------------------------------------------------------------- the image and the guide


def test_containerfile_runs_carpool_serve_on_its_port_as_the_deployments_user(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entrypoint = json.loads(_instruction("ENTRYPOINT"))
    assert entrypoint == _deployment_container()["command"] == _runtime_container()["command"]
    image = {"command": entrypoint, "args": json.loads(_instruction("CMD"))}
    settings = _settings(image, monkeypatch)  # run bare: docker run -p 8000:8000 carpool
    assert (settings.targets, settings.host, settings.port) == (["demo"], "0.0.0.0", 8000)
    assert settings.grpc_port is None  # the image listens on the default gRPC port:
    assert _instruction("EXPOSE") == f"{settings.port} {ServerConfig.grpc_port}"
    user = _instruction("USER")
    assert user == "10001:10001"
    context = _one("Deployment")["spec"]["template"]["spec"]["securityContext"]
    assert user == f"{context['runAsUser']}:{context['runAsGroup']}"


def test_containerfile_installs_extras_carpool_has_from_files_it_has() -> None:
    (arg,) = [rest for kw, rest in _instructions() if kw == "ARG"]
    assert arg == "EXTRAS=server,onnx"
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert {"server", "onnx"} <= set(extras)
    sources = [p for kw, rest in _instructions() if kw == "COPY" for p in rest.split()[:-1]]
    assert sources == ["pyproject.toml", "README.md", "src"]
    assert all((ROOT / source).exists() for source in sources)
    assert _deployment_container()["image"] == _runtime_container()["image"] == "carpool:0.1.0"


def test_guide_gives_the_helm_chart_the_configmaps_rule() -> None:
    blocks = re.findall(r"^```yaml\n(.*?)^```", GUIDE.read_text(encoding="utf-8"), re.M | re.S)
    values = [yaml.safe_load(b) for b in blocks if b.startswith("rules:\n  custom:")]
    assert [v["rules"]["custom"] for v in values] == [_adapter_rules()]
