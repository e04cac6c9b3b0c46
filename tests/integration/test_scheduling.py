"""Scheduling on a real server: batched results reach the right requests under concurrency, a burst
of clients forms batches while a lone client never waits, and stateful sequences keep their state per
sequence_id."""

import random
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
import torch
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from tests import grpc_clients
from tests.builders import ensemble, ensemble_step, tensor, triton_model, wait_for


class Affine(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1


class Accumulate(torch.nn.Module):
    """OUTPUT = running sum of INPUT within a sequence; CONTROLS shows what the server sent."""

    def forward(self, INPUT: torch.Tensor, START: torch.Tensor, END: torch.Tensor, READY: torch.Tensor,
                CORRID: torch.Tensor, STATE_IN: torch.Tensor):
        total = STATE_IN + INPUT
        controls = torch.cat([START.float(), END.float(), READY.float(), CORRID.float()], dim=1)
        return total, controls, total


SEQUENCE = {
    "max_sequence_idle_microseconds": 300000,
    "control_input": [
        {"name": "START", "control": [{"kind": "CONTROL_SEQUENCE_START", "int32_false_true": [0, 1]}]},
        {"name": "END", "control": [{"kind": "CONTROL_SEQUENCE_END", "fp32_false_true": [0, 1]}]},
        {"name": "READY", "control": [{"kind": "CONTROL_SEQUENCE_READY", "bool_false_true": [False, True]}]},
        {"name": "CORRID", "control": [{"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_UINT64"}]},
    ],
    "state": [{"input_name": "STATE_IN", "output_name": "STATE_OUT", "data_type": "TYPE_FP32", "dims": [1],
               "initial_state": [{"data_type": "TYPE_FP32", "dims": [1], "zero_data": True, "name": "zeros"}]}],
}


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    triton_model(root, "batched", Affine(), [tensor("x", "TYPE_FP32", [3])], [tensor("y", "TYPE_FP32", [3])], max_batch_size=8,
                 dynamic_batching={"preferred_batch_size": [4, 8], "priority_levels": 2, "default_priority_level": 2},
                 instance_group=[{"count": 2, "kind": "KIND_CPU"}])
    # a queue delay no request of these tests may wait out: a wrong wait fails on the clients' deadline
    triton_model(root, "burst", Affine(), [tensor("x", "TYPE_FP32", [3])], [tensor("y", "TYPE_FP32", [3])], max_batch_size=8,
                 dynamic_batching={"preferred_batch_size": [8], "max_queue_delay_microseconds": 600_000_000})
    triton_model(root, "accumulate", Accumulate(), [tensor("INPUT", "TYPE_FP32", [1])],
                 [tensor("OUTPUT", "TYPE_FP32", [1]), tensor("CONTROLS", "TYPE_FP32", [4])], max_batch_size=4,
                 sequence_batching=SEQUENCE)
    ensemble(root, "accumulating", [tensor("VALUE", "TYPE_FP32", [1])], [tensor("TOTAL", "TYPE_FP32", [1])],
             [ensemble_step("accumulate", {"INPUT": "VALUE"}, {"OUTPUT": "TOTAL"})], {"max_batch_size": 4})
    server = start_server(root)
    for name in ("batched", "burst", "accumulate", "accumulating"):
        assert server.load(name).status_code == 200, server.load(name).text
    return server


def client_for(server) -> http.InferenceServerClient:
    return http.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=30)


def burst_stats(server) -> dict:
    return server.request("GET", "/v2/models/burst/stats").json()["model_stats"][0]


def test_batched_results_reach_the_right_requests_under_concurrency(server):
    rng = random.Random(7)
    cases = [np.array([[rng.uniform(-9, 9) for _ in range(3)] for _ in range(rng.randint(1, 3))], np.float32) for _ in range(96)]

    def infer(values):
        client = client_for(server)
        tensor_in = http.InferInput("x", list(values.shape), "FP32")
        tensor_in.set_data_from_numpy(values)
        try:
            return client.infer("batched", [tensor_in], priority=rng.choice([0, 1, 2])).as_numpy("y")
        finally:
            client.close()

    before = client_for(server).get_inference_statistics("batched")["model_stats"][0]
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(infer, cases))
    for values, result in zip(cases, results, strict=True):
        assert result.shape == values.shape and np.allclose(result, values * 2 + 1)
    after = client_for(server).get_inference_statistics("batched")["model_stats"][0]
    assert after["inference_count"] - before["inference_count"] == sum(len(v) for v in cases)
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == len(cases)
    assert sum(b["compute_infer"]["count"] for b in after["batch_stats"]) == after["execution_count"]
    batched = {b["batch_size"]: b["compute_infer"]["count"] for b in after["batch_stats"]}
    for b in before["batch_stats"]:
        batched[b["batch_size"]] -= b["compute_infer"]["count"]
    assert sum(size * count for size, count in batched.items()) == sum(len(v) for v in cases)  # every row, once


def test_a_burst_of_clients_forms_preferred_batches(server):
    """32 connections send two requests each, the second as soon as the first is answered. A model that
    costs microseconds answers a request before the next one is read, so only the clients expected back
    (answered within the queue delay, on a connection they keep) make a batch wait for them: the burst
    runs mostly as batches of the preferred 8, and ends at once when its last clients close."""
    barrier = threading.Barrier(32, timeout=60)  # one client that fails never holds the others for ever

    def client_requests(index: int) -> list[np.ndarray]:
        client = client_for(server)
        try:
            assert client.is_server_ready()  # the connection is open before the burst starts
            barrier.wait()
            answers = []
            for step_ in range(2):
                values = np.full((1, 3), index * 10 + step_, np.float32)
                tensor_in = http.InferInput("x", [1, 3], "FP32")
                tensor_in.set_data_from_numpy(values)
                answers.append(client.infer("burst", [tensor_in]).as_numpy("y") - (values * 2 + 1))
            return answers
        finally:
            client.close()

    client = client_for(server)
    tensor_in = http.InferInput("x", [1, 3], "FP32")
    tensor_in.set_data_from_numpy(np.ones((1, 3), np.float32))
    for _ in range(20):  # executions enough for the model to be judged cheap enough to run on the loop
        client.infer("burst", [tensor_in])
    client.close()
    before = burst_stats(server)
    with ThreadPoolExecutor(32) as pool:
        differences = [d for answers in pool.map(client_requests, range(32)) for d in answers]
    assert len(differences) == 64 and not any(d.any() for d in differences)
    after = burst_stats(server)
    sizes = [{b["batch_size"]: b["compute_infer"]["count"] for b in s["batch_stats"]} for s in (before, after)]
    formed = {size: count - sizes[0].get(size, 0) for size, count in sizes[1].items() if count > sizes[0].get(size, 0)}
    assert after["execution_count"] - before["execution_count"] <= 16, formed  # a mean batch of 4 at least
    assert formed.get(8, 0) >= 4, formed  # half the requests, at least, in batches of 8


def test_a_lone_client_never_waits_for_a_batch(server):
    """One client at a time, on one connection or on a new one per request (the last one left open, as
    `requests.post` does while its response is referenced): each request runs at once, as a batch of one,
    though the clients of the burst before were expected back (they closed)."""
    before = burst_stats(server)["execution_count"]
    client = client_for(server)
    tensor_in = http.InferInput("x", [1, 3], "FP32")
    tensor_in.set_data_from_numpy(np.ones((1, 3), np.float32))
    for _ in range(5):
        assert client.infer("burst", [tensor_in]).as_numpy("y").tolist() == [[3, 3, 3]]
    client.close()
    body = {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
    answers = []
    for _ in range(5):
        answers.append(requests.post(server.url + "/v2/models/burst/infer", json=body, timeout=30))
        assert answers[-1].json()["outputs"][0]["data"] == [3, 5, 7]
    assert burst_stats(server)["execution_count"] - before == 10


def test_a_priority_past_the_models_levels_is_served_at_the_default_level_as_triton_does(server):
    body = {"parameters": {"priority": 3}, "inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
    answer = requests.post(server.url + "/v2/models/batched/infer", json=body, timeout=30)
    assert answer.status_code == 200 and answer.json()["outputs"][0]["data"] == [3, 5, 7]


def step(client, sequence_id, value, start=False, end=False):
    tensor_in = http.InferInput("INPUT", [1, 1], "FP32")
    tensor_in.set_data_from_numpy(np.array([[value]], np.float32))
    result = client.infer("accumulate", [tensor_in], sequence_id=sequence_id, sequence_start=start, sequence_end=end)
    return result


def test_interleaved_sequences_keep_their_own_state(server):
    client = client_for(server)
    assert step(client, 11, 1, start=True).as_numpy("OUTPUT").item() == 1
    assert step(client, 22, 10, start=True).as_numpy("OUTPUT").item() == 10
    assert step(client, 11, 2).as_numpy("OUTPUT").item() == 3
    assert step(client, 22, 20).as_numpy("OUTPUT").item() == 30
    assert step(client, 11, 5, start=True).as_numpy("OUTPUT").item() == 5  # restarted: fresh state
    assert step(client, 22, 30).as_numpy("OUTPUT").item() == 60
    last = step(client, 11, 1, end=True)
    assert last.as_numpy("OUTPUT").item() == 6
    assert [o["name"] for o in last.get_response()["outputs"]] == ["OUTPUT", "CONTROLS"]  # state stays inside
    with pytest.raises(InferenceServerException, match="for sequence 11 to model 'accumulate' must specify the START flag"):
        step(client, 11, 1)  # ended


def test_an_ensemble_hands_its_sequence_to_a_sequence_model_step(server):
    """As Triton's steps carry the ensemble request's correlation id and flags: the step keeps the
    sequence's state, and ends it with the ensemble's last request."""
    client = client_for(server)

    def total(value: float, **flags) -> float:
        tensor_in = http.InferInput("VALUE", [1, 1], "FP32")
        tensor_in.set_data_from_numpy(np.array([[value]], np.float32))
        return client.infer("accumulating", [tensor_in], sequence_id=31, **flags).as_numpy("TOTAL").item()

    assert [total(1, sequence_start=True), total(2), total(4, sequence_end=True)] == [1, 3, 7]
    with pytest.raises(InferenceServerException, match="for sequence 31 to model 'accumulate' must specify the START flag"):
        total(1)  # ended by the ensemble's last request


def test_the_server_makes_the_control_inputs(server):
    client = client_for(server)
    assert step(client, 77, 1, start=True).as_numpy("CONTROLS").tolist() == [[1, 0, 1, 77]]
    assert step(client, 77, 1).as_numpy("CONTROLS").tolist() == [[0, 0, 1, 77]]
    assert step(client, 77, 1, end=True).as_numpy("CONTROLS").tolist() == [[0, 1, 1, 77]]


@pytest.mark.parametrize("parameters, message", [
    ({}, "inference request to model 'accumulate' must specify a non-zero or non-empty correlation ID"),
    ({"sequence_id": 5}, "inference request for sequence 5 to model 'accumulate' must specify the START flag on the first "
                         "request of the sequence"),
    ({"sequence_id": "abc", "sequence_start": True}, "takes an integer sequence_id"),
])
def test_sequence_errors(server, parameters, message):
    body = {"parameters": parameters, "inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "FP32", "data": [1]}]}
    answer = server.request("POST", "/v2/models/accumulate/infer", json=body)
    assert answer.status_code == 400 and message in answer.json()["error"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_batch_of_several_items_is_refused_for_a_sequence_in_tritons_words(server, protocol):
    """Triton's L0_sequence_batcher test_batch_size: a sequence model with max_batch_size 4 and one
    instance, sent a sequence whose requests carry two items each. The refused start starts nothing."""
    import tritonclient.grpc as grpc

    module = http if protocol == "http" else grpc
    if protocol == "grpc":
        wait_for(server.grpc_ready, 60, "the gRPC front-end did not come up")  # it starts beside HTTP, maybe later
    client = (http.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=60) if protocol == "http"
              else grpc_clients.InferenceServerClient(server.grpc_url))
    deadline = {} if protocol == "http" else {"client_timeout": 60}

    def send(rows: int, **flags):
        value = module.InferInput("INPUT", [rows, 1], "FP32")
        value.set_data_from_numpy(np.ones((rows, 1), np.float32))
        return client.infer("accumulate", [value], sequence_id=27, **flags, **deadline)

    with pytest.raises(InferenceServerException) as refused:
        send(2, sequence_start=True)
    assert refused.value.message().startswith(
        "inference request to model 'accumulate' must specify batch-size 1 due to requirements of sequence batcher")
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        send(1, sequence_end=True)
    assert send(1, sequence_start=True, sequence_end=True).as_numpy("OUTPUT").tolist() == [[1.0]]
    client.close()


def active_sequences(server) -> float:
    text = server.request("GET", "/metrics").text
    return float(re.search(r'^serve_sequences_active\{model="accumulate"\} (\S+)$', text, re.MULTILINE).group(1))


def test_an_abandoned_sequence_is_released_after_its_idle_time(server):
    client = client_for(server)
    wait_for(lambda: active_sequences(server) == 0, message="earlier sequences were not released")
    step(client, 99, 1, start=True)
    assert active_sequences(server) == 1
    wait_for(lambda: active_sequences(server) == 0, message="the idle sequence was not released")
    with pytest.raises(InferenceServerException, match="for sequence 99 to model .* must specify the START flag"):
        step(client, 99, 1)
