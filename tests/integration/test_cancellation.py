"""Triton's request cancellation, as tritonclient's gRPC client issues it: a call cancelled, or a stream
stopped with `cancel_requests=True`; and over HTTP, a client that hangs up while its request is under
way (on a model process that serves HTTP itself, and through front-ends). A cancelled request that
waits for an instance is never run, and the requests around it are served; a python model's request
that is running sees `is_cancelled()` turn true, through `execute` or its response sender, so that the
model can stop early."""

import json
import queue
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests import grpc_clients
from tests.builders import Gate, ensemble, ensemble_step, handler_model, python_model, tensor, wait_for

# x (FP32 [4]) → y = 2x; x[0] == -1 waits at the gate first
QUEUED_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            if x.flat[0] == -1:
                {gate}
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", 2 * x)]))
        return responses
"""

# A SageMaker handler model: each body it takes is written to a log beside the gates, and answered as it
# came; the body "hold" waits at a gate first
ECHO_PY = """
def model_fn(model_dir):
    return None

def transform_fn(model, body, content_type, accept):
    text = body.decode() if isinstance(body, (bytes, bytearray)) else str(body)
    if text == "hold":
        {gate}
    with open({log!r}, "a") as log:
        log.write(text + "\\n")
    return text, "text/plain"
"""

# Runs until its request is cancelled (30 s at most), then says so in a file beside the gates and answers
# with Triton's CANCELLED error
WATCHFUL_PY = """
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        [request] = requests
        open({entered!r}, "w").close()
        deadline = time.monotonic() + 30
        while not request.is_cancelled() and time.monotonic() < deadline:
            time.sleep(0.005)
        cancelled = request.is_cancelled()
        open({marker!r}, "w").write("cancelled" if cancelled else "ran out")
        error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED) if cancelled else None
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", request.inputs()[0].as_numpy())], error=error)]
"""

# Decoupled: a response every 5 ms (for 15 s at most), sent from a thread of the model's or from `execute`
# itself (the request's parameter "from"), until the request is cancelled; then the count sent is written
# to a file beside the gates, and Triton's CANCELLED error sent with the final flag. With the parameter
# "quiet", one response only, then a look every 5 ms for the cancellation
TICKER_PY = """
import json
import threading
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            parameters = json.loads(request.parameters())
            where, quiet = parameters["from"], parameters.get("quiet", False)
            if where == "thread":
                threading.Thread(target=self.tick, args=(request, request.get_response_sender().is_cancelled, where,
                                                         quiet)).start()
            else:
                self.tick(request, request.is_cancelled, where, quiet)
        return None

    def tick(self, request, cancelled, where, quiet):
        sender = request.get_response_sender()
        sent = 0
        for _ in range(3000):
            if cancelled():
                break
            if not (quiet and sent):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("n", np.array([sent], np.int32))]))
                sent += 1
            time.sleep(0.005)
        open({marker!r} + where + ("-quiet" if quiet else ""), "w").write(json.dumps({{"cancelled": cancelled(), "sent": sent}}))
        error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED) if cancelled() else None
        sender.send(pb_utils.InferenceResponse(error=error) if error else None,
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""


@pytest.fixture(scope="module")
def gate_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("gates")


@pytest.fixture(scope="module")
def gates(gate_dir) -> dict[str, Gate]:
    return {name: Gate(gate_dir, name) for name in ("queued", "direct", "handler")}


@pytest.fixture(scope="module")
def models(tmp_path_factory, gate_dir, gates) -> Path:
    root = tmp_path_factory.mktemp("models")
    x, y = tensor("x", "TYPE_FP32", [4]), tensor("y", "TYPE_FP32", [4])
    one = {"instance_group": [{"count": 1, "kind": "KIND_CPU"}]}
    python_model(root, "queued", QUEUED_PY.replace("{gate}", gates["queued"].code()),
                 {"max_batch_size": 1, "input": [x], "output": [y], "dynamic_batching": {}, **one})
    python_model(root, "direct", QUEUED_PY.replace("{gate}", gates["direct"].code()),
                 {"max_batch_size": 0, "input": [x], "output": [y], **one})
    python_model(root, "second", QUEUED_PY.replace("{gate}", "pass"), {"max_batch_size": 0, "input": [x], "output": [y], **one})
    ensemble(root, "pipeline", [x], [tensor("z", "TYPE_FP32", [4])],
             [ensemble_step("direct", {"x": "x"}, {"y": "doubled"}), ensemble_step("second", {"x": "doubled"}, {"y": "z"})])
    python_model(root, "watchful", WATCHFUL_PY.format(entered=str(gate_dir / "watchful.entered"),
                                                      marker=str(gate_dir / "watchful.ended")),
                 {"max_batch_size": 0, "input": [x], "output": [y]})
    python_model(root, "ticker", TICKER_PY.format(marker=str(gate_dir / "ticker.")),
                 {"max_batch_size": 0, "input": [x], "output": [tensor("n", "TYPE_INT32", [1])],
                  "model_transaction_policy": {"decoupled": True}})
    handler_model(root, "echo", ECHO_PY.replace("{gate}", gates["handler"].code()).replace("{log!r}", repr(str(gate_dir / "echo.log"))))
    return root


def serve(start_server, models: Path, front_ends: str):
    server = start_server(models, SERVE_LOAD_MODELS="queued,direct,second,pipeline,watchful,ticker,echo",
                          SERVE_HTTP_WORKERS=front_ends, SAGEMAKER_MODEL_SERVER_WORKERS="1")
    wait_for(lambda: server.ready() and server.grpc_ready(), 60, "the models did not load, or gRPC did not listen")
    return server


@pytest.fixture(scope="module")
def server(start_server, models):
    """HTTP through two front-ends, whatever the machine."""
    return serve(start_server, models, "2")


@pytest.fixture(scope="module")
def one_process(start_server, models):
    """HTTP served by the model process itself."""
    return serve(start_server, models, "0")


@pytest.fixture(params=["front-ends", "one process"])
def http_server(request):
    return request.getfixturevalue("server" if request.param == "front-ends" else "one_process")


def x_input(first: float) -> list:
    entry = grpcclient.InferInput("x", [4], "FP32")
    entry.set_data_from_numpy(np.array([first, 1, 2, 3], np.float32))
    return [entry]


def x_batched(first: float) -> list:
    entry = grpcclient.InferInput("x", [1, 4], "FP32")
    entry.set_data_from_numpy(np.array([[first, 1, 2, 3]], np.float32))
    return [entry]


def executions(server, name: str) -> int:
    stats = server.request("GET", f"/v2/models/{name}/stats").json()["model_stats"][0]
    return stats["execution_count"]


def failures(server, name: str) -> int:
    stats = server.request("GET", f"/v2/models/{name}/stats").json()["model_stats"][0]
    return stats["inference_stats"]["fail"]["count"]


def cancelled_responses(server, name: str) -> int:
    stats = server.request("GET", f"/v2/models/{name}/stats").json()["model_stats"][0]
    return sum(int(place["cancel"]["count"]) for place in stats.get("response_stats", {}).values())


def queue_depth(server, name: str) -> float:
    """The model's waiting requests, under this server's name and Triton's (which autoscalers read)."""
    metrics = server.metrics()
    depth = metrics.get(("serve_queue_depth", (("model", name),)), 0)
    assert metrics.get(("nv_inference_pending_request_count", (("model", name), ("version", "1")))) == depth
    return depth


@pytest.mark.parametrize(("name", "inputs", "how"), [("queued", x_batched, "cancel"), ("direct", x_input, "cancel"),
                                                     ("queued", x_batched, "deadline")])
def test_a_cancelled_request_waiting_for_the_instance_never_runs_and_the_others_are_served(server, gates, name, inputs, how):
    """One instance, held at a gate by the first request: the second waits (in the dynamic batcher's queue,
    or for the instance), is cancelled by its client (or its client_timeout passes), and never runs; the
    first is answered once the gate opens, and a third after it."""
    answers: queue.Queue = queue.Queue()
    gates[name].marker.unlink(missing_ok=True)  # a gate is used by more than one test
    before = executions(server, name)
    with grpc_clients.InferenceServerClient(server.grpc_url) as client:
        client.async_infer(name, inputs(-1), lambda result, error: answers.put(("held", result, error)), client_timeout=60)
        gates[name].wait_entered()
        waiting = client.async_infer(name, inputs(5), lambda result, error: answers.put(("cancelled", result, error)),
                                     client_timeout=60 if how == "cancel" else 3)  # seen waiting within 3 s
        wait_for(lambda: queue_depth(server, name) == 1, 30, "the second request never waited for the instance")
        if how == "cancel":
            waiting.cancel()
        wait_for(lambda: queue_depth(server, name) == 0, 30, "the cancelled request still waits for the instance")
        gates[name].release()
        told = {}
        for _ in range(2):
            which, result, error = answers.get(timeout=30)
            told[which] = (result, error)
        assert told["held"][1] is None and told["held"][0].as_numpy("y").ravel().tolist() == [-2, 2, 4, 6]
        assert ("CANCELLED" if how == "cancel" else "Deadline Exceeded") in str(told["cancelled"][1])
        third = client.infer(name, inputs(7), client_timeout=30)
        assert third.as_numpy("y").ravel().tolist() == [14, 2, 4, 6]
    assert executions(server, name) - before == 2  # the first and the third


def test_an_ensemble_cancelled_during_a_step_starts_no_other(server, gates):
    """The first step (held at a gate) finishes after the ensemble's request is cancelled; the second
    never runs: a request to it alone afterwards is its only execution."""
    gates["direct"].marker.unlink(missing_ok=True)
    before = executions(server, "second")
    answers: queue.Queue = queue.Queue()
    with grpc_clients.InferenceServerClient(server.grpc_url) as client:
        call = client.async_infer("pipeline", x_input(-1), lambda result, error: answers.put(error), client_timeout=60)
        gates["direct"].wait_entered()
        call.cancel()
        assert "CANCELLED" in str(answers.get(timeout=30))
        gates["direct"].release()
        alone = client.infer("second", x_input(3), client_timeout=30)  # behind a second step, were there one
    assert alone.as_numpy("y").tolist() == [6, 2, 4, 6]
    assert executions(server, "second") - before == 1


def test_a_running_python_request_sees_its_cancellation(server, gate_dir):
    """`request.is_cancelled()` turns true in `execute` once the client cancels the call."""
    answers: queue.Queue = queue.Queue()
    with grpc_clients.InferenceServerClient(server.grpc_url) as client:
        call = client.async_infer("watchful", x_input(1), lambda result, error: answers.put(error), client_timeout=60)
        wait_for((gate_dir / "watchful.entered").exists, 30, "the request never started")
        call.cancel()
        assert "CANCELLED" in str(answers.get(timeout=30))
        ended = wait_for(lambda: (gate_dir / "watchful.ended").exists() and (gate_dir / "watchful.ended").read_text(), 20,
                         "the model never saw the cancellation")
        assert ended == "cancelled"
        answer = client.infer("queued", x_batched(3), client_timeout=30)  # the server serves on
        assert answer.as_numpy("y").ravel().tolist() == [6, 2, 4, 6]


@pytest.mark.parametrize("where", ["thread", "execute"])
def test_a_decoupled_model_stops_when_its_stream_is_cancelled(server, gate_dir, where):
    """A stream stopped with cancel_requests=True: the model, sending from a thread of its own through the
    response sender, or from `execute` itself, sees `is_cancelled()` and stops long before its 3,000; its
    last response, the CANCELLED error, is counted in the statistics as `cancel`."""
    responses: queue.Queue = queue.Queue()
    marker = gate_dir / f"ticker.{where}"
    marker.unlink(missing_ok=True)  # the HTTP tests' tickers write it too
    cancels_before = cancelled_responses(server, "ticker")
    client = grpc_clients.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(lambda result, error: responses.put((result, error)))
        client.async_stream_infer("ticker", x_input(1), parameters={"from": where})
        for _ in range(3):  # it runs
            result, error = responses.get(timeout=30)
            assert error is None and result.as_numpy("n").shape == (1,)
        client.stop_stream(cancel_requests=True)
    finally:
        client.close()
    ended = json.loads(wait_for(lambda: marker.exists() and marker.read_text(), 20, "the model never saw the cancellation"))
    assert ended["cancelled"] and ended["sent"] < 3000
    wait_for(lambda: cancelled_responses(server, "ticker") == cancels_before + 1, 20, "the CANCELLED response was not counted")


def test_a_stream_its_client_closes_still_answers_the_requests_under_way(server, gates):
    """stop_stream() without cancel_requests: the client is done sending and waits for the answers, so
    the request under way (held at the gate as the client closes its side) is answered, not cancelled."""
    responses: queue.Queue = queue.Queue()
    gates["queued"].marker.unlink(missing_ok=True)
    with grpc_clients.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(lambda result, error: responses.put((result, error)))
        client.async_stream_infer("queued", x_batched(-1))
        gates["queued"].wait_entered()
        closing = threading.Thread(target=client.stop_stream)
        closing.start()
        gates["queued"].release()
        result, error = responses.get(timeout=30)
        closing.join(30)
    assert error is None and result.as_numpy("y").ravel().tolist() == [-2, 2, 4, 6]


def sent_and_left_open(server, path: str, body: bytes, content_type: str = "application/json") -> socket.socket:
    """A connection that has sent one HTTP request, to be closed by the test without reading its answer."""
    connection = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    connection.sendall(f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: {content_type}\r\n"
                       f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return connection


def v2_x(first: float, batched: bool) -> dict:
    data = [first, 1, 2, 3]
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4] if batched else [4], "data": data}]}


@pytest.mark.parametrize("name", ["queued", "direct"])
def test_an_http_request_whose_client_hangs_up_while_it_waits_never_runs(http_server, gates, name):
    """One instance, held at a gate by a first request: a second waits for it (in the dynamic batcher's
    queue, or for the instance), and its client closes the connection: it no longer counts as waiting, is
    let go of at once (counted as a failure while the first is still held), and never runs: once the gate
    opens, the first is answered, then a third, and the model has executed those two."""
    server, batched = http_server, name == "queued"
    gates[name].marker.unlink(missing_ok=True)
    before, failed = executions(server, name), failures(server, name)
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(server.request, "POST", f"/v2/models/{name}/infer", json=v2_x(-1, batched), timeout=60)
        gates[name].wait_entered()
        with sent_and_left_open(server, f"/v2/models/{name}/infer", json.dumps(v2_x(5, batched)).encode()):
            wait_for(lambda: queue_depth(server, name) == 1, 30, "the second request never waited for the instance")
        wait_for(lambda: queue_depth(server, name) == 0, 30, "the request whose client left is still counted as waiting")
        wait_for(lambda: failures(server, name) == failed + 1, 30, "the request whose client left still waits for the instance")
        gates[name].release()
        assert held.result(timeout=30).json()["outputs"][0]["data"] == [-2, 2, 4, 6]
    third = server.request("POST", f"/v2/models/{name}/infer", json=v2_x(7, batched), timeout=30)
    assert third.json()["outputs"][0]["data"] == [14, 2, 4, 6]
    assert executions(server, name) - before == 2  # the first and the third


def test_a_burst_of_clients_that_hang_up_costs_no_execution_and_leaves_nothing_behind(http_server, gates):
    """Twenty clients send a request each to a model whose one instance is held, and hang up (clients past
    their timeout, about to retry): none is counted as waiting once they are gone, none runs, and the model
    serves the held request and the next ones as before."""
    server, name = http_server, "queued"
    gates[name].marker.unlink(missing_ok=True)
    before = executions(server, name)
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(server.request, "POST", f"/v2/models/{name}/infer", json=v2_x(-1, True), timeout=60)
        gates[name].wait_entered()
        body = json.dumps(v2_x(5, True)).encode()
        leaving = [sent_and_left_open(server, f"/v2/models/{name}/infer", body) for _ in range(20)]
        wait_for(lambda: queue_depth(server, name) == 20, 30, "the twenty requests never waited for the instance")
        for connection in leaving:
            connection.close()
        wait_for(lambda: queue_depth(server, name) == 0, 30, "requests whose clients left are still counted as waiting")
        gates[name].release()
        assert held.result(timeout=30).json()["outputs"][0]["data"] == [-2, 2, 4, 6]
    for value in (7, 8):
        answer = server.request("POST", f"/v2/models/{name}/infer", json=v2_x(value, True), timeout=30)
        assert answer.json()["outputs"][0]["data"] == [2 * value, 2, 4, 6]
    assert executions(server, name) - before == 3


@pytest.mark.parametrize("quiet", [False, True], ids=["ticking", "quiet"])
def test_a_generate_stream_whose_client_hangs_up_stops_its_model(http_server, gate_dir, quiet):
    """`generate_stream` to a decoupled model: its client reads the first event and closes the connection.
    The model, sending from a thread of its own, sees `is_cancelled()` and stops, whether it goes on
    sending (a write fails) or sends nothing more (the connection's end is seen while the stream waits)."""
    marker = gate_dir / ("ticker.thread-quiet" if quiet else "ticker.thread")
    marker.unlink(missing_ok=True)
    document = {"x": [1, 1, 2, 3], "from": "thread", "quiet": quiet}
    with sent_and_left_open(http_server, "/v2/models/ticker/generate_stream", json.dumps(document).encode()) as connection:
        received = b""
        while b"data: " not in received:
            more = connection.recv(4096)
            assert more, f"the stream ended before its first event: {received!r}"
            received += more
    ended = json.loads(wait_for(lambda: marker.exists() and marker.read_text(), 20, "the model never saw the cancellation"))
    assert ended["cancelled"] and ended["sent"] < 3000


def test_an_invoke_whose_client_hangs_up_while_it_waits_for_the_worker_never_runs(http_server, gates, gate_dir):
    """A SageMaker handler model with one worker, held at a gate by a first invoke: a second waits for the
    worker and its client closes the connection (a SageMaker caller past its timeout). It no longer counts
    as waiting, and the handler never takes it: its log holds the first invoke and a third."""
    log = gate_dir / "echo.log"
    log.unlink(missing_ok=True)
    gates["handler"].marker.unlink(missing_ok=True)
    text = {"Content-Type": "text/plain"}
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(http_server.request, "POST", "/models/echo/invoke", data=b"hold", headers=text, timeout=60)
        gates["handler"].wait_entered()
        with sent_and_left_open(http_server, "/models/echo/invoke", b"gone", "text/plain"):
            wait_for(lambda: queue_depth(http_server, "echo") == 1, 30, "the second invoke never waited for the worker")
        wait_for(lambda: queue_depth(http_server, "echo") == 0, 30, "the invoke whose client left is still counted as waiting")
        gates["handler"].release()
        assert held.result(timeout=30).text == "hold"
    assert http_server.request("POST", "/models/echo/invoke", data=b"third", headers=text, timeout=30).text == "third"
    assert log.read_text().split() == ["hold", "third"]
