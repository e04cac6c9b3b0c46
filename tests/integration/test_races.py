"""Lifecycle races as the SageMaker platform produces them — reloads under memory pressure, requests
racing an unload, shutdown during a load. Model code waits on gates, so the order is certain."""

import contextlib
import json
import os
import signal
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.builders import (
    Gate,
    Scale,
    archive,
    ensemble,
    ensemble_step,
    fp32_model,
    gated_load,
    handler_model,
    python_model,
    sized_model,
    tensor,
    wait_for,
)
from tests.builders import (
    gates as make_gates,
)
from tests.conftest import Server
from tests.integration.test_observability import log_lines


@pytest.fixture(scope="module")
def gates(tmp_path_factory):
    return make_gates(tmp_path_factory.mktemp("gates"), "first", "load", "busy", "full")


def gated_first_predict(gate: Gate) -> str:
    """inference.py whose predict_fn waits at `gate` for an input of 0, and answers others at once."""
    return f"""
def predict_fn(data, model):
    if float(data.flatten()[0]) == 0:
        {gate.code()}
    return model(data)
"""


def test_a_reload_never_evicts_the_copy_it_replaces(start_server, tmp_path):
    sized_model(tmp_path, "big", 12)
    server = start_server(tmp_path, SERVE_MEMORY_LIMIT="20MiB")
    assert server.load("big").status_code == 200
    reload = server.request("POST", "/v2/repository/models/big/load")
    assert reload.status_code == 507 and "big" in reload.json()["error"]  # two copies do not fit
    assert server.loaded() == ["big"]
    assert server.invoke("big", [[1.0, 2.0, 3.0, 4.0]]).status_code == 200  # the old copy still serves


def test_a_reload_evicts_other_idle_models_when_it_must(start_server, tmp_path):
    sized_model(tmp_path, "big", 8)
    sized_model(tmp_path, "other", 8)
    server = start_server(tmp_path, SERVE_MEMORY_LIMIT="20MiB")
    assert server.load("big").status_code == 200 and server.load("other").status_code == 200
    assert server.request("POST", "/v2/repository/models/big/load").status_code == 200
    assert server.loaded() == ["big"]


def test_invocations_racing_an_unload_load_the_target_again(start_server, tmp_path, gates):
    handler_model(tmp_path, "target", gated_first_predict(gates["first"]), Scale())
    server = start_server(tmp_path)
    invocations = {"X-Amzn-SageMaker-Target-Model": "target"}
    with ThreadPoolExecutor(3) as pool:
        held = pool.submit(server.request, "POST", "/invocations", json=[[0.0]], headers=invocations)
        gates["first"].wait_entered()
        unloading = pool.submit(server.request, "DELETE", "/models/target")
        wait_for(lambda: server.request("GET", "/models/target").status_code == 404, message="unload did not start")
        racing = pool.submit(server.request, "POST", "/invocations", json=[[3.0]], headers=invocations)
        gates["first"].release()
        assert held.result().json() == [[0.0]]
        assert unloading.result().status_code == 200
        answer = racing.result()
    assert answer.status_code == 200 and answer.json() == [[6.0]]
    assert server.loaded() == ["target"]


def test_a_load_racing_an_unload_waits_for_it_instead_of_409(start_server, tmp_path, gates):
    handler_model(tmp_path, "busy", gated_first_predict(gates["busy"]), Scale())
    server = start_server(tmp_path)
    assert server.load("busy").status_code == 200
    with ThreadPoolExecutor(3) as pool:
        held = pool.submit(server.invoke, "busy", [[0.0]])
        gates["busy"].wait_entered()
        unloading = pool.submit(server.request, "DELETE", "/models/busy")
        wait_for(lambda: server.request("GET", "/models/busy").status_code == 404, message="unload did not start")
        loading = pool.submit(server.load, "busy")
        gates["busy"].release()
        assert held.result().status_code == 200 and unloading.result().status_code == 200
        assert loading.result().status_code == 200
    assert server.loaded() == ["busy"]
    assert server.invoke("busy", [[2.0]]).json() == [[4.0]]


def joined_a_load(server, name: str) -> bool:
    """Whether the server logged a request for `name` waiting for the load of it under way (at
    SERVE_LOG_LEVEL=info)."""
    return any(line["message"] == "waiting for the load under way" and line["model"] == name for line in log_lines(server))


@pytest.mark.parametrize("unload", [("POST", "/v2/repository/models/slow/unload"), ("DELETE", "/models/slow")],
                         ids=["v2", "sagemaker"])
def test_an_unload_sent_during_the_load_undoes_it_once_the_load_ends(start_server, tmp_path, unload):
    gate = Gate(tmp_path, "load")
    handler_model(tmp_path / "models", "slow", gated_load(gate), Scale())
    server = start_server(tmp_path / "models", SERVE_LOG_LEVEL="info")  # its log says when the unload waits
    with ThreadPoolExecutor(2) as pool:
        loading = pool.submit(server.load, "slow")
        gate.wait_entered()
        unloading = pool.submit(server.request, *unload)
        wait_for(lambda: joined_a_load(server, "slow") or unloading.done(), message="the unload never arrived")
        gate.release()
        assert loading.result().status_code == 200
        answer = unloading.result()
    assert answer.status_code == 200, answer.text
    assert server.loaded() == []
    assert server.invoke("slow", [[1.0]]).status_code == 404


def test_an_invocation_waiting_for_its_model_s_load_is_served_by_it_though_an_unload_came_first(start_server, tmp_path):
    """`/invocations` loads its target on first use. An unload is sent during that load, then a second
    invocation: both wait for it. The second is in flight from then on, so it is served by that load and
    the unload waits for it (it was handed nothing, and loaded the model again)."""
    gate = Gate(tmp_path, "load")
    handler_model(tmp_path / "models", "slow", gated_load(gate), Scale())
    server = start_server(tmp_path / "models", SERVE_LOG_LEVEL="info")

    def invoke() -> requests.Response:
        return server.request("POST", "/invocations", json=[[1.0]], headers={"X-Amzn-SageMaker-Target-Model": "slow"})
    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(invoke)
        gate.wait_entered()
        unloading = pool.submit(server.request, "DELETE", "/models/slow")
        wait_for(lambda: joined_a_load(server, "slow"), message="the unload did not wait for the load")
        second = pool.submit(invoke)
        wait_for(lambda: server.metrics()[("serve_cache_hits_total", ())] == 1, message="the second invocation never came")
        gate.release()
        assert first.result().json() == second.result().json() == [[2.0]]
        assert unloading.result().status_code == 200
    assert server.loaded() == [] and server.metrics()[("serve_model_loads_total", (("outcome", "success"),))] == 1


def test_the_repository_index_and_load_agree(start_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("index")
    archive(fp32_model(tmp_path_factory.mktemp("src"), "packed"), root / "packed.tar.gz")
    fp32_model(root, "plain")
    server = start_server(root, SERVE_LOAD_MODELS="packed")
    wait_for(lambda: server.loaded() == ["packed"], message="an archive named at start did not load")
    index = server.request("POST", "/v2/repository/index").json()
    assert [entry["name"] for entry in index] == ["packed", "plain"]
    for entry in index:
        assert server.request("POST", f"/v2/repository/models/{entry['name']}/load").status_code == 200
    assert server.request("POST", "/v2/repository/index", json={"ready": True}).json() == [
        {"name": "packed", "version": "1", "state": "READY"},
        {"name": "plain", "version": "1", "state": "READY"}]


def test_sigterm_to_every_process_during_a_load_tells_it_and_what_follows_to_retry(tmp_path, gates):
    """As systemd stops a service (SIGTERM to each of its processes). The load used to be waited for, and
    answered 200 by a server about to exit (test_lifecycle has why it is not)."""
    handler_model(tmp_path / "models", "slow", gated_load(gates["load"]), Scale())
    server = Server(tmp_path / "models")
    try:
        body = b'{"model_name": "slow", "url": "slow"}'
        load = (f"POST /models HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            sock.sendall(load + b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")  # the ping waits behind the load
            gates["load"].wait_entered()
            os.killpg(server.process.pid, signal.SIGTERM)
            answers = b""
            while chunk := sock.recv(65536):
                answers += chunk
        first, _, second = answers.partition(b"HTTP/1.1 ")[2].partition(b"HTTP/1.1 ")
        assert first.startswith(b"503") and b"stopping" in first and b"Retry-After: 1" in first, first
        # the front-end's words ("shutting down"), or, when the model process has ended first, that it has
        assert second.startswith(b"503") and b'"error"' in second and b"Retry-After: 1" in second, second
        assert server.process.wait(timeout=10) == 0
    finally:
        server.stop()


def test_sigterm_under_full_load_answers_every_request_in_flight(tmp_path, gates):
    handler_model(tmp_path / "models", "queued", gated_first_predict(gates["full"]), Scale())
    server = Server(tmp_path / "models")
    try:
        assert server.load("queued").status_code == 200
        with ThreadPoolExecutor(17) as pool:
            first = pool.submit(server.invoke, "queued", [[0.0]])
            gates["full"].wait_entered()
            queued = [pool.submit(server.invoke, "queued", [[float(k)]]) for k in range(1, 17)]
            wait_for(lambda: _queued(server) == 16, message="the requests did not all arrive")
            os.killpg(server.process.pid, signal.SIGTERM)
            gates["full"].release()
            assert first.result().json() == [[0.0]]
            assert [answer.result().json() for answer in queued] == [[[2.0 * k]] for k in range(1, 17)]
        assert server.process.wait(timeout=20) == 0
    finally:
        server.stop()


def _queued(server) -> int:
    """Requests waiting behind the one at the gate, from the server's own metrics."""
    for line in server.request("GET", "/metrics").text.splitlines():
        if line.startswith('serve_queue_depth{model="queued"}'):
            return int(float(line.split()[1]))
    return -1


# y = 2x, once `initialize` is through its gate
GATED_STEP_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        {gate}

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy() * 2)])
                for r in requests]
"""


NO_GATE = "no-gate"  # a config parameter: `step` loaded with it passes its gate without waiting
X, Y = tensor("x", "TYPE_FP32", [4]), tensor("y", "TYPE_FP32", [4])
STEP_CONFIG = {"max_batch_size": 0, "input": [X], "output": [Y]}


def gated_step(tmp_path) -> tuple[Path, Gate]:
    """A model root holding `step` (x → y = 2x, FP32 [4]), whose load waits at the gate it comes with
    unless its config has the parameter NO_GATE."""
    gate = Gate(tmp_path, "step")
    root = tmp_path / "models"
    python_model(root, "step", GATED_STEP_PY.replace("{gate}", f"if {NO_GATE!r} not in args['model_config']: {gate.code()}"),
                 STEP_CONFIG)
    return root, gate


def load_with_config(server, name: str) -> requests.Response:
    """A V2 load of `name` with STEP_CONFIG and the parameter NO_GATE, as an override."""
    config = {**STEP_CONFIG, "name": name, "backend": "python", "parameters": {NO_GATE: {"string_value": "yes"}}}
    return server.request("POST", f"/v2/repository/models/{name}/load", json={"parameters": {"config": json.dumps(config)}})


@contextlib.contextmanager
def joining(server, gate: Gate, first: str, then: str):
    """A V2 load of `first`, held at `gate`, and then one of `then`, once it has joined the load under way
    (it logs so as it starts to wait): the two answers to come, while the block runs, then the gate opens."""
    with ThreadPoolExecutor(2) as pool:
        held = pool.submit(server.request, "POST", f"/v2/repository/models/{first}/load")
        gate.wait_entered()
        joins = pool.submit(server.request, "POST", f"/v2/repository/models/{then}/load")
        wait_for(lambda: joined_a_load(server, first) or joins.done(), message=f"the load of {then} did not wait for the load under way")
        try:
            yield held, joins
        finally:
            gate.release()


def test_a_load_with_a_config_sent_while_the_first_load_runs_waits_for_it_then_applies(start_server, tmp_path):
    """Triton takes one load of a model at a time; this server answered the second 409 "still loading"."""
    root, gate = gated_step(tmp_path)
    server = start_server(root, SERVE_LOG_LEVEL="info")
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(server.request, "POST", "/v2/repository/models/step/load")
        gate.wait_entered()
        overriding = pool.submit(load_with_config, server, "step")
        wait_for(lambda: joined_a_load(server, "step") or overriding.done(), message="the second load never arrived")
        gate.release()
        assert first.result().status_code == 200
        answer = overriding.result()
    assert answer.status_code == 200, answer.text
    assert NO_GATE in server.request("GET", "/v2/models/step/config").json()["parameters"]


def test_a_load_sent_while_a_reload_runs_shares_it(start_server, tmp_path):
    root, gate = gated_step(tmp_path)
    server = start_server(root, SERVE_LOG_LEVEL="info")
    assert load_with_config(server, "step").status_code == 200  # loaded past its gate; a plain load reloads it
    with ThreadPoolExecutor(2) as pool:
        reloading = pool.submit(server.request, "POST", "/v2/repository/models/step/load")
        gate.wait_entered()
        again = pool.submit(server.request, "POST", "/v2/repository/models/step/load")
        wait_for(lambda: joined_a_load(server, "step") or again.done(), message="the second load never arrived")
        gate.release()
        assert reloading.result().status_code == 200
        answer = again.result()
    assert answer.status_code == 200, answer.text
    assert NO_GATE not in server.request("GET", "/v2/models/step/config").json().get("parameters", {})


def test_an_ensembles_load_shares_the_load_of_its_step_under_way(start_server, tmp_path):
    """A client loads a step and its ensemble at once: the ensemble's load waits for the step's and serves
    with it (it once failed, 400, as the step was "still loading"), and the step, which the ensemble did not
    load, stays when the ensemble is unloaded with its dependents."""
    root, gate = gated_step(tmp_path)
    ensemble(root, "pipeline", [X], [Y], [ensemble_step("step", {"x": "x"}, {"y": "y"})])
    server = start_server(root, SERVE_LOG_LEVEL="info")
    with joining(server, gate, "step", "pipeline") as (step, pipeline):
        assert not pipeline.done()
    assert step.result().status_code == 200 and pipeline.result().status_code == 200
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]}
    assert server.request("POST", "/v2/models/pipeline/infer", json=body).json()["outputs"][0]["data"] == [2, 4, 6, 8]
    unload = server.request("POST", "/v2/repository/models/pipeline/unload", json={"parameters": {"unload_dependents": True}})
    assert unload.status_code == 200 and server.request("GET", "/v2/models/step/ready").status_code == 200


def test_a_step_unloaded_while_its_ensemble_loads_is_loaded_again_by_the_ensembles_requests(start_server, tmp_path):
    """The ensemble's load has loaded its first step and waits for its second when a client unloads the
    first: the load still succeeds, checked against the step it loaded, and a request loads the step again
    (the check read the registry: a KeyError, answered as a 404 for the model the cleanup could not unload)."""
    root, gate = gated_step(tmp_path)
    python_model(root, "triple", GATED_STEP_PY.replace("{gate}", "pass").replace("* 2", "* 3"), STEP_CONFIG)
    ensemble(root, "pipeline", [X], [Y], [ensemble_step("triple", {"x": "x"}, {"y": "tripled"}),
                                          ensemble_step("step", {"x": "tripled"}, {"y": "y"})])
    server = start_server(root)
    with ThreadPoolExecutor(1) as pool:
        pipeline = pool.submit(server.request, "POST", "/v2/repository/models/pipeline/load")
        try:
            gate.wait_entered()
            assert server.request("POST", "/v2/repository/models/triple/unload").status_code == 200
        finally:
            gate.release()
        assert pipeline.result().status_code == 200, pipeline.result().text
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]}
    assert server.request("POST", "/v2/models/pipeline/infer", json=body).json()["outputs"][0]["data"] == [6, 12, 18, 24]


def test_an_ensemble_whose_steps_disagree_on_a_tensor_is_a_400_at_load_and_the_server_serves_on(start_server, tmp_path):
    """A model without batching feeding one with it: the load once succeeded, and every request then failed."""
    python_model(tmp_path, "plain", GATED_STEP_PY.replace("{gate}", "pass"), STEP_CONFIG)
    python_model(tmp_path, "batched", GATED_STEP_PY.replace("{gate}", "pass"), {"max_batch_size": 4, "input": [X], "output": [Y]})
    ensemble(tmp_path, "pipeline", [X], [Y], [ensemble_step("plain", {"x": "x"}, {"y": "mid"}),
                                              ensemble_step("batched", {"x": "mid"}, {"y": "y"})])
    server = start_server(tmp_path)
    answer = server.request("POST", "/v2/repository/models/pipeline/load")
    assert answer.status_code == 400
    assert answer.json()["error"].endswith("tensor 'mid' is FP32[4] as output 'y' of step 'plain' but FP32[-1, 4] as "
                                           "input 'x' of step 'batched'")
    assert server.load("batched").status_code == 200
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
    assert server.request("POST", "/v2/models/batched/infer", json=body).json()["outputs"][0]["data"] == [2, 4, 6, 8]


def test_two_v2_loads_of_a_model_at_once_share_one_load(start_server, tmp_path):
    """As Triton answers them: both succeed, with the one load (the second was refused, 409, while the
    first was under way). SageMaker's load of a name that is loading stays its contract's 409."""
    root, gate = gated_step(tmp_path)
    server = start_server(root, SERVE_LOG_LEVEL="info")
    with joining(server, gate, "step", "step") as (first, second):
        assert server.load("step").status_code == 409
    assert first.result().status_code == 200 and second.result().status_code == 200
    assert len([line for line in log_lines(server) if line["message"] == "loaded model" and line["model"] == "step"]) == 1


def test_ensembles_that_name_each_other_fail_their_loads_and_never_hang_them(start_server, tmp_path):
    """Each one's load would wait for the other's: refused with the reason, so the names stay free and the
    load path never stops (a load joining the one under way once hung here for ever)."""
    ensemble(tmp_path, "ex", [X], [Y], [ensemble_step("ey", {"x": "x"}, {"y": "y"})])
    ensemble(tmp_path, "ey", [X], [Y], [ensemble_step("ex", {"x": "x"}, {"y": "y"})])
    server = start_server(tmp_path)
    for name in ("ex", "ey"):
        answer = server.request("POST", f"/v2/repository/models/{name}/load", timeout=30)
        assert answer.status_code == 400 and "ensembles that name each other never load" in answer.json()["error"]
    assert server.loaded() == [] and server.load("ex").status_code == 400
