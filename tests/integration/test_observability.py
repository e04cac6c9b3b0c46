"""/metrics moves as requests succeed and fail (scrape, act, scrape again), and every request leaves
one JSON log line."""

import json
import re
import socket

import grpc
import numpy as np
import pytest
import requests
import torch
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.utils import InferenceServerException

from container.scheduling.inline import INLINE_WINDOW
from tests import grpc_clients
from tests.builders import Scale, fp32_model, handler_model, python_model, sized_model, tensor, wait_for


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    fp32_model(root, "double")
    fp32_model(root, "refuses", Refuses())
    for name in ("small1", "small2", "small3"):
        sized_model(root, name, 8)
    sized_model(root, "huge", 40)
    frozen = torch.jit.freeze(torch.jit.script(torch.nn.Sequential(torch.nn.Linear(4, 1024), torch.nn.Linear(1024, 1024),
                                                                   torch.nn.Linear(1024, 4)).eval()))
    fp32_model(root, "frozen", frozen)
    return start_server(root, SERVE_MEMORY_LIMIT="20MiB", SERVE_LOG_LEVEL="info")


def scrape(server) -> dict[tuple, float]:
    answer = server.request("GET", "/metrics")
    assert answer.headers["Content-Type"].startswith("text/plain")
    assert "# TYPE nv_inference_request_success counter" in answer.text  # Triton's names, as Triton writes them
    # (the parser reads counter samples as …_total, as it does for Triton's own output)
    assert re.search(r'^nv_inference_count\{model="[^"]+",version="\d+"\} ', answer.text, re.MULTILINE)
    return server.metrics()


def delta(before, after, name, **labels) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0) - before.get(key, 0)


def test_inference_metrics_follow_successes_and_failures(server):
    """A request its model's signature refuses never reached the model: no failed inference, as Triton
    counts (it was counted where the core checked it, and not where a front-end did). A failure is
    counted under Triton's reason for it."""
    assert server.load("double").status_code == 200 and server.load("refuses").status_code == 200
    before = scrape(server)
    assert server.invoke("double", [[1, 2, 3, 4], [5, 6, 7, 8]]).status_code == 200
    assert server.invoke("double", [[1, 2, 3, 4]]).status_code == 200
    assert server.invoke("double", [[1, 2, 3]]).status_code == 400
    assert server.request("POST", "/v2/models/double/infer", json={"inputs": [
        {"name": "x", "shape": [1, 4], "datatype": "FP64", "data": [1, 2, 3, 4]}]}).status_code == 400
    assert server.invoke("refuses", [[-1, 0, 0, 0]]).status_code == 500
    after = scrape(server)
    model = {"model": "double", "version": "1"}
    assert delta(before, after, "nv_inference_request_success_total", **model) == 2
    for reason in ("OTHER", "REJECTED", "BACKEND", "CANCELED"):
        assert delta(before, after, "nv_inference_request_failure_total", reason=reason, **model) == 0
        assert delta(before, after, "nv_inference_request_failure_total", model="refuses", reason=reason,
                     version="1") == (reason == "BACKEND")
    assert delta(before, after, "nv_inference_count_total", **model) == 3
    assert delta(before, after, "nv_inference_exec_count_total", **model) == 2
    for phase in ("request", "compute_infer"):
        assert delta(before, after, f"nv_inference_{phase}_duration_us_total", **model) > 0
    assert after[("serve_queue_depth", (("model", "double"),))] == 0
    assert after[("nv_cpu_memory_total_bytes", ())] > 0
    assert 0 <= after[("nv_cpu_utilization", ())] <= 1
    assert not [key for key in after if key[0].startswith("nv_cache_")]  # no response cache: none, as on Triton
    [stats] = server.request("GET", "/v2/models/double/stats").json()["model_stats"]
    assert stats["inference_stats"]["fail"]["count"] == 0


def test_the_executions_the_event_loop_ran_are_counted_apart(start_server, tmp_path):
    """With a threshold no execution of this model reaches, the judge sends its first INLINE_WINDOW
    executions to its thread and every later one to the loop: the counter says where each ran."""
    fp32_model(tmp_path, "double")
    server = start_server(tmp_path, SERVE_INLINE_BELOW_US="2000000")
    assert server.load("double").status_code == 200
    for _ in range(INLINE_WINDOW + 4):
        assert server.invoke("double", [[1, 2, 3, 4]]).status_code == 200
    after = scrape(server)
    model = (("model", "double"), ("version", "1"))
    assert after[("nv_inference_exec_count_total", model)] == INLINE_WINDOW + 4
    assert after[("serve_inference_exec_on_loop_total", model)] == 4


def test_cache_metrics_follow_loads_evictions_hits_misses_and_507s(server):
    before = scrape(server)
    for name in ("small1", "small2", "small3"):  # a 20 MiB budget holds two: the third evicts one
        assert server.load(name).status_code == 200
    assert server.load("huge").status_code == 507
    headers = {"X-Amzn-SageMaker-Target-Model": "small1", "Content-Type": "application/json"}  # evicted: a miss
    assert server.request("POST", "/invocations", data="[[1, 1, 1, 1]]", headers=headers).status_code == 200
    after = scrape(server)
    assert delta(before, after, "serve_model_loads_total", outcome="success") == 4
    assert delta(before, after, "serve_model_loads_total", outcome="failure") == 1
    assert delta(before, after, "serve_model_evictions_total") >= 1
    assert delta(before, after, "serve_insufficient_memory_total") == 1
    assert delta(before, after, "serve_cache_misses_total") == 1
    assert after[("serve_memory_budget_bytes", (("device", "cpu"),))] == 20 << 20
    held = after[("serve_model_memory_bytes", (("device", "cpu"), ("model", "small3")))]
    # its 8 MiB of weights, or what its load grew the process by when that is more: RSS moves by a page
    # when another thread allocates meanwhile (seen once in about ten runs)
    assert 8 << 20 <= held <= (8 << 20) + (64 << 10)
    assert after[("serve_memory_accounted_bytes", (("device", "cpu"),))] <= 20 << 20
    server.request("POST", "/invocations", data="[[1, 1, 1, 1]]", headers=headers)
    assert delta(after, scrape(server), "serve_cache_hits_total") == 1


def log_lines(server) -> list[dict]:
    lines = []
    for line in server.log.read_text().splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


def request_lines(server, request_id=None):
    return [line for line in log_lines(server) if line["message"] == "request"
            and (request_id is None or line["request_id"] == request_id)]


def test_a_metrics_port_another_process_holds_keeps_no_model_from_serving(start_server, tmp_path):
    """SERVE_METRICS_PORT taken (by another server, a sidecar): the model process died at its start and
    was started again for ever, so no model ever served. Now the port is tried again each second, said
    once in the log, while everything else serves (`/metrics` on the HTTP port too), and taken once free."""
    fp32_model(tmp_path, "double")
    holder = socket.create_server(("0.0.0.0", 0))
    port = holder.getsockname()[1]
    try:
        server = start_server(tmp_path, SERVE_METRICS_PORT=str(port), SERVE_LOAD_MODELS="double")
        wait_for(server.ready, message="the models named at start did not load")
        answer = server.request("POST", "/v2/models/double/infer", json={
            "inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
        assert answer.status_code == 200 and answer.json()["outputs"][0]["data"] == [2, 4, 6, 8]
        assert "nv_inference_count" in server.request("GET", "/metrics").text
        [line] = wait_for(lambda: [line for line in log_lines(server) if line["message"].startswith("the metrics port is taken")])
        assert line["level"] == "ERROR" and line["port"] == port
    finally:
        holder.close()
    scraped = wait_for(lambda: _scraped(port), message="the freed metrics port was not taken")
    assert "nv_inference_count" in scraped


def _scraped(port: int) -> str | None:
    try:
        return requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    except requests.ConnectionError:  # not listening yet
        return None


def test_one_json_log_line_per_request(server):
    server.load("double")  # the cache test may have evicted it
    answer = server.invoke("double", [[1, 1, 1, 1]], headers={"X-Request-Id": "trace-42"})
    assert answer.headers["X-Request-Id"] == "trace-42"
    line = wait_for(lambda: request_lines(server, "trace-42"), message="no log line for the request")[0]
    assert line["method"] == "POST" and line["path"] == "/models/double/invoke" and line["model"] == "double"
    assert line["status"] == 200 and line["duration_ms"] > 0 and line["level"] == "INFO"
    generated = server.request("GET", "/ping").headers["X-Request-Id"]
    assert re.fullmatch(r"[0-9a-f]{32}", generated)
    wait_for(lambda: request_lines(server, generated), message="no log line for /ping")
    headers = {"X-Amzn-SageMaker-Target-Model": "double", "Content-Type": "application/json", "X-Request-Id": "t-7"}
    server.request("POST", "/invocations", data="[[1, 1, 1, 1]]", headers=headers)
    assert wait_for(lambda: request_lines(server, "t-7"))[0]["target_model"] == "double"
    failed = server.invoke("nobody", [[1]], headers={"X-Request-Id": "t-404"})
    assert failed.status_code == 404
    assert wait_for(lambda: request_lines(server, "t-404"))[0]["status"] == 404


def test_every_grpc_request_is_logged_once_as_an_http_one_is(server):
    """Unary calls and a stream's requests, answered or refused, by the gRPC front-end that took them: the
    RPC's path, the model, the status as HTTP would have answered, and the id (the client's `x-request-id`
    metadata, else the request's own id). gRPC once logged nothing of its requests, and later nothing of
    grpc.health.v1's checks."""
    wait_for(server.grpc_ready, 60, "the gRPC front-ends did not answer ready")  # they listen once the model process is reached
    server.load("double")
    x = grpcclient.InferInput("x", [1, 4], "FP32")
    x.set_data_from_numpy(np.ones((1, 4), np.float32))
    with grpc_clients.InferenceServerClient(server.grpc_url) as client:
        client.infer("double", [x], headers={"x-request-id": "grpc-ok"}, client_timeout=60)
        with pytest.raises(InferenceServerException):
            client.infer("nobody", [x], request_id="grpc-404", client_timeout=60)
        client.get_model_metadata("double", headers={"x-request-id": "grpc-metadata"}, client_timeout=60)
        answers = []
        client.start_stream(lambda result, error: answers.append(result or error), stream_timeout=60)
        client.async_stream_infer("double", [x], request_id="grpc-stream")
        client.stop_stream()  # waits for the answer under way
    with grpc.insecure_channel(server.grpc_url) as channel:  # a Kubernetes gRPC probe's call
        checks = health_pb2_grpc.HealthStub(channel)
        checks.Check(health_pb2.HealthCheckRequest(), metadata=[("x-request-id", "grpc-health")], timeout=60)
        with pytest.raises(grpc.RpcError) as unknown:
            checks.Check(health_pb2.HealthCheckRequest(service="nothing.Here"), metadata=[("x-request-id", "grpc-health-404")],
                         timeout=60)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND and "'nothing.Here'" in unknown.value.details()
    assert len(answers) == 1
    service = "/inference.GRPCInferenceService/"
    expected = {"grpc-ok": ("ModelInfer", "double", 200), "grpc-404": ("ModelInfer", "nobody", 404),
                "grpc-metadata": ("ModelMetadata", "double", 200), "grpc-stream": ("ModelStreamInfer", "double", 200),
                "grpc-health": ("/grpc.health.v1.Health/Check", None, 200),
                "grpc-health-404": ("/grpc.health.v1.Health/Check", None, 404)}
    for request_id, (rpc, model, status) in expected.items():
        [line] = wait_for(lambda: request_lines(server, request_id), message=f"no log line for {request_id}")  # noqa: B023 (waited for here)
        path = rpc if rpc.startswith("/") else service + rpc
        assert (line["method"], line["path"], line["model"], line["status"]) == ("gRPC", path, model, status)
        assert line["duration_ms"] > 0 and line["level"] == "INFO"


def test_an_invokes_custom_attributes_are_logged_once_with_its_request_id(server):
    """Whether its body is decoded by a front-end (a loaded tensor model), by the model process (a model
    loaded on first use through /invocations), or refused there."""
    server.load("double")
    invokes = [("/models/double/invoke", {}, b"[[1, 1, 1, 1]]", 200),
               ("/invocations", {"X-Amzn-SageMaker-Target-Model": "small3"}, b"[[1, 1, 1, 1]]", 200),
               ("/models/double/invoke", {}, b"[[1, 1", 400)]
    for number, (path, target, body, status) in enumerate(invokes):
        headers = {**target, "Content-Type": "application/json", "X-Request-Id": f"attributes-{number}",
                   "X-Amzn-SageMaker-Custom-Attributes": f"trace={number}"}
        assert requests.post(server.url + path, data=body, headers=headers, timeout=60).status_code == status
    for number, (_, target, _, _) in enumerate(invokes):
        request_id = f"attributes-{number}"
        wait_for(lambda: request_lines(server, request_id), message="no log line for the request")  # noqa: B023 (waited for here)
        logged = [line for line in log_lines(server) if line["message"] == "custom attributes"
                  and line["request_id"] == request_id]
        model = target.get("X-Amzn-SageMaker-Target-Model", "double")
        assert [(line["model"], line["custom_attributes"]) for line in logged] == [(model, f"trace={number}")]


def test_a_request_the_http_worker_refuses_is_answered_and_logged_as_any_other(server):
    """A body past the limit is refused before it is read: the answer still carries the request id, and
    the access log has its line."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"POST /models/double/invoke HTTP/1.1\r\nHost: x\r\nX-Request-Id: t-413\r\n"
                     b"Content-Length: 99999999999\r\n\r\n")
        head = sock.recv(65536).decode("latin-1")
    assert head.startswith("HTTP/1.1 413 ") and "\r\nX-Request-Id: t-413\r\n" in head
    line = wait_for(lambda: request_lines(server, "t-413"), message="no log line for the refused request")[0]
    assert (line["method"], line["path"], line["status"]) == ("POST", "/models/double/invoke", 413)


def test_lifecycle_events_are_logged_with_sizes_and_durations(server):
    loaded = [line for line in log_lines(server) if line["message"] == "loaded model" and line["model"] == "small1"]
    # charged what the load measured: its 8 MiB of weights and the little else it holds
    assert loaded and isinstance(loaded[0]["seconds"], float) and 8 << 20 <= loaded[0]["bytes"]["cpu"] < (8 << 20) * 1.1
    evicted = [line for line in log_lines(server) if line["message"] == "evicted idle model" and line["model"].startswith("small")]
    assert evicted and 8 << 20 <= evicted[0]["bytes"]["cpu"] and isinstance(evicted[0]["seconds"], float)
    assert server.request("DELETE", "/models/double").status_code == 200
    unloaded = wait_for(lambda: [line for line in log_lines(server) if line["message"] == "unloaded model"])
    assert unloaded[-1]["model"] == "double" and isinstance(unloaded[-1]["seconds"], float) and unloaded[-1]["bytes"]


def test_every_line_the_server_writes_is_json(start_server, tmp_path):
    """gunicorn's own lines, the app's, a handler model's worker and the shutdown included."""
    root = tmp_path / "models"
    fp32_model(root, "double")
    handler_model(root, "handler", None, Scale())
    server = start_server(root, SERVE_LOAD_MODELS="*", SERVE_LOG_LEVEL="debug")
    # /ping is liveness in multi-model mode; V2 readiness waits for the models named at start
    wait_for(server.ready, message="the models did not load")
    for name in ("double", "handler", "nobody"):
        server.invoke(name, [[1, 2, 3, 4]])
    server.request("POST", "/models/double/invoke", data="{", headers={"Content-Type": "application/json"})
    server.stop()
    lines = server.log.read_text().splitlines()
    assert lines and [line for line in lines if not _is_json_object(line)] == []
    messages = [json.loads(line)["message"] for line in lines]
    assert any(m.startswith("Starting gunicorn") for m in messages) and messages[-1] == "Shutting down: Master"


def _is_json_object(line: str) -> bool:
    try:
        document = json.loads(line)
    except ValueError:
        return False
    return isinstance(document, dict) and {"time", "level", "logger", "message"} <= set(document)


def test_a_frozen_model_is_charged_its_weights(server):
    """Freezing turns weights into graph constants: the cache still charges every byte of them."""
    assert server.load("frozen").status_code == 200
    assert server.invoke("frozen", [[1, 2, 3, 4]]).status_code == 200
    held = scrape(server)[("serve_model_memory_bytes", (("device", "cpu"), ("model", "frozen")))]
    weights = (4 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 4 + 4) * 4
    assert weights <= held < weights * 1.25


def test_torchscripts_deprecation_is_said_once_a_model_however_often_it_loads(server):
    """A model evicted and loaded again under churn said it at every load: a line per load, the same news."""
    for _ in range(2):
        assert server.request("POST", "/v2/repository/models/double/load").status_code == 200
        assert server.request("POST", "/v2/repository/models/double/unload").status_code == 200
    said = [line for line in log_lines(server) if line["message"].startswith("TorchScript is deprecated")]
    assert [line["model"] for line in said].count("double") == 1


class Refuses(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool(x.sum() < 0):
            raise ValueError("negative sums are refused")
        return x


FAILING_PY = """
import triton_python_backend_utils as pb_utils

def lookup(request):
    return {}["INPUT"]

class TritonPythonModel:
    def execute(self, requests):
        return [lookup(request) for request in requests]
"""


def code_failures(server, model: str) -> list[dict]:
    return [line for line in log_lines(server) if line["message"] == "model code raised" and line["model"] == model]


def test_a_failure_of_model_code_is_logged_once_where_it_ran_with_its_traceback_whatever_the_protocol(start_server, tmp_path):
    """A handler (its load, its request), a python model over gRPC and a TorchScript model's forward: the
    client reads what went wrong and nothing of the code; the log has the code's own traceback, once per
    failure, from the worker or the model process where the code ran (once only an error's last line was
    logged, by HTTP alone, and a failed load also logged the server's own traceback as a failed greenlet).
    A worker process that ends is logged with how it ended."""
    handler_model(tmp_path, "handler", "def scale(data):\n    raise ArithmeticError('scale went wrong')\n\n"
                                       "def predict_fn(data, model):\n    return scale(data)\n", Scale())
    handler_model(tmp_path, "unloadable", "def model_fn(model_dir):\n    raise LookupError('no weights here')\n")
    python_model(tmp_path, "python", FAILING_PY, {"max_batch_size": 0, "input": [tensor("x", "TYPE_FP32", [4])],
                                                  "output": [tensor("y", "TYPE_FP32", [4])]})
    fp32_model(tmp_path, "scripted", Refuses())
    handler_model(tmp_path, "crashing", "import os\n\ndef predict_fn(data, model):\n    os._exit(3)\n", Scale())
    server = start_server(tmp_path, SERVE_LOAD_MODELS="handler,python,scripted,crashing")
    wait_for(server.ready, message="the models did not load")

    answer = server.invoke("handler", [[1.0, 2.0]])
    assert answer.status_code == 500 and answer.json() == {"error": "predict_fn of model 'handler' raised ArithmeticError: scale went wrong"}
    [line] = wait_for(lambda: code_failures(server, "handler"), message="no log line for the handler's failure")
    assert line["level"] == "ERROR" and line["in"] == "predict_fn"
    assert 'code/inference.py", line 2, in scale' in line["traceback"] and line["traceback"].endswith("ArithmeticError: scale went wrong")

    loading = server.load("unloadable")
    assert loading.status_code == 500 and "LookupError: no weights here" in loading.json()["error"]
    [line] = wait_for(lambda: code_failures(server, "unloadable"), message="no log line for model_fn's failure")
    assert line["in"] == "model_fn" and 'code/inference.py", line 2, in model_fn' in line["traceback"]

    with grpc_clients.InferenceServerClient(server.grpc_url) as client:
        x = grpcclient.InferInput("x", [4], "FP32")
        x.set_data_from_numpy(np.ones(4, np.float32))
        with pytest.raises(InferenceServerException) as failed:
            client.infer("python", [x], client_timeout=60)
    assert failed.value.status() == "StatusCode.INTERNAL" and failed.value.message() == "execute of model 'python' raised KeyError: 'INPUT'"
    [line] = wait_for(lambda: code_failures(server, "python"), message="no log line for execute's failure")
    assert line["in"] == "execute" and 'model.py", line 5, in lookup' in line["traceback"]

    refused = server.request("POST", "/v2/models/scripted/infer", json={"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [-1.0, 0.0, 0.0, 0.0]}]})
    assert refused.status_code == 500 and refused.json() == {"error": "model 'scripted' failed: builtins.ValueError: negative sums are refused"}
    [line] = wait_for(lambda: code_failures(server, "scripted"), message="no log line for forward's failure")
    assert line["in"] == "forward" and 'raise ValueError("negative sums are refused")' in line["traceback"]

    assert server.invoke("crashing", [[1.0]]).status_code == 500  # a process that ends says how, where it is seen
    [line] = wait_for(lambda: [line for line in log_lines(server) if line["message"] == "a worker process ended"])
    assert (line["level"], line["model"], line["end"]) == ("ERROR", "crashing", "exited with code 3")

    for answered in (answer, loading, refused):
        assert "Traceback" not in answered.text and str(tmp_path) not in answered.text
    assert [line for line in log_lines(server) if line["message"] == "a greenlet failed"] == []
    assert len([line for line in log_lines(server) if line["message"] == "model code raised"]) == 4
