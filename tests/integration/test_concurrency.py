"""Concurrency in the contract: /ping during slow loads and long inferences, unload during in-flight
requests, concurrent first use through /invocations. Model code waits on gates, so order is certain."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.builders import (
    Scale,
    fp32_model,
    gated_load,
    gated_predict,
    handler_model,
    wait_for,
)
from tests.builders import (
    gates as make_gates,
)


@pytest.fixture(scope="module")
def gates(tmp_path_factory):
    return make_gates(tmp_path_factory.mktemp("gates"), "load", "predict", "unload", "target")


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory, gates):
    root = tmp_path_factory.mktemp("models")
    handler_model(root, "slowload", gated_load(gates["load"]), Scale())
    handler_model(root, "slowpredict", gated_predict(gates["predict"]), Scale())
    handler_model(root, "inflight", gated_predict(gates["unload"]), Scale())
    handler_model(root, "target", gated_load(gates["target"]), Scale())
    fp32_model(root, "fast")
    return start_server(root)


def pings(server) -> bool:
    """/ping answers within its deadline: the event loop is free (a blocked hub would not answer)."""
    return server.request("GET", "/ping", timeout=5).status_code == 200


def test_ping_and_other_models_answer_during_a_slow_load(server, gates):
    with ThreadPoolExecutor(2) as pool:
        loading = pool.submit(server.load, "slowload")
        gates["load"].wait_entered()
        assert pings(server)
        assert server.load("fast").status_code == 200
        assert server.invoke("fast", [[1, 2, 3, 4]]).status_code == 200
        assert "slowload" not in server.loaded()
        duplicate = server.load("slowload")
        assert duplicate.status_code == 409  # and is not told to unload what has not loaded, as it once was
        assert duplicate.json() == {"error": "model 'slowload' is still loading; its load answers once it is done"}
        assert server.request("GET", "/models/slowload").status_code == 404
        assert server.invoke("slowload", [[1.0]]).status_code == 404  # SageMaker's contract: not loaded is 404
        retry = server.request("POST", "/v2/models/slowload/infer", json={"inputs": []})  # V2: soon, so 503
        assert retry.status_code == 503 and retry.json()["error"] == "model 'slowload' is still loading"
        assert not loading.done()
        gates["load"].release()
        assert loading.result().status_code == 200
    assert server.invoke("slowload", [[1.0, 2.0]]).json() == [[2.0, 4.0]]


def test_ping_answers_during_a_long_inference(server, gates):
    assert server.load("slowpredict").status_code == 200
    with ThreadPoolExecutor(1) as pool:
        inference = pool.submit(server.invoke, "slowpredict", [[1.0]])
        gates["predict"].wait_entered()
        assert pings(server)
        assert server.invoke("fast", [[1, 2, 3, 4]]).status_code == 200
        gates["predict"].release()
        assert inference.result().json() == [[2.0]]


def test_unload_waits_for_requests_in_flight_then_refuses_new_ones(server, gates):
    assert server.load("inflight").status_code == 200
    with ThreadPoolExecutor(2) as pool:
        inference = pool.submit(server.invoke, "inflight", [[3.0]])
        gates["unload"].wait_entered()
        unloading = pool.submit(server.request, "DELETE", "/models/inflight")
        wait_for(lambda: server.request("GET", "/models/inflight").status_code == 404, message="DELETE never began")
        late = server.invoke("inflight", [[1.0]])
        assert late.status_code == 404  # refused while the unload waits
        assert not unloading.done() and not inference.done()
        gates["unload"].release()
        assert inference.result().json() == [[6.0]]  # the in-flight request finished normally
        assert unloading.result().status_code == 200
    assert "inflight" not in server.loaded()


def test_concurrent_first_use_through_invocations_loads_once(server, gates):
    headers = {"X-Amzn-SageMaker-Target-Model": "target", "Content-Type": "application/json"}

    def invoke(_):
        return server.request("POST", "/invocations", data=b"[[1.0]]", headers=headers)

    with ThreadPoolExecutor(6) as pool:
        answers = [pool.submit(invoke, i) for i in range(6)]
        gates["target"].wait_entered()
        gates["target"].release()
        assert [a.result().json() for a in answers] == [[[2.0]]] * 6
    assert server.loaded().count("target") == 1
