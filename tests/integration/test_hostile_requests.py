"""Requests made to hurt, against the default limits: one as large as the limit allows is served or
refused on its own while other clients' requests go on, and a refusal costs the server no memory."""

import json
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import psutil
import pytest
import requests
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from tests import grpc_clients
from tests.builders import Gate, Scale, fp32_model, python_model, sized_model, tensor, wait_for
from tests.integration.test_cancellation import QUEUED_PY
from tests.integration.test_observability import log_lines

NUMBERS = 3_145_628  # as many JSON numbers ("1,") as fit in SAGEMAKER_MAX_PAYLOAD_IN_MB's default 6 MiB
MIB = 1 << 20


def small(server) -> int:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]}
    return server.request("POST", "/v2/models/double/infer", json=body, timeout=30).status_code


@pytest.mark.parametrize("front_ends", ["0", "2"])
def test_a_request_as_large_as_the_limit_disturbs_no_other_client(start_server, tmp_path, front_ends):
    fp32_model(tmp_path / "models", "double", Scale(), dims=(-1,), max_batch_size=0)
    server = start_server(tmp_path / "models", SERVE_LOAD_MODELS="double", SERVE_HTTP_WORKERS=front_ends)
    wait_for(server.ready, 60, "the model did not load")
    body = ('{"inputs":[{"name":"x","datatype":"FP32","shape":[%d],"data":[%s]}]}'
            % (NUMBERS, ",".join(["1"] * NUMBERS))).encode()
    assert len(body) <= 6 * MIB
    done = threading.Event()

    def others() -> list[int]:
        codes = []
        while not done.is_set() or not codes:
            codes.append(small(server))
        return codes

    with ThreadPoolExecutor(4) as pool:
        streams = [pool.submit(others) for _ in range(3)]
        try:
            large = server.request("POST", "/v2/models/double/infer", data=body, timeout=120)
        finally:
            done.set()
        codes = [code for stream in streams for code in stream.result(timeout=120)]
    assert large.status_code == 200 or 400 <= large.status_code < 500, large.text[:300]
    if large.status_code == 200:
        output = large.json()["outputs"][0]
        assert output["shape"] == [NUMBERS] and output["data"][:2] == [2.0, 2.0]
    assert set(codes) == {200}


def server_rss(server) -> int:
    """The resident memory of the model process and every front-end, together."""
    pids = [server.worker_pid(), *server.http_pids()]
    return sum(psutil.Process(pid).memory_info().rss for pid in pids)


def refusals(server) -> dict[str, requests.Response]:
    long_name = "n" * 100_000
    huge_shape = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1 << 40], "data": [1, 2, 3, 4]}]}
    return {
        "a load's long name": server.request("POST", "/models", json={"model_name": long_name, "url": "double"}),
        "a long name in a URL": server.request("POST", f"/v2/repository/models/{long_name}/load"),
        "a body past the limit": server.request("POST", "/v2/models/double/infer", data=b"[" * (7 * MIB)),
        "a shape past any memory": server.request("POST", "/v2/models/double/infer", json=huge_shape),
        "nesting past the limit": server.request("POST", "/v2/models/double/infer", data=b"[" * 200_000 + b"]" * 200_000),
    }


@pytest.mark.parametrize("front_ends", ["0", "2"])
def test_a_refusal_costs_the_server_no_memory(start_server, tmp_path, front_ends):
    fp32_model(tmp_path / "models", "double", Scale(), dims=(-1,), max_batch_size=0)
    server = start_server(tmp_path / "models", SERVE_LOAD_MODELS="double", SERVE_HTTP_WORKERS=front_ends)
    wait_for(server.ready, 60, "the model did not load")
    refusals(server)  # once first, so that what a first request imports or caches is counted before
    before = server_rss(server)
    answers = refusals(server)
    after = server_rss(server)
    assert {why: (answer.status_code // 100, "error" in json.loads(answer.text)) for why, answer in answers.items()} == \
        {why: (4, True) for why in answers}
    assert after - before < 8 * MIB, f"{(after - before) / MIB:.1f} MiB more after the refusals"


def test_a_reload_under_pressure_frees_the_copy_it_replaces(start_server, tmp_path):
    for name, mib in [("a", 190), ("b", 190), ("c", 90)]:
        sized_model(tmp_path / "models", name, mib)
    server = start_server(tmp_path / "models", SERVE_MEMORY_LIMIT="512MiB", SERVE_HTTP_WORKERS="0")
    for name in "abc":
        assert server.request("POST", f"/v2/repository/models/{name}/load").status_code == 200
    before = psutil.Process(server.worker_pid()).memory_info().rss
    for _ in range(3):  # a, the least recently used, again: b, idle, makes room
        assert server.request("POST", "/v2/repository/models/a/load").status_code == 200
    after = psutil.Process(server.worker_pid()).memory_info().rss
    assert server.loaded() == ["a", "c"]
    assert after - before < 8 * MIB, f"{(after - before) / MIB:.1f} MiB more after three reloads"


BODY_VALUES = 100_000  # FP32: 400 KB a request to `held`; two do not fit in one front-end process's share below


def values_for(model: str, first: float) -> np.ndarray:
    return np.full(BODY_VALUES if model == "held" else 4, first, np.float32)


def binary_infer(server, model: str, first: float, deadline: float = 60) -> tuple[int, str, list]:
    """A V2 binary request over HTTP: its status, error and first outputs."""
    values = values_for(model, first)
    document = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": list(values.shape),
                                       "parameters": {"binary_data_size": values.nbytes}}],
                           "outputs": [{"name": "y", "parameters": {"binary_data": False}}]}).encode()
    answer = server.request("POST", f"/v2/models/{model}/infer", data=document + values.tobytes(),
                            headers={"Inference-Header-Content-Length": str(len(document))}, timeout=deadline)
    if answer.status_code != 200:
        assert answer.headers["Retry-After"]
        return answer.status_code, answer.json()["error"], []
    return 200, "", answer.json()["outputs"][0]["data"][:2]


def grpc_infer(server, model: str, first: float, deadline: float = 60) -> tuple[int, str, list]:
    """The same over gRPC: UNAVAILABLE read as 503."""
    values = values_for(model, first)
    tensor_in = triton_grpc.InferInput("x", list(values.shape), "FP32")
    tensor_in.set_data_from_numpy(values)
    with grpc_clients.InferenceServerClient(server.grpc_url) as client:
        try:
            return 200, "", client.infer(model, [tensor_in], client_timeout=deadline).as_numpy("y")[:2].tolist()
        except InferenceServerException as exc:
            return {"StatusCode.UNAVAILABLE": 503}.get(exc.status(), 500), exc.message(), []


@pytest.mark.parametrize("front_ends, call", [("0", binary_infer), ("1", binary_infer), ("1", grpc_infer)],
                         ids=["http-alone", "http-front-end", "grpc"])
def test_requests_past_the_processes_share_wait_and_one_that_finds_no_room_is_refused(start_server, tmp_path, front_ends, call):
    """SERVE_MAX_BODIES_SIZE: a request counts from its arrival until its answer is made. With one large
    request held in the model, a second does not fit in the front-end process's share: it waits, and is
    refused once SAGEMAKER_MODEL_SERVER_TIMEOUT (5 s) has passed, never having reached the model; small ones
    (an inference, a health check) are answered at once meanwhile, not behind it; and once the first is
    answered, there is room again."""
    gate = Gate(tmp_path, "held")
    python_model(tmp_path / "models", "held", QUEUED_PY.replace("{gate}", gate.code()),
                 {"max_batch_size": 0, "input": [tensor("x", "TYPE_FP32", [-1])], "output": [tensor("y", "TYPE_FP32", [-1])]})
    fp32_model(tmp_path / "models", "double", Scale(), dims=(-1,), max_batch_size=0)
    # a share of 600 KiB in each of the two front-end processes (HTTP, or the model process serving it, and gRPC)
    server = start_server(tmp_path / "models", SERVE_LOAD_MODELS="held,double", SERVE_HTTP_WORKERS=front_ends,
                          SERVE_MAX_BODIES_SIZE="1200KiB", SAGEMAKER_MODEL_SERVER_TIMEOUT="5",
                          SERVE_LOG_LEVEL="info")  # its log says when a request waits for room
    wait_for(lambda: server.ready() and (call is not grpc_infer or server.grpc_ready()), 60,
             "the models did not load, or gRPC did not listen")
    with ThreadPoolExecutor(2) as pool:
        held = pool.submit(call, server, "held", -1.0)  # y = 2x, once through the gate
        try:
            gate.wait_entered()
            assert call(server, "double", 1.0) == (200, "", [2.0, 2.0])  # a small request fits beside the held one
            waiting = pool.submit(call, server, "held", 1.0)
            wait_for(lambda: any(line["message"] == "request waits for room" for line in log_lines(server)), 30,
                     "the second large request did not wait for room")
            # with one line, these waited behind it, until it was refused (5 s), past their deadlines
            assert call(server, "double", 3.0, deadline=2) == (200, "", [6.0, 6.0])
            assert server.request("GET", "/ping", timeout=2).status_code == 200
            status, error, _ = waiting.result()
        finally:
            gate.release()
        assert held.result() == (200, "", [-2.0, -2.0])
    assert status == 503 and "SERVE_MAX_BODIES_SIZE" in error, error
    statistics = server.request("GET", "/v2/models/held/stats").json()["model_stats"][0]["inference_stats"]
    assert statistics["success"]["count"] + statistics["fail"]["count"] == 1  # the refused request never reached it
    assert call(server, "held", 2.0) == (200, "", [4.0, 4.0])


def test_clients_trickling_large_bodies_hold_no_room_from_the_others(start_server, tmp_path):
    """The attack that counting a body from its head allowed: heads of bodies that fill the share, then their
    bytes as slowly as SERVE_MIN_BODY_RATE lets. A body counts once it has arrived, so a whole request of
    the same size is served at once beside them, by the same front-end."""
    fp32_model(tmp_path / "models", "double", Scale(), dims=(-1,), max_batch_size=0)
    server = start_server(tmp_path / "models", SERVE_LOAD_MODELS="double", SERVE_HTTP_WORKERS="1",
                          SERVE_MAX_BODIES_SIZE="1200KiB", SAGEMAKER_MODEL_SERVER_TIMEOUT="5")  # 600 KiB a process
    wait_for(server.ready, 60, "the model did not load")
    head = (f"POST /v2/models/double/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {BODY_VALUES * 4}\r\n\r\n").encode()
    tricklers = [socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(3)]
    try:
        for trickler in tricklers:
            trickler.sendall(head + b'{"inputs": [')  # and no more for now: well within the rate's grace
        values = np.arange(BODY_VALUES, dtype=np.float32)
        tensor_in = triton_http.InferInput("x", [BODY_VALUES], "FP32")
        tensor_in.set_data_from_numpy(values, binary_data=True)
        with triton_http.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=30) as client:
            answer = client.infer("double", [tensor_in], timeout=30)
        assert np.array_equal(answer.as_numpy("y"), values * 2)
        assert server.request("GET", "/ping", timeout=2).status_code == 200
    finally:
        for trickler in tricklers:
            trickler.close()
