"""Start-up and shutdown: single-model mode, models loaded at start, bad settings, SIGTERM."""

import json
import os
import signal
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from tests import grpc_clients
from tests.builders import (
    Gate,
    Scale,
    archive,
    exited,
    fp32_model,
    gated_load,
    gated_predict,
    handler_model,
    python_model,
    wait_for,
)
from tests.conftest import PROJECT, Server, free_port
from tests.integration.test_observability import log_lines


def test_single_model_mode_pings_503_until_loaded(start_server, tmp_path_factory):
    gate = Gate(tmp_path_factory.mktemp("gate"), "load")
    root = handler_model(tmp_path_factory.mktemp("single"), "model", gated_load(gate), Scale())
    server = start_server(root, SAGEMAKER_MULTI_MODEL="false")
    gate.wait_entered()
    answer = server.request("GET", "/ping")
    assert answer.status_code == 503 and "not loaded yet" in answer.json()["error"]
    answer = server.request("POST", "/invocations", json=[[1.0, 2.0]])
    assert answer.status_code == 503 and answer.json()["error"] == "model 'model' is still loading at start"
    gate.release()
    wait_for(lambda: server.request("GET", "/ping").status_code == 200, message="model never became ready")
    answer = server.request("POST", "/invocations", json=[[1.0, 2.0]])
    assert answer.status_code == 200 and answer.json() == [[2.0, 4.0]]


def test_while_the_models_named_at_start_load_every_protocol_says_retry(start_server, tmp_path_factory):
    """Triton and TF Serving listen only once the models named at start have loaded. Here a client may come
    sooner (this server listens at once, for SageMaker's `/ping`; or while a restarted model process loads
    them again): the loading model, and one not reached yet, answer 503 with Retry-After over every protocol
    and UNAVAILABLE over gRPC, never a 404 that says give up. V2 says so of any model then (Triton's server
    is not ready yet); SageMaker's and TF Serving's routes of those named at start (another is not loaded,
    as their contracts answer)."""
    gate = Gate(tmp_path_factory.mktemp("gate"), "load")
    root = tmp_path_factory.mktemp("models")
    handler_model(root, "slow", gated_load(gate), Scale())
    fp32_model(root, "later")
    server = start_server(root, SERVE_LOAD_MODELS="slow,later")
    gate.wait_entered()
    for name in ("slow", "later", "nobody"):
        for method, path in (("POST", f"/v2/models/{name}/infer"), ("GET", f"/v2/models/{name}"),
                             ("GET", f"/v2/models/{name}/ready")):
            answer = server.request(method, path, json={"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                                                     "data": [1, 2, 3, 4]}]})
            assert answer.status_code == 503 and answer.headers["Retry-After"], (path, answer.text)
            assert "still loading" in answer.json()["error"]
    for name in ("slow", "later"):
        for method, path in (("POST", f"/models/{name}/invoke"), ("GET", f"/models/{name}"),
                             ("POST", f"/v1/models/{name}:predict"), ("GET", f"/v1/models/{name}"),
                             ("GET", f"/v1/models/{name}/metadata")):
            answer = server.request(method, path, json={"instances": [[1, 2, 3, 4]]})
            assert answer.status_code == 503 and answer.headers["Retry-After"], (path, answer.text)
            assert answer.json()["error"] == f"model '{name}' is still loading at start"
    with grpc_clients.InferenceServerClient(server.grpc_url) as client:
        wait_for(lambda: _grpc_live(client), message="the gRPC front-end did not start")
        with pytest.raises(InferenceServerException) as refused:
            client.infer("later", [_fp32_input([[1, 2, 3, 4]])])
        assert refused.value.status() == "StatusCode.UNAVAILABLE" and "still loading" in refused.value.message()
        gate.release()
        wait_for(server.ready, message="the models named at start did not load")
        assert client.infer("later", [_fp32_input([[1, 2, 3, 4]])]).as_numpy("y").tolist() == [[2, 4, 6, 8]]
    answer = server.request("POST", "/v2/models/nobody/infer", json={"inputs": []})
    assert answer.status_code == 404 and "unknown model" in answer.json()["error"]
    answer = server.request("POST", "/models/later/invoke", json=[[1, 2, 3, 4]])
    assert answer.status_code == 200 and answer.json() == [[2, 4, 6, 8]]
    for path in ("/models/nobody/invoke", "/v1/models/nobody:predict"):
        assert server.request("POST", path, json={"instances": [[1, 2, 3, 4]]}).status_code == 404


def test_a_model_named_at_start_that_a_client_is_loading_is_waited_for_not_refused(start_server, tmp_path_factory):
    """A client loads the second model named at start while the first holds the start: when the start
    reaches it, it waits for the client's load and shares it (it was refused as "still loading" and logged
    as a model that did not load)."""
    gates = {name: Gate(tmp_path_factory.mktemp("gates"), name) for name in ("first", "second")}
    root = tmp_path_factory.mktemp("models")
    for name, gate in gates.items():
        handler_model(root, name, gated_load(gate), Scale())
    server = start_server(root, SERVE_LOAD_MODELS="first,second", SERVE_LOG_LEVEL="info")
    gates["first"].wait_entered()
    with ThreadPoolExecutor(1) as pool:
        second = pool.submit(server.load, "second")
        gates["second"].wait_entered()
        gates["first"].release()
        wait_for(lambda: [line for line in log_lines(server) if line["message"] == "waiting for the load under way"
                          and line["model"] == "second"], message="the start did not wait for the client's load")
        gates["second"].release()
        assert second.result().status_code == 200
    wait_for(server.ready, message="the models named at start did not load")
    assert [line for line in log_lines(server) if line["message"] == "model did not load"] == []
    assert server.invoke("second", [[1.0]]).json() == [[2.0]]


def _grpc_live(client) -> bool:
    try:
        return client.is_server_live()
    except InferenceServerException:  # its port is not open yet
        return False


def _fp32_input(rows) -> triton_grpc.InferInput:
    array = np.array(rows, np.float32)
    tensor = triton_grpc.InferInput("x", list(array.shape), "FP32")
    tensor.set_data_from_numpy(array)
    return tensor


def test_a_filled_opt_ml_model_serves_single_model_with_no_variable(start_server, tmp_path_factory):
    """A SageMaker single-model endpoint: the model extracted into /opt/ml/model, and no variable set
    (SAGEMAKER_BASE_DIR, which SageMaker's toolkits also read, only moves /opt/ml into the test's folder)."""
    base = tmp_path_factory.mktemp("opt_ml")
    handler_model(base, "model", module=Scale())
    server = start_server(base / "model", SAGEMAKER_BASE_DIR=base, SAGEMAKER_MULTI_MODEL=None, SERVE_MODEL_ROOT=None,
                          SERVE_LOG_LEVEL="info")
    wait_for(lambda: server.request("GET", "/ping").status_code == 200, message="the single model never became ready")
    answer = server.request("POST", "/invocations", json=[[1.0, 2.0]])
    assert answer.status_code == 200 and answer.json() == [[2.0, 4.0]]
    assert '"mode":"single-model"' in server.log.read_text()


def test_without_opt_ml_model_the_default_is_multi_model(start_server, tmp_path_factory):
    """`docker run -v $PWD/models:/opt/ml/models IMAGE serve`: models under /opt/ml/models, no variable."""
    base = tmp_path_factory.mktemp("opt_ml")
    fp32_model(base / "models", "one")
    server = start_server(base / "models", SAGEMAKER_BASE_DIR=base, SAGEMAKER_MULTI_MODEL=None, SERVE_MODEL_ROOT=None)
    answer = server.request("POST", "/invocations", json=[[1.0, 2.0, 3.0, 4.0]],
                            headers={"X-Amzn-SageMaker-Target-Model": "one"})
    assert answer.status_code == 200, answer.text
    assert server.loaded() == ["one"]


def test_models_named_at_start_are_loaded(start_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("start")
    fp32_model(root, "one")
    fp32_model(root, "two")
    archive(fp32_model(tmp_path_factory.mktemp("src"), "three"), root / "three.tar.gz")
    (root / "broken").mkdir()  # logged and skipped; the rest still load
    everything = start_server(root, SERVE_LOAD_MODELS="*")
    wait_for(lambda: everything.loaded() == ["one", "three", "two"], message="models did not load at start")
    some = start_server(root, SERVE_LOAD_MODELS="two")
    wait_for(lambda: some.loaded() == ["two"], message="SERVE_LOAD_MODELS=two did not load")


@pytest.mark.parametrize("variable, value", [
    ("SERVE_MEMORY_LIMIT", "lots"), ("SERVE_EVICTION", "sometimes"), ("SAGEMAKER_MULTI_MODEL", "maybe"),
    ("SAGEMAKER_SAFE_PORT_RANGE", "8000"), ("SAGEMAKER_BIND_TO_PORT", "70000"),
])
def test_bad_settings_stop_the_server_with_a_clear_message(tmp_path, variable, value):
    env = {**os.environ, "SERVE_MODEL_ROOT": str(tmp_path), "SAGEMAKER_BIND_TO_PORT": str(free_port()), variable: value}
    env["PATH"] = f"{PROJECT / '.venv' / 'bin'}:{env['PATH']}"
    result = subprocess.run([str(PROJECT / "serve")], cwd=PROJECT, env=env, capture_output=True, timeout=60)
    assert result.returncode != 0 and f"{variable}={value!r}".encode() in result.stderr


def test_a_variable_that_changes_nothing_is_named_at_start_and_the_server_serves(start_server, tmp_path):
    """A setting misspelt keeps its default without a word, as `SERVE_LOAD_MODEL` (for SERVE_LOAD_MODELS) would:
    the master names it in its log once, with the setting meant, and the server starts as without it."""
    fp32_model(tmp_path, "double")
    server = start_server(tmp_path, SERVE_LOAD_MODEL="double", SAGEMAKER_TS_BATCH_SIZE="8")
    unused = {line["variable"]: line["why"] for line in log_lines(server)
              if line["message"] == "an environment variable is not used"}
    assert set(unused) == {"SERVE_LOAD_MODEL", "SAGEMAKER_TS_BATCH_SIZE"}, unused
    assert "did you mean SERVE_LOAD_MODELS?" in unused["SERVE_LOAD_MODEL"]
    assert server.loaded() == [] and server.load("double").status_code == 200


def test_on_sagemaker_grpc_is_off_unless_asked_for_on_a_port_of_the_safe_range(start_server, tmp_path_factory):
    """SageMaker sets SAGEMAKER_SAFE_PORT_RANGE: Triton's gRPC port (8001) is not the container's to take there
    (an inference pipeline's containers share the host's ports), and SageMaker sends gRPC to none."""
    root = tmp_path_factory.mktemp("models")
    fp32_model(root, "plain")
    port = free_port()
    server = start_server(root, SAGEMAKER_SAFE_PORT_RANGE=f"{port}-{port}", SERVE_GRPC_PORT=None)
    assert server.grpc_pids() == [] and server.load("plain").status_code == 200
    asked = start_server(root, SAGEMAKER_SAFE_PORT_RANGE="1024-65535")  # and SERVE_GRPC_PORT, a free port, within it
    wait_for(asked.grpc_ready, 60, "gRPC did not serve on the port asked for within the safe range")


def test_sigterm_finishes_requests_in_flight_and_closes_idle_connections(tmp_path_factory):
    gate = Gate(tmp_path_factory.mktemp("gate"), "predict")
    root = tmp_path_factory.mktemp("term")
    handler_model(root, "gated", gated_predict(gate), Scale())
    server = Server(root)
    try:
        assert server.load("gated").status_code == 200
        idle = socket.create_connection(("127.0.0.1", server.port), timeout=30)  # a keep-alive client between requests
        idle.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        assert idle.recv(1024).startswith(b"HTTP/1.1 200")
        with ThreadPoolExecutor(1) as pool:
            inflight = pool.submit(server.invoke, "gated", [[4.0]])
            gate.wait_entered()
            os.killpg(server.process.pid, signal.SIGTERM)
            assert idle.recv(1024) == b""  # the idle connection is closed, not waited for
            gate.release()
            assert inflight.result().json() == [[8.0]]  # the request in flight finished
        assert server.process.wait(timeout=20) == 0  # well inside the 30 s graceful timeout
        idle.close()
    finally:
        server.stop()


def test_a_model_process_leaves_no_files_behind_however_it_ends(start_server, tmp_path_factory):
    """An archive's extraction and a load request's files live as long as the model process: gone when
    it is killed and replaced, when the server stops, and, for a server killed outright, when the next
    one starts where it ran."""
    root, scratch = tmp_path_factory.mktemp("models"), tmp_path_factory.mktemp("t")
    archive(fp32_model(tmp_path_factory.mktemp("src"), "packed"), root / "packed.tar.gz")
    fp32_model(root, "plain")
    override = {"parameters": {"config": json.dumps({"backend": "pytorch", "max_batch_size": 8,
                                                     "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
                                                     "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [4]}]})}}

    def start() -> Server:
        server = start_server(root, TMPDIR=str(scratch), SERVE_GRPC_PORT="off")
        assert server.load("packed", "packed.tar.gz").status_code == 200
        assert server.request("POST", "/v2/repository/models/plain/load", json=override).status_code == 200
        for prefix in ("model-", "override-"):  # the two kinds of scratch, both in use
            assert list(scratch.glob(f"container-{server.process.pid}/worker-*/{prefix}*")), prefix
        return server

    server = start()
    worker = server.worker_pid()
    os.kill(worker, signal.SIGKILL)
    wait_for(lambda: server.replaced(worker), message="gunicorn did not start another model process")
    wait_for(lambda: not (scratch / f"container-{server.process.pid}" / f"worker-{worker}").exists(),
             message="the killed model process's files stayed")
    wait_for(lambda: server.load("packed", "packed.tar.gz").status_code == 200, 60, "the new model process did not load")
    server.stop()
    assert list(scratch.iterdir()) == []

    killed = start()
    worker = killed.worker_pid()  # holds the directory's lock with the master
    os.killpg(killed.process.pid, signal.SIGKILL)
    killed.process.wait(30)
    wait_for(lambda: exited(worker), message="the killed model process did not end")
    assert (scratch / f"container-{killed.process.pid}").is_dir()
    start_server(root, TMPDIR=str(scratch), SERVE_GRPC_PORT="off")
    assert not (scratch / f"container-{killed.process.pid}").exists()


def test_data_on_its_way_to_a_model_process_that_died_is_removed(start_server, tmp_path_factory):
    """A large tensor crosses to the model process in /dev/shm, which is memory: one a front-end wrote
    for a model process killed before it read it (an OOM kill does that) would hold it until the server
    stopped, and a crash loop would fill it."""
    root = tmp_path_factory.mktemp("models")
    fp32_model(root, "wide", dims=(-1,))
    server = start_server(root, SERVE_GRPC_PORT="off", SERVE_LOAD_MODELS="wide", SERVE_HTTP_WORKERS="1")
    wait_for(server.ready, message="the model did not load")
    worker, blobs = server.worker_pid(), f"container-{server.process.pid}-*"
    header = json.dumps({"inputs": [{"name": "x", "shape": [1, 300_000], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 1_200_000}}]}).encode()
    request = {"data": header + np.ones(300_000, np.float32).tobytes(),
               "headers": {"Inference-Header-Content-Length": str(len(header))}}
    # the front-end fetches its view of the model now: later it decodes and sends without asking
    assert server.request("POST", "/v2/models/wide/infer", **request).status_code == 200
    os.kill(worker, signal.SIGSTOP)
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(server.request, "POST", "/v2/models/wide/infer", **request)
        wait_for(lambda: list(Path("/dev/shm").glob(blobs)), message="the front-end did not write the tensor")
        os.kill(worker, signal.SIGKILL)
        assert answer.result().status_code == 503
    wait_for(lambda: server.replaced(worker), message="gunicorn did not start another model process")
    wait_for(lambda: not list(Path("/dev/shm").glob(blobs)), message="the tensor stayed in /dev/shm")


def test_an_answer_on_its_way_to_a_front_end_that_died_is_removed(start_server, tmp_path_factory):
    """The model process writes a large answer to /dev/shm for the front-end that asked: a front-end killed
    before it read it would leave it there until the server stopped."""
    root = tmp_path_factory.mktemp("models")
    gate = Gate(tmp_path_factory.mktemp("gates"), "answer")
    handler_model(root, "wide", f"""
import torch
def predict_fn(data, model):
    {gate.code()}
    return torch.ones(400_000)  # 2.4 MB of JSON
""", Scale())
    server = start_server(root, SERVE_GRPC_PORT="off", SERVE_LOAD_MODELS="wide", SERVE_HTTP_WORKERS="1")
    wait_for(server.ready, message="the model did not load")
    [front_end], worker = server.http_pids(), server.worker_pid()
    answers = f"container-{server.process.pid}-{worker}-*"
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(server.invoke, "wide", [1.0])
        gate.wait_entered()
        os.kill(front_end, signal.SIGSTOP)  # it asked, and reads nothing more
        gate.release()
        wait_for(lambda: list(Path("/dev/shm").glob(answers)), message="the model process wrote no answer")
        os.kill(front_end, signal.SIGKILL)
        with pytest.raises(requests.ConnectionError):
            answer.result()
    wait_for(lambda: not list(Path("/dev/shm").glob(answers)), message="the answer stayed in /dev/shm")
    wait_for(lambda: server.http_pids() not in ([], [front_end]), message="the front-end was not started again")
    assert server.request("GET", "/ping").status_code == 200


def test_every_process_of_a_server_whose_master_was_killed_exits(start_server, tmp_path_factory):
    """SIGKILL to gunicorn's master alone (the OOM killer picks one process): an orphaned front-end would
    hold its port, sharing it with the next server's, and answer its share of calls with errors."""
    root = tmp_path_factory.mktemp("models")
    fp32_model(root, "plain")
    server = start_server(root, SERVE_HTTP_WORKERS="2")  # front-ends of both kinds, whatever the machine
    wait_for(server.grpc_ready, message="the gRPC front-end did not start")
    processes = [server.worker_pid(), *server.http_pids(), *server.grpc_pids()]
    assert server.http_pids() and server.grpc_pids()
    os.kill(server.process.pid, signal.SIGKILL)
    server.process.wait(30)
    for pid in processes:
        wait_for(lambda pid=pid: exited(pid), 30, f"process {pid} outlived its master")


def test_sighup_restarts_the_model_process_after_it_drains_never_beside_it(tmp_path_factory):
    """gunicorn's reload starts a new worker beside the old: two model processes, each loading and
    holding models in one memory budget. Here the old one finishes its requests and exits first."""
    gate = Gate(tmp_path_factory.mktemp("gate"), "predict")
    root = tmp_path_factory.mktemp("hup")
    handler_model(root, "gated", gated_predict(gate), Scale())
    fp32_model(root, "plain")
    server = Server(root, SERVE_LOAD_MODELS="gated,plain", SERVE_GRPC_PORT="off", SERVE_LOG_LEVEL="info", SERVE_HTTP_WORKERS="2")
    try:
        wait_for(server.ready, message="the models named at start did not load")
        old = server.worker_pid()
        with ThreadPoolExecutor(1) as pool:
            inflight = pool.submit(server.invoke, "gated", [[4.0]])
            gate.wait_entered()
            os.kill(server.process.pid, signal.SIGHUP)
            wait_for(lambda: "Hang up: the model process drains" in server.log.read_text(), message="no SIGHUP handled")
            assert server.worker_pids() == [old]  # draining, alone
            meanwhile = server.request("POST", "/v2/models/plain/infer", json={
                "inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
            # a restart, not the server's end: the words once said "the server is shutting down"
            assert meanwhile.status_code == 503 and "the model process is stopping" in meanwhile.json()["error"], meanwhile.text
            assert "Retry-After" in meanwhile.headers
            gate.release()
            assert inflight.result().json() == [[8.0]]
        wait_for(lambda: server.replaced(old), 60, "gunicorn did not start the next model process")
        wait_for(server.ready, 60, "the next model process did not load the models named at start")
        answer = server.request("POST", "/v2/models/plain/infer", json={
            "inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
        assert answer.status_code == 200 and answer.json()["outputs"][0]["data"] == [2, 4, 6, 8]
    finally:
        server.stop()


def test_sighup_without_front_ends_tells_a_request_pipelined_behind_one_in_flight_to_retry(tmp_path_factory):
    """The model process serving HTTP itself restarts: the request in flight is answered, and one that came
    behind it on the same connection is told the model process is stopping (it once read "the server is
    shutting down; send the request again (to another instance)", right only at the server's end)."""
    gate = Gate(tmp_path_factory.mktemp("gate"), "predict")
    root = tmp_path_factory.mktemp("hup-alone")
    handler_model(root, "gated", gated_predict(gate), Scale())
    server = Server(root, SERVE_LOAD_MODELS="gated", SERVE_GRPC_PORT="off", SERVE_LOG_LEVEL="info", SERVE_HTTP_WORKERS="0")
    try:
        wait_for(server.ready, message="the model did not load")
        old = server.worker_pid()
        body = b"[[4.0]]"
        invoke = (f"POST /models/gated/invoke HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            sock.sendall(invoke + b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")  # the second waits behind the first
            gate.wait_entered()
            os.kill(server.process.pid, signal.SIGHUP)
            wait_for(lambda: "Hang up: the model process drains" in server.log.read_text(), message="no SIGHUP handled")
            gate.release()
            answers = b""
            while chunk := sock.recv(65536):
                answers += chunk
        first, _, second = answers.partition(b"HTTP/1.1 ")[2].partition(b"HTTP/1.1 ")
        assert first.startswith(b"200") and first.endswith(b"[[8.0]]"), first
        assert second.startswith(b"503") and b"Retry-After: 1" in second and b"the model process is stopping" in second, second
        wait_for(lambda: server.replaced(old), 60, "gunicorn did not start the next model process")
        wait_for(server.ready, 60, "the next model process did not load the model named at start")
    finally:
        server.stop()


@pytest.mark.parametrize("sig", [signal.SIGTTIN, signal.SIGUSR2])
def test_signals_that_would_run_a_second_model_process_are_ignored(start_server, tmp_path_factory, sig):
    """gunicorn adds a worker at SIGTTIN and starts a second master beside itself at SIGUSR2: either
    would make two processes own the models."""
    root = tmp_path_factory.mktemp("models")
    fp32_model(root, "plain")
    server = start_server(root, SERVE_GRPC_PORT="off", SERVE_LOG_LEVEL="info")
    worker = server.worker_pid()
    os.kill(server.process.pid, sig)
    wait_for(lambda: "Ignored: one model process owns the models" in server.log.read_text(), message="not ignored")
    assert server.worker_pids() == [worker] and server.load("plain").status_code == 200


def test_sigterm_as_gunicorn_replaces_the_model_process_stops_the_server_at_once(start_server, tmp_path_factory):
    """A SIGTERM that reaches a new model process before it has set its own handlers goes to the copy of
    the master's handler the fork gave it, which only queues it: the process served on until the master's
    graceful timeout (30 s) killed it."""
    root = tmp_path_factory.mktemp("models")
    fp32_model(root, "plain")
    # one front-end: here the signal then reaches the new process in that window in every run
    server = start_server(root, SERVE_GRPC_PORT="off", SERVE_HTTP_WORKERS="1")
    worker = server.worker_pid()
    os.kill(worker, signal.SIGKILL)
    wait_for(lambda: server.replaced(worker), message="gunicorn did not start another model process")
    os.killpg(server.process.pid, signal.SIGTERM)  # as the new one starts
    assert server.process.wait(timeout=20) == 0  # well inside the 30 s graceful timeout


# A sitecustomize for the server's processes: the model process's import of the app's modules (most of its
# boot) is held for ever, as a slow disk would hold it. It waits in signal.pause(), which each signal ends
# after its handler has run, as an import runs them between its steps: a blocking read would hold the handler
# off (gunicorn restarts a worker's system calls).
SLOW_BOOT_PY = """
import importlib.abc, os, signal, sys


class _SlowBoot(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "container.app":
            sys.meta_path.remove(self)
            open(os.environ["TEST_BOOT_REACHED"], "w").close()
            while True:
                signal.pause()
        return None


sys.meta_path.insert(0, _SlowBoot())
"""


@pytest.mark.parametrize("stop", [lambda master: master.send_signal(signal.SIGTERM),  # `docker stop`
                                  lambda master: os.killpg(master.pid, signal.SIGINT)],  # a terminal's Ctrl-C
                         ids=["sigterm-to-the-master", "sigint-to-the-group"])
def test_a_stop_while_the_model_process_boots_ends_it_at_once(tmp_path_factory, stop):
    """A stop while the model process is still importing the app: it has nothing to drain, and ends without
    finishing its boot; it used to finish it first (1.4-1.6 s here, as long as a cold disk makes it on a
    platform) and then stop."""
    root, hooks = tmp_path_factory.mktemp("models"), tmp_path_factory.mktemp("hooks")
    (hooks / "sitecustomize.py").write_text(SLOW_BOOT_PY)
    reached = hooks / "reached"
    path = os.pathsep.join(filter(None, [str(hooks), os.environ.get("PYTHONPATH")]))
    server = Server(root, answering=False, PYTHONPATH=path, TEST_BOOT_REACHED=str(reached))
    try:
        wait_for(reached.exists, message="the model process never began to import the app")
        stop(server.process)
        assert server.process.wait(timeout=20) == 0  # the boot is held for ever; the graceful timeout is 30 s
    finally:
        server.stop()  # the held boot included
    assert "Worker failed to boot" not in server.log.read_text()


# A sitecustomize for the server's processes: the model process's last step, the exit's own garbage
# collection (after CPython has given each signal it handled its default action back), waits until the
# test writes to the FIFO it names. The master, which imported it before the fork, ends without waiting.
LAST_STEP_PY = """
import atexit, gc, os, sys


class _LastStep:
    def __init__(self, gate):
        self.gate, self.cycle = gate, self  # a cycle: freed by a collection, not when its last name goes

    def __del__(self):
        gate = os.open(self.gate, os.O_RDONLY)
        os.read(gate, 1)
        os.close(gate)


def _leave_last_step(gate, master):
    if os.getpid() != master:
        gc.disable()  # no collection before the exit's own
        _LastStep(gate)


if "gunicorn" in " ".join(sys.orig_argv):
    atexit.register(_leave_last_step, os.environ["TEST_LAST_STEP_GATE"], os.getpid())
"""


def test_a_model_process_that_is_ending_is_not_killed_by_the_masters_stop(tmp_path_factory):
    """A stop sent to the whole group (`kill -- -PGID`; a terminal's Ctrl-C is one) reaches the model process
    and the master at once: the model process ends by itself while the master, stopping too, sends it
    SIGUSR2 (its loads end) and then SIGTERM. In its last steps those signals have their default action
    again, which is death: it was killed, and gunicorn logged "Worker was sent SIGUSR2!" as a fault."""
    root, hooks = tmp_path_factory.mktemp("models"), tmp_path_factory.mktemp("hooks")
    (hooks / "sitecustomize.py").write_text(LAST_STEP_PY)
    gate = hooks / "gate"
    os.mkfifo(gate)
    path = os.pathsep.join(filter(None, [str(hooks), os.environ.get("PYTHONPATH")]))
    server = Server(root, PYTHONPATH=path, TEST_LAST_STEP_GATE=str(gate), SERVE_GRPC_PORT="off", SERVE_LOG_LEVEL="info")
    try:
        worker, front_ends = server.worker_pid(), server.http_pids()
        os.kill(worker, signal.SIGTERM)  # as the group's stop reaches it
        writer = wait_for(lambda: _opened_for_writing(gate), message="the model process did not reach its last step")
        os.kill(server.process.pid, signal.SIGTERM)  # the master's stop: SIGUSR2 to the model process, then the front-ends
        wait_for(lambda: all(map(exited, front_ends)), message="the front-ends did not drain")
        assert not exited(worker), server.log.read_text()[-2000:]
        os.write(writer, b"x")
        os.close(writer)
        assert server.process.wait(timeout=20) == 0
        assert [line["message"] for line in log_lines(server) if "was sent" in line["message"]] == []
    finally:
        server.stop()


def _opened_for_writing(fifo: Path) -> int | None:
    """The FIFO's write end, once a reader opens it (None before)."""
    try:
        return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # ENXIO: no reader yet
        return None


GATED_DOUBLE_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        {gate}
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() * 2)])
                for r in requests]
"""


@pytest.mark.parametrize("front_ends", ["0", "2"])
def test_sigterm_drains_grpc_before_the_model_process_and_no_open_stream_holds_the_stop(tmp_path_factory, front_ends):
    """`docker stop` (SIGTERM to the master, then SIGKILL after 10 s): a gRPC call under way is answered, one
    that comes meanwhile is told to retry, and a client's open stream is ended, with the reason, rather than
    waited for. The gRPC front-ends stopped only after the model process had, and a stream idle between
    requests held that for gRPC's 30 s grace: past Docker's 10 s, so every stop ended in SIGKILL. A stream
    opened during the drain held it so too; and streams were ended without a word, so that a client that
    had just sent a request on one waited for its answer until its own deadline."""
    gate = Gate(tmp_path_factory.mktemp("gate"), "execute")
    root = tmp_path_factory.mktemp("models")
    fp32_model(root, "plain")
    io = {"input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [4]}],
          "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]}]}
    python_model(root, "gated", GATED_DOUBLE_PY.format(gate=gate.code()), io)
    server = Server(root, SERVE_HTTP_WORKERS=front_ends, SERVE_LOAD_MODELS="plain,gated")
    wait_for(server.grpc_ready, 60, "the gRPC front-end did not answer ready")
    streaming, late = grpc_clients.InferenceServerClient(server.grpc_url), grpc_clients.InferenceServerClient(server.grpc_url)
    unary = grpc_clients.InferenceServerClient(server.grpc_url)
    try:
        answered = []
        streaming.start_stream(lambda result, error: answered.append(error or result), stream_timeout=60)
        streaming.async_stream_infer("plain", [_grpc_input("x", [1, 4])])
        wait_for(lambda: answered, message="the stream's request was not answered")
        assert answered[0].as_numpy("y").tolist() == [[2.0, 4.0, 6.0, 8.0]]  # the stream is open, and idle
        with ThreadPoolExecutor(1) as pool:
            under_way = pool.submit(unary.infer, "gated", [_grpc_input("IN", [4])], client_timeout=60)
            gate.wait_entered()
            os.kill(server.process.pid, signal.SIGTERM)
            wait_for(lambda: not server.grpc_ready(), message="gRPC still says it is ready after SIGTERM")
            with pytest.raises(InferenceServerException) as meanwhile:
                grpc_clients.InferenceServerClient(server.grpc_url).infer("plain", [_grpc_input("x", [1, 4])], client_timeout=60)
            assert meanwhile.value.status() == "StatusCode.UNAVAILABLE", meanwhile.value
            told = []
            late.start_stream(lambda result, error: told.append(error))  # opened while the server drains
            gate.release()
            assert under_way.result(timeout=60).as_numpy("OUT").tolist() == [2.0, 4.0, 6.0, 8.0]
        assert server.process.wait(timeout=10) == 0
        # each stream was ended with the reason, so that a client waiting on it hears it has to go elsewhere
        wait_for(lambda: len(answered) > 1 and told, message="a stream's client was not told it had ended")
        for error in (answered[1], told[0]):
            assert error.status() == "StatusCode.UNAVAILABLE" and "shutting down" in error.message(), error
    finally:
        streaming.stop_stream()
        late.stop_stream()
        server.stop()


def _grpc_input(name: str, shape: list[int]) -> triton_grpc.InferInput:
    tensor = triton_grpc.InferInput(name, shape, "FP32")
    tensor.set_data_from_numpy(np.arange(1, 5, dtype=np.float32).reshape(shape))
    return tensor


@pytest.mark.parametrize("front_ends", ["0", "2"])
def test_after_sigterm_a_new_connection_is_refused_while_a_request_under_way_finishes(tmp_path_factory, front_ends):
    """With front-ends, the port stayed open in the master and the model process after the front-ends had
    stopped accepting: a new client's connection sat in the listen queue, its request unanswered until
    its own timeout, and was reset when the server exited. A closed port tells it at once."""
    gate = Gate(tmp_path_factory.mktemp("gate"), "predict")
    root = tmp_path_factory.mktemp("models")
    handler_model(root, "gated", gated_predict(gate), Scale())
    server = Server(root, SERVE_HTTP_WORKERS=front_ends, SERVE_GRPC_PORT="off")
    try:
        assert server.load("gated").status_code == 200
        with ThreadPoolExecutor(1) as pool:
            under_way = pool.submit(server.invoke, "gated", [[4.0]])
            gate.wait_entered()
            os.kill(server.process.pid, signal.SIGTERM)
            wait_for(lambda: _refused(server.port), 10, "the port still takes connections after SIGTERM")
            gate.release()
            assert under_way.result(timeout=60).json() == [[8.0]]
        assert server.process.wait(timeout=20) == 0
    finally:
        server.stop()


def _refused(port: int) -> bool:
    """Whether a connection to `port` is refused, or reset as the port closes under it: told at once."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except (ConnectionRefusedError, ConnectionResetError):
        return True
    return False


def _sagemaker_load(server: Server) -> tuple[str, str]:
    return _sagemaker_answer(server.load("slow"))


def _grpc_load(server: Server) -> tuple[str, str]:
    with grpc_clients.InferenceServerClient(server.grpc_url) as client:
        try:
            client.load_model("slow")
        except InferenceServerException as exc:
            return str(exc.status()), exc.message()
    return "OK", ""


def _invocation_that_loads(server: Server) -> tuple[str, str]:
    """SageMaker's multi-model invocation: the target model loads on its first use."""
    return _sagemaker_answer(server.request("POST", "/invocations", data=b"[[4.0]]", headers={
        "X-Amzn-SageMaker-Target-Model": "slow", "Content-Type": "application/json"}))


def _sagemaker_answer(answer: requests.Response) -> tuple[str, str]:
    assert answer.status_code != 503 or answer.headers.get("Retry-After") == "1", answer.headers
    return str(answer.status_code), answer.json().get("error", "") if answer.status_code != 200 else ""


@pytest.mark.parametrize(("wait_on_a_load", "front_ends", "told"), [
    (_sagemaker_load, "0", "503"),  # with front-ends: test_races' SIGTERM to every process during a load
    (_grpc_load, "2", "StatusCode.UNAVAILABLE"), (_invocation_that_loads, "2", "503")])
def test_a_stop_tells_a_load_under_way_to_retry_and_never_waits_for_it(tmp_path_factory, wait_on_a_load, front_ends, told):
    """`docker stop` allows 10 s before SIGKILL. A load under way (a slow model_fn, a large download) held
    the stop until it ended, whatever it took (measured: 15.5–16.3 s for a load that took 15 s), and its
    client was then told it had loaded a model on a server about to exit. It is told to retry elsewhere
    now, at once, and the server exits without waiting for it; nothing of the load outlives the server."""
    gate = Gate(tmp_path_factory.mktemp("gate"), "load")
    root = tmp_path_factory.mktemp("models")
    handler_model(root, "slow", gated_load(gate), Scale())
    server = Server(root, SERVE_HTTP_WORKERS=front_ends)
    try:
        wait_for(server.grpc_ready, 60, "the gRPC front-end did not answer ready")
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(wait_on_a_load, server)
            gate.wait_entered()
            os.kill(server.process.pid, signal.SIGTERM)
            status, message = waiting.result(timeout=60)
        assert status == told and "stopping" in message, message
        assert server.process.wait(timeout=10) == 0
        wait_for(lambda: _group_gone(server.process.pid), 10, "a process of the server outlived it")
    finally:
        server.stop()


def test_sighup_tells_a_load_under_way_to_retry_and_the_next_model_process_loads_it(tmp_path_factory):
    """A restart of the model process (SIGHUP) does not wait for a load under way either: the new process
    starts at once, and the load, sent again, loads there."""
    gate = Gate(tmp_path_factory.mktemp("gate"), "load")
    root = tmp_path_factory.mktemp("models")
    handler_model(root, "slow", gated_load(gate), Scale())
    server = Server(root, SERVE_HTTP_WORKERS="2")
    try:
        worker = server.worker_pid()
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(_invocation_that_loads, server)
            gate.wait_entered()
            gate.marker.unlink()
            os.kill(server.process.pid, signal.SIGHUP)
            status, message = waiting.result(timeout=60)
        assert status == "503" and "stopping" in message, message
        wait_for(lambda: server.replaced(worker), 10, "no new model process started")
        with ThreadPoolExecutor(1) as pool:
            again = pool.submit(lambda: wait_for(lambda: _invocation_that_loads(server)[0] != "503", 30, "still told to retry"))
            gate.wait_entered()
            gate.release()
            again.result(timeout=60)
        assert _invocation_that_loads(server) == ("200", "")
    finally:
        server.stop()


def _group_gone(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return True
    return False
