"""HTTP front-end processes over the one model process, with real processes and real signals: what one
process holds (statistics, shared memory regions, sequences, batches) is one across front-ends; a dead
front-end is replaced and loses no model; a dead or stuck model process makes the front-ends answer 503
with Retry-After, and `/ping` unhealthy within SageMaker's 2 s, until it is back."""

import gzip
import json
import os
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPConnection
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.utils.shared_memory as shm

from container import resources
from tests.builders import Gate, Scale, fp32_model, gated_predict, handler_model, tensor, triton_model, wait_for
from tests.integration.test_scheduling import SEQUENCE, Accumulate, Affine

X = [1.0, 2.0, 3.0, 4.0]


def _models(root):
    fp32_model(root, "double", Scale())
    triton_model(root, "accumulate", Accumulate(), [tensor("INPUT", "TYPE_FP32", [1])],
                 [tensor("OUTPUT", "TYPE_FP32", [1]), tensor("CONTROLS", "TYPE_FP32", [4])], max_batch_size=4,
                 sequence_batching={**SEQUENCE, "max_sequence_idle_microseconds": 60_000_000})
    # a queue delay no request may wait out: a batch that does not form fails on the clients' deadline
    triton_model(root, "pairs", Affine(), [tensor("x", "TYPE_FP32", [3])], [tensor("y", "TYPE_FP32", [3])], max_batch_size=8,
                 dynamic_batching={"preferred_batch_size": [2], "max_queue_delay_microseconds": 600_000_000})


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    _models(root)
    server = start_server(root, SERVE_LOAD_MODELS="double,accumulate,pairs", SERVE_ALLOW_CLIENT_SHM="true",
                          SERVE_HTTP_WORKERS="2")
    wait_for(server.ready, 60, "the models did not load")
    wait_for(lambda: len(server.http_pids()) == 2, 30, "the front-ends did not start")
    return server


class Connection:
    """One keep-alive connection, and the front-end process that accepted it."""

    def __init__(self, server):
        self.http = HTTPConnection("127.0.0.1", server.port, timeout=30)
        self.http.connect()
        port = self.http.sock.getsockname()[1]
        self.front_end = wait_for(lambda: _accepted_by(server, port), 10, "no front-end accepted the connection")

    def request(self, method: str, path: str, document=None) -> tuple[int, dict, dict]:
        body = json.dumps(document).encode() if document is not None else None
        self.http.request(method, path, body, {"Content-Type": "application/json"} if body else {})
        answer = self.http.getresponse()
        data = answer.read()
        return answer.status, dict(answer.getheaders()), json.loads(data) if data else {}

    def infer(self, model: str, document: dict) -> dict:
        status, _, answer = self.request("POST", f"/v2/models/{model}/infer", document)
        assert status == 200, answer
        return answer

    def close(self) -> None:
        self.http.close()


def _accepted_by(server, port: int) -> int | None:
    for pid in server.http_pids():
        try:
            connections = psutil.Process(pid).connections("tcp")
        except psutil.NoSuchProcess:
            continue
        if any(c.raddr and c.raddr.port == port and c.laddr.port == server.port for c in connections):
            return pid
    return None


@pytest.fixture
def pair(server):
    """Two connections, each on a different front-end (connections are accepted by whichever front-end
    takes them first: open them until both front-ends hold one)."""
    found: dict[int, Connection] = {}
    spare = []
    deadline = time.monotonic() + 30
    while len(found) < 2:
        assert time.monotonic() < deadline, "every connection went to one front-end"
        connection = Connection(server)
        if connection.front_end in found:
            spare.append(connection)
        else:
            found[connection.front_end] = connection
    for connection in spare:
        connection.close()
    yield list(found.values())
    for connection in found.values():
        connection.close()


def _fp32(name: str, values, shape) -> dict:
    return {"name": name, "datatype": "FP32", "shape": shape, "data": values}


def test_the_default_is_one_front_end_per_core_and_none_on_one(start_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("default")
    fp32_model(root, "double", Scale())
    server = start_server(root, SERVE_LOAD_MODELS="double", SERVE_HTTP_WORKERS=None)  # None: unset, whatever the suite's
    wait_for(server.ready, 60, "the model did not load")  # until then it answers 503, still loading at start
    cores = min(resources.cpu_quota(), 16)
    wait_for(lambda: len(server.http_pids()) == (cores if cores > 1 else 0), 30, "not one front-end per core")
    assert server.request("POST", "/v2/models/double/infer", json={"inputs": [_fp32("x", X, [1, 4])]}).json()["outputs"][0]["data"] \
        == [2 * x for x in X]


def test_statistics_and_metrics_add_up_across_front_ends(server, pair):
    before = server.request("GET", "/v2/models/double/stats").json()["model_stats"][0]["inference_count"]
    metric = ("nv_inference_count_total", (("model", "double"), ("version", "1")))
    metric_before = server.metrics()[metric]
    for count, connection in zip((3, 5), pair, strict=True):
        for _ in range(count):
            assert connection.infer("double", {"inputs": [_fp32("x", X, [1, 4])]})["outputs"][0]["data"] == [2 * x for x in X]
    for connection in pair:  # either front-end reads the one set of figures
        stats = connection.request("GET", "/v2/models/double/stats")[2]["model_stats"][0]
        assert stats["inference_count"] - before == 8
    assert server.metrics()[metric] - metric_before == 8


def test_a_region_registered_through_one_front_end_serves_through_another(server, pair):
    first, second = pair
    key = f"/test_frontends_{server.port}"
    handle = shm.create_shared_memory_region("values", key, 16)
    try:
        shm.set_shared_memory_region(handle, [np.array(X, np.float32)])
        status, _, answer = first.request("POST", "/v2/systemsharedmemory/region/values/register",
                                          {"key": key, "offset": 0, "byte_size": 16})
        assert status == 200, answer
        assert [r["name"] for r in second.request("GET", "/v2/systemsharedmemory/status")[2]] == ["values"]
        tensor_in = {"name": "x", "datatype": "FP32", "shape": [1, 4],
                     "parameters": {"shared_memory_region": "values", "shared_memory_byte_size": 16}}
        assert second.infer("double", {"inputs": [tensor_in]})["outputs"][0]["data"] == [2 * x for x in X]
        assert second.request("POST", "/v2/systemsharedmemory/region/values/unregister")[0] == 200
        assert first.request("GET", "/v2/systemsharedmemory/status")[2] == []
    finally:
        shm.destroy_shared_memory_region(handle)


def test_a_sequence_keeps_its_order_whichever_front_end_its_requests_arrive_on(server, pair):
    totals = []
    for step, value in enumerate([1.0, 2.0, 3.0, 4.0]):
        parameters = {"sequence_id": 4242, "sequence_start": step == 0, "sequence_end": step == 3}
        answer = pair[step % 2].infer("accumulate", {"parameters": parameters, "inputs": [_fp32("INPUT", [value], [1, 1])]})
        totals.append(next(o for o in answer["outputs"] if o["name"] == "OUTPUT")["data"][0])
    assert totals == [1.0, 3.0, 6.0, 10.0]


def test_a_dynamic_batch_forms_across_front_ends(server, pair):
    """A batcher waits for a client it answered within its queue delay, on a connection still open, to
    form a batch. The model process knows each front-end's connections as clients of their own: once A
    (on one front-end) has had two answers, B's request (on the other) waits for A's next one, however
    long the machine takes; so B is answered only in a batch of 2 with one of A's, which A sends until
    then. A client whose identity were lost on the way would never be expected back: B would run alone."""

    def sizes() -> dict[int, int]:
        stats = server.request("GET", "/v2/models/pairs/stats").json()["model_stats"][0]
        return {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}

    def infer(connection: Connection, index: int, step: int) -> list[float]:
        document = {"inputs": [_fp32("x", [float(index), 0.0, float(step)], [1, 3])]}
        return connection.infer("pairs", document)["outputs"][0]["data"]

    a, b = pair
    before = sizes()
    # alone: nobody is expected back yet, and A is once its second answer shows it keeps its connection
    assert [infer(a, 1, step) for step in (0, 1)] == [[3.0, 1.0, 1.0], [3.0, 1.0, 3.0]]
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(infer, b, 2, 0)
        deadline, step = time.monotonic() + 60, 1
        while not waiting.done():  # A's requests, alone until B's has arrived, then one with it
            assert time.monotonic() < deadline, "B's request was never answered"
            step += 1
            assert infer(a, 1, step) == [3.0, 1.0, 2.0 * step + 1]
        assert waiting.result() == [5.0, 1.0, 1.0]
    assert sizes().get(2, 0) - before.get(2, 0) == 1


def test_a_front_end_that_dies_is_replaced_and_no_model_is_lost(server):
    worker = server.worker_pid()
    victim = server.http_pids()[0]
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: len(server.http_pids()) == 2 and victim not in server.http_pids(), 30, "the front-end was not replaced")
    assert server.worker_pid() == worker
    assert {m["name"] for m in server.request("POST", "/v2/repository/index", json={"ready": True}).json()} \
        >= {"double", "accumulate", "pairs"}
    for _ in range(4):  # fresh connections, on whichever front-end takes them
        connection = Connection(server)
        assert connection.infer("double", {"inputs": [_fp32("x", X, [1, 4])]})["outputs"][0]["data"] == [2 * x for x in X]
        connection.close()


def oom_score_adj(pid: int) -> int:
    return int(Path(f"/proc/{pid}/oom_score_adj").read_text())


def test_when_memory_runs_out_the_kernel_takes_a_front_end_before_the_model_process(server):
    """The highest oom_score_adj on every front-end, also on one started again, and the model process left as
    the server was started: losing a front-end loses its requests under way, the model process every model."""
    victim = server.http_pids()[0]
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: len(server.http_pids()) == len(server.grpc_pids()) == 2 and victim not in server.http_pids(), 30,
             "the front-ends were not all running")
    # the master marks a front-end right after spawning it (posix_spawn runs no code in the child before its exec)
    wait_for(lambda: {oom_score_adj(pid) for pid in [*server.http_pids(), *server.grpc_pids()]} == {1000}, 30,
             "a front-end was not marked to be killed first")
    assert oom_score_adj(server.worker_pid()) == oom_score_adj(server.process.pid) == oom_score_adj(os.getpid())


@pytest.fixture
def own_server(start_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("own")
    fp32_model(root, "double", Scale())
    server = start_server(root, SERVE_LOAD_MODELS="double", SERVE_HTTP_WORKERS="2")
    wait_for(server.ready, 60, "the model did not load")
    return server


def test_while_the_model_process_is_away_every_front_end_answers_503_with_retry_after(own_server):
    server = own_server
    worker = server.worker_pid()
    os.kill(worker, signal.SIGKILL)

    def refused():
        answer = server.request("GET", "/ping", timeout=5)
        return [answer] if answer.status_code == 503 else None  # a list: a 503 Response is falsy

    (answer,) = wait_for(refused, 30, "/ping stayed healthy without a model process")
    assert answer.headers["Retry-After"] and "model process" in answer.json()["error"]
    answer = server.request("POST", "/v2/models/double/infer", json={"inputs": [_fp32("x", X, [1, 4])]})
    assert answer.status_code in (200, 503)  # 200 only once gunicorn's new worker has loaded the model again
    wait_for(server.ready, 60, "the model process did not come back")
    assert server.worker_pid() != worker

    def every_front_end_serves() -> bool:
        """Each front-end reconnects on its own (every 0.2 s) and answers 503 until then, so a healthy /ping
        from one says nothing of the other: eight answers in a row, over new connections, must be right."""
        for _ in range(8):
            answer = server.request("POST", "/v2/models/double/infer", json={"inputs": [_fp32("x", X, [1, 4])]})
            assert answer.status_code in (200, 503), answer.text
            if answer.status_code == 503:
                return False
            assert answer.json()["outputs"][0]["data"] == [2 * x for x in X]
        return True

    wait_for(every_front_end_serves, 30, "a front-end did not reconnect to the new model process")


def test_a_stuck_model_process_makes_ping_unhealthy_within_two_seconds(own_server):
    server = own_server
    worker = server.worker_pid()
    os.kill(worker, signal.SIGSTOP)
    try:
        started = time.monotonic()
        answer = server.request("GET", "/ping", timeout=10)
        waited = time.monotonic() - started
    finally:
        os.kill(worker, signal.SIGCONT)
    assert answer.status_code == 503 and "did not answer" in answer.json()["error"]
    assert waited < 2.0  # SageMaker's limit for /ping: a guarantee, not a speed figure
    wait_for(lambda: server.request("GET", "/ping").status_code == 200, 30, "the model process did not recover")
    assert server.worker_pid() == worker


def test_sigterm_to_the_master_drains_every_front_end_before_the_model_process(start_server, tmp_path_factory):
    """As `docker stop` sends it: to the master alone. A request in flight is answered; every process exits."""
    gate = Gate(tmp_path_factory.mktemp("gate"), "predict")
    root = tmp_path_factory.mktemp("drain")
    handler_model(root, "gated", gated_predict(gate), Scale())
    server = start_server(root, SERVE_HTTP_WORKERS="2")
    assert server.load("gated").status_code == 200
    processes = [*server.http_pids(), server.worker_pid()]
    assert len(processes) == 3
    with ThreadPoolExecutor(1) as pool:
        in_flight = pool.submit(server.invoke, "gated", [[4.0]])
        gate.wait_entered()
        os.kill(server.process.pid, signal.SIGTERM)
        gate.release()
        assert in_flight.result().json() == [[8.0]]
    assert server.process.wait(timeout=40) == 0
    for pid in processes:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, pid


def test_access_log_lines_and_answers_are_those_of_one_process(start_server, tmp_path_factory):
    """The same requests, answered by the model process, by a front-end with the model process's
    inference (V2: JSON, binary, raw binary, compressed, and each kind of refusal in its order), and
    refused by a front-end itself (a body past the limit, a malformed request), give the same answers and
    the same access-log lines with front-ends as without."""
    root = tmp_path_factory.mktemp("logged")
    fp32_model(root, "double", Scale())
    document = b'{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}'
    values = np.array([[1, 2, 3, 4]], np.float32).tobytes()
    predict = b'{"instances": [[1, 2, 3, 4]]}'
    binary = b'{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","parameters":{"binary_data_size":16}}],' \
             b'"parameters":{"binary_data_output":true}}'
    requests = [
        ("POST", "/v2/models/double/infer", {}, document),
        ("GET", "/v2/models/nobody/ready", {}, None),
        ("POST", "/invocations", {"X-Amzn-SageMaker-Target-Model": "double", "Content-Length": "99999999"}, None),
        ("GET", "/v1/models/nobody/metadata/extra", {}, None),
        ("POST", "/v2/models/double/infer", {"Inference-Header-Content-Length": str(len(binary))}, binary + values),
        ("POST", "/v2/models/double/versions/1/infer", {"Inference-Header-Content-Length": "0"}, values),
        ("POST", "/v2/models/double/infer", {"Content-Encoding": "gzip", "Accept-Encoding": "gzip"}, gzip.compress(document, mtime=0)),
        ("POST", "/v2/models/nobody/infer", {}, b"{not json"),  # the model's absence first, as in one process
        ("POST", "/v2/models/double/infer", {}, b"{not json"),
        ("POST", "/v2/models/double/versions/7/infer", {}, document),
        ("POST", "/v2/models/double/infer", {}, document.replace(b'"x"', b'"z"')),
        ("POST", "/v2/models/double/infer", {"Inference-Header-Content-Length": "999"}, document),
        ("GET", "/v2/models/double/infer", {}, None),
        ("POST", "/v1/models/double:predict", {}, predict),  # TF Serving's inferences, served by a front-end too
        ("POST", "/v1/models/double/versions/7:predict", {}, predict),
        ("POST", "/v1/models/double/labels/stable:predict", {}, predict),
        ("POST", "/v1/models/nobody:predict", {}, b"{not json"),
        ("POST", "/v1/models/double:regress", {}, b'{"examples": [{"x": [1, 2, 3, 4]}]}'),
        ("POST", "/v1/models/double/labels/stable:classify", {}, b'{"examples": [{"x": [1, 2, 3, 4]}]}'),
        ("POST", "/v1/models/double/versions/1:classify", {}, b'{"examples": [{"x": [1, 2, 3, 4]}]}'),
        ("POST", "/v2/models/double/infer", {}, document),  # after every refusal, the server still serves
    ]
    raw = [_raw(method, path, {"X-Request-Id": f"given-{i}", **headers}, body)
           for i, (method, path, headers, body) in enumerate(requests, 1)] + [b"BREW /ping HTTP/1.1\r\nHost: x\r\n\r\n"]
    seen = {workers: _answers_and_log_lines(start_server(root, SERVE_LOAD_MODELS="double", SERVE_HTTP_WORKERS=workers,
                                                        SERVE_LOG_LEVEL="info"), raw, len(requests)) for workers in ("2", "0")}
    assert seen["2"] == seen["0"]
    answers = seen["0"][0]
    assert [int(status.split()[1]) for status, _, _ in answers] == [200, 404, 413, 400, 200, 200, 200, 404, 400, 404, 400, 400,
                                                                   405, 200, 404, 400, 404, 400, 400, 200, 200, 400]
    assert gzip.decompress(answers[6][2]) == answers[0][2] == answers[20][2]
    assert json.loads(answers[13][2]) == {"predictions": [[2.0, 4.0, 6.0, 8.0]]}
    assert json.loads(answers[19][2]) == {"results": [[["", 2.0], ["", 4.0], ["", 6.0], ["", 8.0]]]}


def _raw(method: str, path: str, headers: dict, body: bytes | None) -> bytes:
    if body is not None:
        headers = {**headers, "Content-Length": str(len(body))}
    head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    return f"{method} {path} HTTP/1.1\r\nHost: x\r\n{head}\r\n".encode() + (body or b"")


def _answers_and_log_lines(server, raw: list[bytes], logged: int) -> tuple[list, list]:
    wait_for(lambda: server.request("GET", "/v2/models/double/ready").status_code == 200, 60, "the model did not load")
    answers = []
    for request in raw:
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            sock.sendall(request)
            answers.append(_whole_answer(sock, request))
    wait_for(lambda: len(_access_lines(server, "given-")) == logged, 10, "the access log lines did not come")
    return answers, _access_lines(server, "given-")


def _whole_answer(sock, request: bytes) -> tuple[str, dict, bytes]:
    """The status line, the headers that do not vary by run, and the body of one answer to `request`."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += _received(sock, request)
    head, body = data.split(b"\r\n\r\n", 1)
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    while len(body) < int(headers.get("content-length", 0)):
        body += _received(sock, request)
    varying = {"date", "x-request-id"} if not headers.get("x-request-id", "").startswith("given-") else {"date"}
    return status, {k: v for k, v in headers.items() if k not in varying}, body


def _received(sock, request: bytes) -> bytes:
    chunk = sock.recv(65536)
    assert chunk, f"the server closed the connection before it answered {request[:200]!r}"
    return chunk


def _access_lines(server, prefix: str) -> list[dict]:
    """The access-log lines of requests whose id starts with `prefix`, by id (processes write their own
    lines in their own time), less what varies by run."""
    lines = [json.loads(line) for line in server.log.read_text().splitlines() if '"message":"request"' in line]
    return sorted(({k: v for k, v in line.items() if k not in ("time", "duration_ms")} for line in lines
                   if line["request_id"].startswith(prefix)), key=lambda line: line["request_id"])
