"""Triton's response cache against the real server: a model whose config enables it answers the same
request again without running, over HTTP and gRPC, counted as Triton counts hits and misses; requests
that differ in their inputs, the outputs they ask for or (for a python model) their parameters are kept
apart; a model loaded again never answers from its previous load; the cache keeps to its size, and the
memory budget counts it; configs Triton refuses it for are refused with Triton's words."""

import random
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests import grpc_clients
from tests.builders import AddSub, Scale, ensemble, ensemble_step, fp32_model, python_model, tensor, triton_model, wait_for
from tests.integration.test_scheduling import SEQUENCE, Accumulate

CACHED = {"response_cache": {"enable": True}}
BUDGET = 64 * 1024

# y = x times the request's parameter "factor"
FACTOR_PY = """
import json
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            factor = float(json.loads(request.parameters()).get("factor", 1))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", x * factor)]))
        return responses
"""


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    fp32_model(root, "cached", Scale(2.0), dynamic_batching={}, **CACHED)
    fp32_model(root, "plain", Scale(2.0))
    triton_model(root, "addsub", AddSub(), [tensor("INPUT0", "TYPE_FP32", [4]), tensor("INPUT1", "TYPE_FP32", [4])],
                 [tensor("OUTPUT0", "TYPE_FP32", [4]), tensor("OUTPUT1", "TYPE_FP32", [4])], 8, **CACHED)
    python_model(root, "factor", FACTOR_PY, {"max_batch_size": 8, "input": [tensor("x", "TYPE_FP32", [4])],
                                             "output": [tensor("y", "TYPE_FP32", [4])], **CACHED})
    triton_model(root, "sequence_cached", Accumulate(), [tensor("INPUT", "TYPE_FP32", [1])],
                 [tensor("OUTPUT", "TYPE_FP32", [1]), tensor("CONTROLS", "TYPE_FP32", [4])], 4,
                 sequence_batching=SEQUENCE, **CACHED)
    python_model(root, "decoupled_cached", FACTOR_PY, {
        "input": [tensor("x", "TYPE_FP32", [4])], "output": [tensor("y", "TYPE_FP32", [4])],
        "model_transaction_policy": {"decoupled": True}, **CACHED})
    ensemble(root, "cached_pipeline", [tensor("x", "TYPE_FP32", [4])], [tensor("y", "TYPE_FP32", [4])],
             [ensemble_step("plain", {"x": "x"}, {"y": "doubled"}), ensemble_step("factor", {"x": "doubled"}, {"y": "y"})],
             {"max_batch_size": 8, **CACHED})
    server = start_server(root, SERVE_LOAD_MODELS="cached,plain,addsub,factor,cached_pipeline", SERVE_RESPONSE_CACHE_SIZE=str(BUDGET))
    wait_for(lambda: server.ready() and server.grpc_ready(), 60, "the models did not load, or gRPC did not listen")
    server.root = root
    return server


def infer(server, name: str, values: list[float], **more) -> dict:
    body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": values}], **more}
    answer = server.request("POST", f"/v2/models/{name}/infer", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()


def stats(server, name: str) -> dict:
    return server.request("GET", f"/v2/models/{name}/stats").json()["model_stats"][0]


def test_the_same_request_again_is_answered_without_running_the_model(server):
    before = stats(server, "cached")
    first, second = (infer(server, "cached", [1, 2, 3, 4]) for _ in range(2))
    assert first["outputs"] == second["outputs"] and first["outputs"][0]["data"] == [2, 4, 6, 8]
    after = stats(server, "cached")
    grew = {k: after["inference_stats"][k]["count"] - before["inference_stats"][k]["count"]
            for k in ("success", "cache_hit", "cache_miss")}
    assert grew == {"success": 2, "cache_hit": 1, "cache_miss": 1}
    assert after["execution_count"] - before["execution_count"] == 1
    assert after["inference_count"] - before["inference_count"] == 2
    infer(server, "cached", [1, 2, 3, 5])  # another input: run
    assert stats(server, "cached")["execution_count"] - after["execution_count"] == 1


def test_an_ensemble_answers_the_same_request_again_from_the_cache_and_runs_no_step(server):
    """As Triton caches a top-level ensemble's responses: the second request is a hit, and neither step runs
    for it; the steps' own configs do not cache."""
    before = {name: stats(server, name) for name in ("cached_pipeline", "plain", "factor")}
    first, second = (infer(server, "cached_pipeline", [1, 2, 3, 9], parameters={"factor": 3}) for _ in range(2))
    assert first["outputs"] == second["outputs"] and first["outputs"][0]["data"] == [6, 12, 18, 54]  # the factor reached its step
    after = {name: stats(server, name) for name in before}
    grew = {k: after["cached_pipeline"]["inference_stats"][k]["count"] - before["cached_pipeline"]["inference_stats"][k]["count"]
            for k in ("success", "cache_hit", "cache_miss")}
    assert grew == {"success": 2, "cache_hit": 1, "cache_miss": 1}
    assert [after[step]["execution_count"] - before[step]["execution_count"] for step in ("plain", "factor")] == [1, 1]


def answers(server, name: str) -> list:
    """What every protocol answers for one request to `name`, each asked its own way."""
    rows = np.array([[0.5, -1, 2, 7]], np.float32)
    found = []
    with grpc_clients.InferenceServerClient(server.grpc_url) as client:
        sent = grpcclient.InferInput("x", [1, 4], "FP32")
        sent.set_data_from_numpy(rows)
        found.append(client.infer(name, [sent], client_timeout=30).as_numpy("y").tolist())
        top = client.infer(name, [sent], outputs=[grpcclient.InferRequestedOutput("y", class_count=2)], client_timeout=30)
        found.append(top.as_numpy("y").tolist())
    binary = httpclient.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=30)
    sent = httpclient.InferInput("x", [1, 4], "FP32")
    sent.set_data_from_numpy(rows, binary_data=True)
    found.append(binary.infer(name, [sent], outputs=[httpclient.InferRequestedOutput("y", binary_data=True)]).as_numpy("y").tolist())
    binary.close()
    found.append(infer(server, name, rows.ravel().tolist())["outputs"])
    found.append(server.invoke(name, rows.tolist()).json())
    found.append(server.request("POST", f"/v1/models/{name}:predict", json={"instances": rows.tolist()}).json())
    return found


def test_every_protocol_answers_from_the_cache_as_the_model_answered_it(server):
    fresh = answers(server, "plain")
    before = stats(server, "cached")
    first, again = answers(server, "cached"), answers(server, "cached")
    assert first == again == fresh
    after = stats(server, "cached")
    assert after["inference_stats"]["cache_hit"]["count"] - before["inference_stats"]["cache_hit"]["count"] >= len(fresh)


def test_a_model_whose_config_does_not_enable_it_always_runs(server):
    before = stats(server, "plain")
    for _ in range(3):
        infer(server, "plain", [1, 1, 1, 1])
    after = stats(server, "plain")
    assert after["execution_count"] - before["execution_count"] == 3
    assert after["inference_stats"]["cache_hit"]["count"] == after["inference_stats"]["cache_miss"]["count"] == 0


def test_grpc_is_answered_from_the_same_cache_and_triton_s_counters_show_it(server):
    infer(server, "cached", [9, 9, 9, 9])
    client = grpc_clients.InferenceServerClient(server.grpc_url)
    sent = grpcclient.InferInput("x", [1, 4], "FP32")
    sent.set_data_from_numpy(np.full((1, 4), 9, np.float32))
    before = client.get_inference_statistics("cached", as_json=True)["model_stats"][0]["inference_stats"]
    np.testing.assert_array_equal(client.infer("cached", [sent], client_timeout=30).as_numpy("y"), np.full((1, 4), 18))
    after = client.get_inference_statistics("cached", as_json=True)["model_stats"][0]["inference_stats"]
    client.close()
    assert int(after["cache_hit"]["count"]) - int(before["cache_hit"]["count"]) == 1
    metrics = server.request("GET", "/metrics").text
    hits = stats(server, "cached")["inference_stats"]["cache_hit"]["count"]
    assert f'nv_cache_num_hits_per_model{{model="cached",version="1"}} {hits}' in metrics


def test_requests_asking_for_different_outputs_are_kept_apart(server):
    inputs = [{"name": n, "shape": [1, 4], "datatype": "FP32", "data": [5, 6, 7, 8] if n == "INPUT0" else [1, 1, 1, 1]}
              for n in ("INPUT0", "INPUT1")]
    answers = {}
    for wanted in ("OUTPUT0", "OUTPUT1", "OUTPUT0"):
        answer = server.request("POST", "/v2/models/addsub/infer", json={"inputs": inputs, "outputs": [{"name": wanted}]})
        assert answer.status_code == 200, answer.text
        [output] = answer.json()["outputs"]
        answers.setdefault(wanted, []).append((output["name"], output["data"]))
    assert answers == {"OUTPUT0": [("OUTPUT0", [6, 7, 8, 9])] * 2, "OUTPUT1": [("OUTPUT1", [4, 5, 6, 7])]}


def test_a_python_model_s_parameters_are_part_of_what_it_answers(server):
    doubled = infer(server, "factor", [1, 2, 3, 4], parameters={"factor": 2})
    tripled = infer(server, "factor", [1, 2, 3, 4], parameters={"factor": 3})
    again = infer(server, "factor", [1, 2, 3, 4], parameters={"factor": 2})
    assert [a["outputs"][0]["data"] for a in (doubled, tripled, again)] == [[2, 4, 6, 8], [3, 6, 9, 12], [2, 4, 6, 8]]
    assert stats(server, "factor")["inference_stats"]["cache_hit"]["count"] >= 1


def test_a_model_loaded_again_never_answers_from_its_previous_load(server):
    assert infer(server, "cached", [1, 0, 0, 0])["outputs"][0]["data"] == [2, 0, 0, 0]
    torch.jit.script(Scale(5.0)).save(str(server.root / "cached" / "1" / "model.pt"))
    try:
        answer = server.request("POST", "/v2/repository/models/cached/load")
        assert answer.status_code == 200, answer.text
        assert infer(server, "cached", [1, 0, 0, 0])["outputs"][0]["data"] == [5, 0, 0, 0]
    finally:
        torch.jit.script(Scale(2.0)).save(str(server.root / "cached" / "1" / "model.pt"))
        assert server.request("POST", "/v2/repository/models/cached/load").status_code == 200


def test_concurrent_requests_each_get_their_own_answer(server):
    rng = random.Random(11)
    cases = [[float(rng.randint(1000, 1039)), 1, 2, 3] for _ in range(400)]

    def answer(values):
        return infer(server, "cached", values)["outputs"][0]["data"]

    before = stats(server, "cached")["inference_stats"]["cache_hit"]["count"]
    with ThreadPoolExecutor(8) as pool:
        for values, got in zip(cases, pool.map(answer, cases), strict=True):
            assert got == [v * 2 for v in values]
    hits = stats(server, "cached")["inference_stats"]["cache_hit"]["count"] - before
    assert hits >= len(cases) - 8 * 40  # at most eight clients miss a value at once, before its answer is kept


def test_the_cache_keeps_to_its_size_least_recently_used_first_and_the_budget_counts_it(server):
    def hit(value: float) -> bool:
        before = stats(server, "cached")["inference_stats"]["cache_hit"]["count"]
        infer(server, "cached", [value, 0, 0, 0])
        return stats(server, "cached")["inference_stats"]["cache_hit"]["count"] > before

    before = server.metrics()[("serve_response_cache_evictions_total", ())]
    for value in range(2000, 2300):  # about 480 bytes each: 64 KiB keep the last 130 or so
        infer(server, "cached", [float(value), 0, 0, 0])
    metrics = server.metrics()
    assert 0 < metrics[("serve_response_cache_bytes", ())] <= BUDGET
    assert metrics[("serve_response_cache_evictions_total", ())] - before >= 150
    assert metrics[("serve_memory_server_bytes", (("device", "cpu"), ("part", "response_cache")))] == \
        metrics[("serve_response_cache_bytes", ())]
    assert hit(2299.0) and not hit(2000.0)


@pytest.mark.parametrize(("name", "words"), [
    ("sequence_cached", "Response Cache does not currently support model sequence_cached with sequence batching"),
    ("decoupled_cached", "Response Cache does not currently support model decoupled_cached with 'decoupled'"),
])
def test_a_model_triton_would_not_cache_is_refused_with_triton_s_words(server, name, words):
    answer = server.load(name)
    assert answer.status_code == 400 and words in answer.json()["error"], answer.text
    assert server.request("GET", "/ping").status_code == 200
