"""Triton's ragged batching against the real server: requests of different lengths batch together, a
ragged input reaching the model as one flat tensor with the batch inputs the server makes beside it
(TorchScript and an ExportedProgram), a scattered output cut back to each request's shape, over HTTP
and gRPC; and configs whose batch inputs or outputs make no sense refused at load with the reason."""

import json
import os
import random
from concurrent.futures import ThreadPoolExecutor
from typing import List

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests import grpc_clients
from tests.builders import aoti_package, python_model, tensor, triton_model, wait_for
from tests.integration import test_pt2
from tests.integration.test_groups import FrontEnd, document_call


class SegmentMeans(torch.nn.Module):
    """Token values of every request of a batch end to end, where each request's ends, and how many it
    has: each request's mean, each token times ten, and the counts it was given."""

    def forward(self, TOKENS: torch.Tensor, ENDS: torch.Tensor, COUNTS: torch.Tensor):
        means = []
        for index in range(ENDS.shape[0]):
            end = int(ENDS[index])
            means.append(TOKENS[end - int(COUNTS[index]): end].mean())
        return torch.stack(means).unsqueeze(1), TOKENS * 10, COUNTS.unsqueeze(1)


class Joined(torch.nn.Module):
    """Each request's words, a ragged BYTES input, joined: a flat List[str] and each request's count."""

    def forward(self, WORDS: List[str], COUNTS: torch.Tensor) -> List[str]:
        joined: List[str] = []
        start = 0
        for index in range(COUNTS.shape[0]):
            count = int(COUNTS[index])
            joined.append("|".join(WORDS[start: start + count]).upper())
            start += count
        return joined


class Doubled(torch.nn.Module):
    """An exported tokenizer-free encoder's shape: tokens flat, the batch's offsets from zero, and each
    row's shape."""

    def forward(self, tokens, offsets, shapes):
        lengths = offsets[1:] - offsets[:-1]
        return tokens * 2, (lengths.unsqueeze(1) + shapes).float()


RAGGED = {
    "max_batch_size": 8,
    "input": [{"name": "TOKENS", "data_type": "TYPE_FP32", "dims": [-1], "allow_ragged_batch": True}],
    "output": [tensor("MEAN", "TYPE_FP32", [1]), tensor("SCALED", "TYPE_FP32", [-1]), tensor("COUNT", "TYPE_FP32", [1])],
    "batch_input": [
        {"kind": "BATCH_ACCUMULATED_ELEMENT_COUNT", "target_name": ["ENDS"], "data_type": "TYPE_INT32", "source_input": ["TOKENS"]},
        {"kind": "BATCH_ELEMENT_COUNT", "target_name": ["COUNTS"], "data_type": "TYPE_FP32", "source_input": ["TOKENS"]}],
    "batch_output": [{"kind": "BATCH_SCATTER_WITH_INPUT_SHAPE", "target_name": ["SCALED"], "source_input": ["TOKENS"]}],
}
EXPORTED = {
    "platform": "torch_export", "max_batch_size": 8, "dynamic_batching": {},
    "input": [{"name": "INPUT__0", "data_type": "TYPE_FP32", "dims": [-1], "allow_ragged_batch": True}],
    "output": [tensor("OUTPUT__0", "TYPE_FP32", [-1]), tensor("OUTPUT__1", "TYPE_FP32", [1])],
    "batch_input": [
        {"kind": "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", "target_name": ["INPUT__1"], "data_type": "TYPE_INT32",
         "source_input": ["INPUT__0"]},
        {"kind": "BATCH_ITEM_SHAPE", "target_name": ["INPUT__2"], "data_type": "TYPE_INT32", "source_input": ["INPUT__0"]}],
    "batch_output": [{"kind": "BATCH_SCATTER_WITH_INPUT_SHAPE", "target_name": ["OUTPUT__0"], "source_input": ["INPUT__0"]}],
}

# each request's x twice, and how many requests its execute() was given
RAGGED_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            count = np.full((x.shape[0], 1), len(requests), np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", x * 2), pb_utils.Tensor("count", count)]))
        return responses
"""


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    inputs, outputs = RAGGED["input"], RAGGED["output"]
    rest = {k: v for k, v in RAGGED.items() if k not in ("input", "output", "max_batch_size")}
    # a warmup sample reaches the model as a batch of one does, its batch inputs made
    warmup = [{"name": "five", "batch_size": 1,
               "inputs": {"TOKENS": {"data_type": "TYPE_FP32", "dims": [5], "random_data": True}}}]
    for name in ("means", "ragged_refused"):  # the second loads only with the refused configs of a test
        triton_model(root, name, SegmentMeans(), inputs, outputs, 8, dynamic_batching={}, model_warmup=warmup, **rest)
    triton_model(root, "joined", Joined(), [{"name": "WORDS", "data_type": "TYPE_STRING", "dims": [-1], "allow_ragged_batch": True}],
                 [tensor("JOINED", "TYPE_STRING", [1])], 8, dynamic_batching={}, batch_input=[
                     {"kind": "BATCH_ELEMENT_COUNT", "target_name": ["COUNTS"], "data_type": "TYPE_INT32", "source_input": ["WORDS"]}])
    tokens, offsets = torch.arange(7, dtype=torch.float32), torch.tensor([0, 3, 7], dtype=torch.int32)
    shapes = torch.tensor([[3], [4]], dtype=torch.int32)
    rows = torch.export.Dim("rows", min=1, max=8)
    program = torch.export.export(Doubled().eval(), (tokens, offsets, shapes), dynamic_shapes=(
        {0: torch.export.Dim("tokens", min=1, max=4096)}, {0: rows + 1}, {0: rows}))
    files = tmp_path_factory.mktemp("pt2")
    torch.export.save(program, str(files / "doubled.pt2"))
    aoti_package(program, files / "doubled_aoti.pt2")  # ~8 s here
    test_pt2.triton_model(root, "doubled", files / "doubled.pt2", EXPORTED)
    test_pt2.triton_model(root, "doubled_aoti", files / "doubled_aoti.pt2", {**EXPORTED, "platform": "torch_aoti"})
    python_model(root, "python_batch_input", "class TritonPythonModel:\n    pass\n", {
        "max_batch_size": 8, "input": [tensor("x", "TYPE_FP32", [-1])], "output": [tensor("y", "TYPE_FP32", [-1])],
        "batch_input": [{"kind": "BATCH_ELEMENT_COUNT", "target_name": ["n"], "data_type": "TYPE_INT32", "source_input": ["x"]}]})
    python_model(root, "python_ragged", RAGGED_PY, {
        "max_batch_size": 8, "dynamic_batching": {},
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [-1], "allow_ragged_batch": True}],
        "output": [tensor("y", "TYPE_FP32", [-1]), tensor("count", "TYPE_INT32", [1])]})
    server = start_server(root, SERVE_LOAD_MODELS="means,joined,doubled,doubled_aoti,python_ragged", SERVE_HTTP_WORKERS="1")
    wait_for(lambda: server.ready() and server.grpc_ready(), 60, "the models did not load, or gRPC did not listen")
    return server


def stats(server, name: str) -> dict:
    return server.request("GET", f"/v2/models/{name}/stats").json()["model_stats"][0]


def tokens_of(length: int, start: float = 0) -> np.ndarray:
    return (np.arange(length, dtype=np.float32) + start).reshape(1, length)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_ragged_request_reaches_the_model_flat_with_its_batch_inputs(server, protocol):
    client_module = httpclient if protocol == "http" else grpcclient
    url = server.url.removeprefix("http://") if protocol == "http" else server.grpc_url
    client = (httpclient.InferenceServerClient(url, network_timeout=30) if protocol == "http" else
              grpc_clients.InferenceServerClient(url))
    for length in (1, 5):
        values = tokens_of(length, 2)
        sent = client_module.InferInput("TOKENS", [1, length], "FP32")
        sent.set_data_from_numpy(values)
        answer = client.infer("means", [sent], **({"client_timeout": 30} if protocol == "grpc" else {}))
        np.testing.assert_allclose(answer.as_numpy("MEAN"), [[values.mean()]])
        np.testing.assert_array_equal(answer.as_numpy("SCALED"), values * 10)
        np.testing.assert_array_equal(answer.as_numpy("COUNT"), [[length]])
    client.close()


def test_requests_of_different_lengths_run_as_one_batch_and_each_gets_its_own_share(server):
    front_end = FrontEnd(server, os.getpid())
    lengths = [3, 1, 6]
    calls = [document_call(n, {"inputs": [{"name": "TOKENS", "shape": [1, length], "datatype": "FP32",
                                           "data": tokens_of(length, 10 * n).ravel().tolist()}]})
             for n, length in enumerate(lengths)]
    before = stats(server, "means")
    items = front_end.group("v2_infer", "means", calls)
    front_end.close()
    after = stats(server, "means")
    assert after["execution_count"] - before["execution_count"] == 1
    threes = [{b["batch_size"]: b["compute_infer"]["count"] for b in s["batch_stats"]}.get(3, 0) for s in (before, after)]
    assert threes[1] - threes[0] == 1
    for position, error, body, _ in items:
        assert error is None
        outputs = {o["name"]: o for o in json.loads(body)["outputs"]}
        values = tokens_of(lengths[position], 10 * position)
        assert outputs["MEAN"]["data"] == pytest.approx([values.mean()])
        assert (outputs["SCALED"]["shape"], outputs["SCALED"]["data"]) == ([1, lengths[position]], (values * 10).ravel().tolist())
        assert outputs["COUNT"]["data"] == [lengths[position]]


def test_ragged_strings_batch_as_one_flat_list(server):
    front_end = FrontEnd(server, os.getpid())
    words = [["x"], ["p", "q", "r", "s"], ["m", "n"]]
    calls = [document_call(n, {"inputs": [{"name": "WORDS", "shape": [1, len(w)], "datatype": "BYTES", "data": w}]})
             for n, w in enumerate(words)]
    before = stats(server, "joined")
    items = front_end.group("v2_infer", "joined", calls)
    front_end.close()
    assert stats(server, "joined")["execution_count"] - before["execution_count"] == 1
    assert {position: json.loads(body)["outputs"][0]["data"] for position, _, body, _ in items} == \
        {0: ["X"], 1: ["P|Q|R|S"], 2: ["M|N"]}


def test_concurrent_ragged_requests_each_get_their_own_answer(server):
    rng = random.Random(3)
    cases = [tokens_of(rng.randint(1, 40), rng.randint(0, 100)) for _ in range(64)]

    def infer(values):
        client = httpclient.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=30)
        sent = httpclient.InferInput("TOKENS", list(values.shape), "FP32")
        sent.set_data_from_numpy(values)
        try:
            answer = client.infer("means", [sent])
            return answer.as_numpy("MEAN"), answer.as_numpy("SCALED")
        finally:
            client.close()

    with ThreadPoolExecutor(16) as pool:
        for values, (mean, scaled) in zip(cases, pool.map(infer, cases), strict=True):
            np.testing.assert_allclose(mean, [[values.mean()]], rtol=1e-6)
            np.testing.assert_array_equal(scaled, values * 10)


@pytest.mark.parametrize("name", ["doubled", "doubled_aoti"])
def test_a_pt2_program_takes_the_offsets_from_zero_and_the_item_shapes(server, name):
    front_end = FrontEnd(server, os.getpid())
    lengths = [2, 5]
    calls = [document_call(n, {"inputs": [{"name": "INPUT__0", "shape": [1, length], "datatype": "FP32",
                                           "data": tokens_of(length).ravel().tolist()}]}) for n, length in enumerate(lengths)]
    before = stats(server, name)
    items = front_end.group("v2_infer", name, calls)
    assert stats(server, name)["execution_count"] - before["execution_count"] == 1
    front_end.close()
    for position, error, body, _ in items:
        assert error is None
        outputs = {o["name"]: o for o in json.loads(body)["outputs"]}
        length = lengths[position]
        assert outputs["OUTPUT__0"]["data"] == (tokens_of(length) * 2).ravel().tolist()
        assert outputs["OUTPUT__1"]["data"] == [2 * length]  # its length twice: from its offsets, and its shape


def test_a_batch_input_is_no_input_a_client_may_send(server):
    body = {"inputs": [{"name": "TOKENS", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]},
                       {"name": "ENDS", "shape": [1], "datatype": "INT32", "data": [2]}]}
    answer = server.request("POST", "/v2/models/means/infer", json=body)
    assert answer.status_code == 400 and "unknown input 'ENDS'" in answer.json()["error"]
    metadata = server.request("GET", "/v2/models/means").json()
    assert [t["name"] for t in metadata["inputs"]] == ["TOKENS"]


def batch_input(kind="BATCH_ELEMENT_COUNT", target=("ENDS",), data_type="TYPE_INT32", source=("TOKENS",)) -> dict:
    return {"kind": kind, "target_name": list(target), "data_type": data_type, "source_input": list(source)}


def changed(**change) -> dict:
    return {"name": "means", "platform": "pytorch_libtorch", **RAGGED, **change}


SCATTER = {"kind": "BATCH_SCATTER_WITH_INPUT_SHAPE", "target_name": ["SCALED"], "source_input": ["TOKENS"]}


@pytest.mark.parametrize(("config", "words"), [
    (changed(batch_input=[batch_input(source=("NOPE",))]), "unknown source input name 'NOPE'"),
    (changed(batch_input=[batch_input(source=("TOKENS", "TOKENS"))]), "expects 1 source input, got 2"),
    (changed(batch_input=[batch_input(data_type="TYPE_INT64")]), "must be TYPE_INT32 or TYPE_FP32"),
    (changed(batch_input=[batch_input(target=("TOKENS",))]), "target(s) ['TOKENS'] name a config input"),
    (changed(batch_input=[batch_input(target=())]), "names no target_name"),
    (changed(max_batch_size=0, batch_input=[batch_input("BATCH_ITEM_SHAPE")]), "needs a model that batches"),
    (changed(batch_input=[batch_input("BATCH_ACCUMULATED_ELEMENT_COUNT")]),
     "the config declares 2 input(s) ['TOKENS', 'ENDS']; forward() takes 3"),
    (changed(input=[{**RAGGED["input"][0], "reshape": {"shape": [-1]}}]), "leave out its reshape"),
    (changed(batch_output=[{**SCATTER, "target_name": ["NOPE"]}]), "must name one config output"),
    (changed(batch_output=[SCATTER, SCATTER]), "may be scattered by one batch_output only"),
    (changed(output=[tensor("MEAN", "TYPE_FP32", [1]), tensor("SCALED", "TYPE_FP32", [-1, -1]), RAGGED["output"][2]]),
     "which has fewer dimensions"),
])
def test_a_config_whose_batch_inputs_or_outputs_make_no_sense_is_a_400_with_the_reason(server, config, words):
    answer = server.request("POST", "/v2/repository/models/ragged_refused/load",
                            json={"parameters": {"config": json.dumps({**config, "name": "ragged_refused"})}})
    assert answer.status_code == 400 and words in answer.json()["error"], answer.text
    assert server.request("GET", "/ping").status_code == 200


def test_a_python_model_takes_requests_of_different_shapes_in_one_execute(server):
    front_end = FrontEnd(server, os.getpid())
    calls = [document_call(n, {"inputs": [{"name": "x", "shape": [1, length], "datatype": "FP32",
                                           "data": tokens_of(length).ravel().tolist()}]}) for n, length in enumerate([2, 7])]
    items = front_end.group("v2_infer", "python_ragged", calls)
    front_end.close()
    for position, error, body, _ in items:
        assert error is None
        outputs = {o["name"]: o["data"] for o in json.loads(body)["outputs"]}
        assert outputs == {"y": (tokens_of([2, 7][position]) * 2).ravel().tolist(), "count": [2]}


def test_a_python_model_is_told_batch_inputs_are_not_for_it(server):
    answer = server.load("python_batch_input")
    assert answer.status_code == 400 and "a python model gets each request's own tensors" in answer.text
