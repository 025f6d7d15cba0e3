"""``carpool serve --frontends 2``, end to end: front-end processes around one batcher per
model in the main process.

Which front end takes a connection is the kernel's choice (each listens with
``SO_REUSEPORT``); to send requests through a chosen one, the test opens connections until
enough are held by it (``/proc``): a keep-alive connection stays with the process that
accepted it. Models
are gated (``tests/server/models.py``), so "queued" and "running" are states the test
observes, never races it hopes to win.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient
import trustme

from carpool.server.frontends.hub import HEARTBEAT_S, SILENT_S
from server.conftest import HERE, Launcher, Server, float_request, free_port, wait_until

FRONTENDS = ("--frontends", "2")
_OPENED: list[http.client.HTTPConnection] = []


@pytest.fixture(autouse=True)
def _close_connections() -> Iterator[None]:
    yield
    while _OPENED:
        _OPENED.pop().close()


def _title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # it ended while /proc was read
        return 0
    return int(stat.rpartition(")")[2].split()[1])


def _children(pid: int) -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and _parent(int(p)) == pid]


def zygote(server: Server) -> int:
    (pid,) = [p for p in _children(server.process.pid) if _title(p) == "carpool: frontends"]
    return pid


def front_ends(server: Server) -> dict[int, int]:
    """Front end number -> pid, as ``ps`` names them (``carpool: frontend#i``)."""
    found = {}
    for pid in _children(zygote(server)):
        title = _title(pid)
        if title.startswith("carpool: frontend#"):
            found[int(title.rpartition("#")[2])] = pid
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs or is still exiting. Not its cmdline, which empties as its
    memory goes, before its sockets close: a connection the kernel then hands its dying
    listener is reset. Its state follows ``)``: the name itself may hold spaces."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def _sockets_of(pid: int) -> set[str]:
    """What ``pid``'s file descriptors point to; one closed while it is read is skipped."""
    links = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            links.add(os.readlink(fd))
        except FileNotFoundError:  # closed meanwhile (a worker's pipe, a finished request)
            pass
    return links


def _accepted_by(server: Server, conn: http.client.HTTPConnection) -> int | None:
    """Which front end holds the server's end of ``conn``: the socket whose local port is
    the server's and whose remote port is ``conn``'s (``/proc/net/tcp``), among its fds."""
    assert conn.sock is not None
    client_port = conn.sock.getsockname()[1]
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = (int(address.split(":")[1], 16) for address in fields[1:3])
        if (local, remote) == (server.port, client_port):
            inode = f"socket:[{fields[9]}]"
            for index, pid in front_ends(server).items():
                if inode in _sockets_of(pid):
                    return index
    return None


def connections(server: Server, index: int, count: int) -> list[http.client.HTTPConnection]:
    """``count`` keep-alive connections accepted by front end ``index`` (the kernel spreads
    connections over the front ends: open them until enough land there)."""
    made: list[http.client.HTTPConnection] = []
    for _ in range(200):
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        conn.request("GET", "/v2/health/live")  # answered: so it was accepted
        assert conn.getresponse().read() == b'{"live":true}'
        if _accepted_by(server, conn) == index:
            made.append(conn)
            if len(made) == count:
                break
        else:
            conn.close()
    assert len(made) == count, f"front end #{index} accepted {len(made)} of 200 connections"
    _OPENED.extend(made)
    return made


def infer(conn: http.client.HTTPConnection, model: str, value: float) -> tuple[int, Any]:
    conn.request("POST", f"/v2/models/{model}/infer", json.dumps(float_request(value)))
    response = conn.getresponse()
    return response.status, json.loads(response.read())


def test_front_ends_show_in_ps_and_serve_rest_and_grpc_counted_once(serve: Launcher) -> None:
    server = serve("models:add_one", *FRONTENDS, grpc=True)
    fes = front_ends(server)
    assert sorted(fes) == [1, 2]
    for index in (1, 2):
        for value, conn in enumerate(connections(server, index, 3)):
            output = {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 1], "data": [value + 1]}
            assert infer(conn, "add_one", value) == (
                200,
                {"model_name": "add_one", "model_version": "1", "outputs": [output]},
            )
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    for value in range(4):
        tensor = grpcclient.InferInput("INPUT0", [2, 1], "FP32")
        tensor.set_data_from_numpy(np.array([[value], [-value]], np.float32))
        out = client.infer("add_one", [tensor]).as_numpy("OUTPUT0")
        np.testing.assert_array_equal(out, [[value + 1], [1 - value]])
    # Each front end's requests are counted once, whichever front end is asked.
    for index in (1, 2, 1):
        (conn,) = connections(server, index, 1)
        conn.request("GET", "/v2/models/add_one/stats")
        stats = json.loads(conn.getresponse().read())["model_stats"][0]
        assert stats["inference_stats"]["success"]["count"] == 10
        assert stats["inference_count"] == 6 + 8
        # the main process's per-size compute times, through the front end
        sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}
        assert sizes == {1: 6, 2: 4}
        assert all(b["compute_infer"]["ns"] > 0 for b in stats["batch_stats"])
    for protocol, count in (("http", 6), ("grpc", 4)):
        labels = {"model": "add_one", "outcome": "success", "protocol": protocol}
        assert server.metric("carpool_requests_total", **labels) == count
    grpc_stats = client.get_inference_statistics("add_one").model_stats[0]
    assert grpc_stats.inference_stats.success.count == 10
    assert all(b.compute_infer.ns > 0 for b in grpc_stats.batch_stats)


def test_requests_from_both_front_ends_share_one_batch(
    serve: Launcher, threads: ThreadPoolExecutor
) -> None:
    server = serve("models:gated", *FRONTENDS, "--max-batch-size", "16")
    first, *ones = connections(server, 1, 4)
    twos = connections(server, 2, 3)
    with server.gate_closed("gated"):
        running = threads.submit(infer, first, "gated", 100.0)
        server.wait_started("gated", 1)
        queued = [
            threads.submit(infer, conn, "gated", float(i)) for i, conn in enumerate(ones + twos)
        ]
        server.wait_queued("gated", pending=7, queued_rows=6)
    assert running.result() == (200, running.result()[1])
    assert running.result()[1]["outputs"][0]["data"] == [100.0]
    for i, future in enumerate(queued):
        status, body = future.result()
        assert (status, body["outputs"][0]["data"]) == (200, [float(i)])
    assert server.batches_started("gated") == [1, 6]  # one batch from both front ends


def test_a_front_end_that_dies_is_replaced_and_costs_only_its_connections(
    serve: Launcher, threads: ThreadPoolExecutor
) -> None:
    server = serve("models:gated", *FRONTENDS)
    (on_one,) = connections(server, 1, 1)
    (on_two,) = connections(server, 2, 1)
    dead = front_ends(server)[2]
    with server.gate_closed("gated"):
        running = threads.submit(infer, on_one, "gated", 1.0)
        server.wait_started("gated", 1)
        lost = threads.submit(infer, on_two, "gated", 2.0)
        server.wait_queued("gated", pending=2, queued_rows=1)
        os.kill(dead, signal.SIGKILL)
        wait_until(lambda: not alive(dead), "the killed front end to end")
        server.reconnect()
        with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
            lost.result()
        server.wait_queued("gated", pending=1, queued_rows=0)  # withdrawn, never run
    assert running.result()[0] == 200
    assert running.result()[1]["outputs"][0]["data"] == [1.0]
    wait_until(lambda: front_ends(server).get(2, dead) != dead, "front end #2 to be replaced")
    assert sorted(front_ends(server)) == [1, 2]
    (again,) = connections(server, 2, 1)
    assert infer(again, "gated", 3.0)[1]["outputs"][0]["data"] == [3.0]
    assert server.batches_started("gated") == [1, 1]
    assert "front end #2" in server.stderr_showing("starting another")


def _get_promptly(conn: http.client.HTTPConnection, path: str) -> int:
    """``path``'s status through ``conn``, which must answer within 2 s."""
    start = time.monotonic()
    conn.request("GET", path)
    response = conn.getresponse()
    response.read()
    assert time.monotonic() - start < 2.0, f"{path} took {time.monotonic() - start:.1f}s"
    return response.status


def test_a_hung_front_end_is_killed_and_replaced_and_health_never_waits_on_it(
    serve: Launcher, threads: ThreadPoolExecutor
) -> None:
    server = serve("models:gated", *FRONTENDS)
    (on_one,) = connections(server, 1, 1)
    (on_two,) = connections(server, 2, 1)
    (probe,) = connections(server, 1, 1)
    hung = front_ends(server)[2]
    with server.gate_closed("gated"):
        running = threads.submit(infer, on_one, "gated", 1.0)
        server.wait_started("gated", 1)
        lost = threads.submit(infer, on_two, "gated", 2.0)
        server.wait_queued("gated", pending=2, queued_rows=1)
        os.kill(hung, signal.SIGSTOP)
        try:
            stopped = time.monotonic()

            def killed() -> bool:  # meanwhile the live front end answers at once
                assert _get_promptly(probe, "/v2/health/ready") == 200
                assert _get_promptly(probe, "/metrics") == 200
                assert _get_promptly(probe, "/v2/models/gated/stats") == 200
                return not alive(hung)

            # SILENT_S from its last answer; a front end yet to answer has SILENT_S more
            bound = 2 * SILENT_S + HEARTBEAT_S
            wait_until(killed, "the hung front end to be killed", within=bound + 10)
            assert time.monotonic() - stopped < bound + 3
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(hung, signal.SIGCONT)
        server.reconnect()
        with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
            lost.result()
        server.wait_queued("gated", pending=1, queued_rows=0)  # withdrawn, never run
    assert running.result()[1]["outputs"][0]["data"] == [1.0]
    wait_until(lambda: front_ends(server).get(2, hung) != hung, "front end #2 to be replaced")
    (again,) = connections(server, 2, 1)
    assert infer(again, "gated", 3.0)[1]["outputs"][0]["data"] == [3.0]
    assert infer(on_one, "gated", 4.0)[1]["outputs"][0]["data"] == [4.0]
    assert server.batches_started("gated") == [1, 1, 1]
    assert "front end #2 answered no heartbeat" in server.stderr_showing("no heartbeat")


def test_sigterm_drains_every_front_end_and_every_process_ends(
    serve: Launcher, threads: ThreadPoolExecutor
) -> None:
    server = serve("models:gated", *FRONTENDS, "--max-batch-size", "1")
    processes = [zygote(server), *front_ends(server).values()]
    (on_one,) = connections(server, 1, 1)
    (on_two,) = connections(server, 2, 1)
    with server.gate_closed("gated"):
        held = [threads.submit(infer, on_one, "gated", 1.0)]
        server.wait_started("gated", 1)
        held.append(threads.submit(infer, on_two, "gated", 2.0))
        wait_until(
            lambda: server.metric("carpool_requests_in_flight", model="gated") == 2,
            "2 requests in flight",
        )
        server.send_signal(signal.SIGTERM)
        server.stderr_showing("draining 2 front ends")
        assert not any(f.done() for f in held)  # nothing answered early or dropped
    assert [f.result()[1]["outputs"][0]["data"] for f in held] == [[1.0], [2.0]]
    assert server.wait_exit() == 0
    wait_until(lambda: not any(alive(pid) for pid in processes), "every process to end")
    assert "Traceback" not in server.stderr()


def test_a_killed_main_process_takes_its_front_ends_and_shared_memory(serve: Launcher) -> None:
    before = set(os.listdir("/dev/shm"))
    server = serve("models:add_one", *FRONTENDS)
    processes = [zygote(server), *front_ends(server).values()]
    for index in (1, 2):
        (conn,) = connections(server, index, 1)
        assert infer(conn, "add_one", 1.0)[0] == 200
    server.kill()
    wait_until(lambda: not any(alive(pid) for pid in processes), "every front end to end")
    wait_until(lambda: set(os.listdir("/dev/shm")) <= before, "shared memory to be unlinked")


def test_keys_and_process_workers_work_behind_front_ends(serve: Launcher) -> None:
    server = serve("models:add_one", *FRONTENDS, "--api-key", "sesame", "--runner", "process")
    for index in (1, 2):
        (conn,) = connections(server, index, 1)
        conn.request("POST", "/v2/models/add_one/infer", json.dumps(float_request(1.0)))
        response = conn.getresponse()
        assert (response.status, response.read()) == (401, b'{"error": "unauthorized"}')
        headers = {"Authorization": "Bearer sesame"}
        conn.request("POST", "/v2/models/add_one/infer", json.dumps(float_request(4.0)), headers)
        response = conn.getresponse()
        assert response.status == 200
        assert json.loads(response.read())["outputs"][0]["data"] == [5.0]


def test_frontends_from_env_and_config_file_and_bad_values_refused(
    serve: Launcher, tmp_path: Path
) -> None:
    server = serve("models:add_one", env={"CARPOOL_FRONTENDS": "3"})
    assert sorted(front_ends(server)) == [1, 2, 3]
    config = tmp_path / "carpool.toml"
    config.write_text("[server]\nfrontends = 2\n")
    assert sorted(front_ends(serve("models:add_one", "--config", str(config)))) == [1, 2]
    for value in ("0", "-1", "", "two"):
        done = subprocess.run(
            [sys.executable, "-m", "carpool", "serve", "models:add_one", "--frontends", value],
            cwd=HERE,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "CARPOOL_PORT": str(free_port())},
        )
        assert done.returncode == 2, done.stderr
        assert "--frontends" in done.stderr


def test_tls_applies_in_every_front_end(serve: Launcher, tmp_path: Path) -> None:
    ca = trustme.CA()
    certificate = ca.issue_cert("127.0.0.1", "localhost")
    certfile, keyfile, root = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    certificate.cert_chain_pems[0].write_to_path(str(certfile))
    certificate.private_key_pem.write_to_path(str(keyfile))
    ca.cert_pem.write_to_path(str(root))
    trusted = ssl.create_default_context()
    ca.configure_trust(trusted)
    tls = ("--ssl-certfile", str(certfile), "--ssl-keyfile", str(keyfile))
    server = serve("models:add_one", *FRONTENDS, *tls, grpc=True, verify=trusted)
    served = set()
    for value in range(12):  # new connections: the kernel spreads them over both
        with httpx.Client(verify=trusted) as client:
            response = client.post(
                f"{server.url}/v2/models/add_one/infer", json=float_request(float(value))
            )
        assert response.json()["outputs"][0]["data"] == [value + 1.0]
        served.add(response.status_code)
    assert served == {200}
    with pytest.raises(httpx.RemoteProtocolError):  # plain HTTP: closed, nothing read
        httpx.get(f"http://{server.address}/v2/health/live", timeout=5.0)
    client = grpcclient.InferenceServerClient(
        f"localhost:{server.grpc_port}", ssl=True, root_certificates=str(root)
    )
    tensor = grpcclient.InferInput("INPUT0", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[2.0]], np.float32))
    assert client.infer("add_one", [tensor]).as_numpy("OUTPUT0").tolist() == [[3.0]]
    client.close()


def test_openai_embeddings_in_every_front_end(serve: Launcher) -> None:
    server = serve("models:lengths", *FRONTENDS, "--openai", "true")
    for index in (1, 2):
        (conn,) = connections(server, index, 1)
        body = {"model": "lengths", "input": ["ab", "a b c", "汽车"], "encoding_format": "float"}
        conn.request("POST", "/v1/embeddings", json.dumps(body))
        response = conn.getresponse()
        answer = json.loads(response.read())
        assert response.status == 200, answer
        assert [d["embedding"] for d in answer["data"]] == [[2.0, 1.0], [5.0, 3.0], [6.0, 1.0]]
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as client:
        vectors = client.embeddings.create(model="lengths", input="x y", encoding_format="float")
    assert vectors.data[0].embedding == [3.0, 2.0]
