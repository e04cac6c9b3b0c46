"""Triton python-backend models, BLS and ensembles against the real server: a repository of the project's
own models with tritonclient as their client, then what a Triton user's repository does with them — batches into `execute`,
per-request errors, BLS to every kind of model, an ensemble graph, crashes, hangs and eviction."""

import io
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
import requests
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from bench.harness import free_port
from tests import grpc_clients
from tests.builders import MIB, AddSub, Gate, ensemble, ensemble_step, handler_model, python_model, tensor, triton_model, wait_for

REPOSITORY = Path(__file__).resolve().parent.parent / "data" / "python_backend"  # the project's own models


# x (FP32 [4]) → y = factor·x; x[0] == -1 waits at the gate; x[0] < -1 is that request's own error
SCALE_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        import json
        self.factor = float(json.loads(args["model_config"])["parameters"]["factor"]["string_value"])

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            if x.flat[0] == -1:
                {gate}
            if x.flat[0] < -1:
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("x must not be negative", pb_utils.TritonError.INVALID_ARG)))
                continue
            count = np.full((x.shape[0], 1) if x.ndim == 2 else (1,), len(requests), np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", x * self.factor),
                                                         pb_utils.Tensor("count", count)]))
        return responses
"""


def scale_config(factor: float, max_batch_size: int = 0, **config) -> dict:
    return {"max_batch_size": max_batch_size, "input": [tensor("x", "TYPE_FP32", [4])],
            "output": [tensor("y", "TYPE_FP32", [4]), tensor("count", "TYPE_INT32", [1])],
            "parameters": {"factor": {"string_value": str(factor)}}, **config}


def infer(server, name: str, x, model_version: str = "") -> requests.Response:
    x = np.asarray(x, np.float32)
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]}
    return server.request("POST", f"/v2/models/{name}{'/versions/' + model_version if model_version else ''}/infer",
                          json=body)


def output(answer: requests.Response, name: str = "y") -> np.ndarray:
    entry = next(o for o in answer.json()["outputs"] if o["name"] == name)
    return np.array(entry["data"]).reshape(entry["shape"])


def stats(server, name: str) -> dict:
    return server.request("GET", f"/v2/models/{name}/stats").json()["model_stats"][0]["inference_stats"]


# -- a repository of python models, with tritonclient as its client ----------------------------------------

AB = {"A": np.array([1, 2, 3, 4], np.float32), "B": np.array([10, 20, 30, 40], np.float32)}


class Mix(torch.nn.Module):
    def forward(self, A: torch.Tensor, B: torch.Tensor):
        return A + B, A * B


@pytest.fixture(scope="module")
def repository(start_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("repository") / "models"
    shutil.copytree(REPOSITORY, root, ignore=shutil.ignore_patterns("README.md"))
    triton_model(root, "mix_ts", Mix(), [tensor("A", "TYPE_FP32", [4]), tensor("B", "TYPE_FP32", [4])],
                 [tensor("SUM", "TYPE_FP32", [4]), tensor("PRODUCT", "TYPE_FP32", [4])])
    metrics_port = free_port()
    server = start_server(root, SERVE_LOAD_MODELS="*", SERVE_METRICS_PORT=str(metrics_port))
    server.metrics_port = metrics_port
    wait_for(server.ready, 90, "the repository did not load")
    wait_for(server.grpc_ready, 60, "the gRPC front-end did not come up")
    return server


def tensors(module, values: dict) -> list:
    """`values` as the inputs of `module`'s client (tritonclient.http or .grpc)."""
    inputs = []
    for name, value in values.items():
        value = np.asarray(value)
        datatype = "BYTES" if value.dtype.kind in "OSU" else {"float32": "FP32", "int32": "INT32"}[str(value.dtype)]
        tensor_ = module.InferInput(name, list(value.shape), datatype)
        tensor_.set_data_from_numpy(value.astype(np.object_) if datatype == "BYTES" else value)
        inputs.append(tensor_)
    return inputs


def _client(module, url: str):
    return httpclient.InferenceServerClient(url) if module is httpclient else grpc_clients.InferenceServerClient(url)


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
@pytest.mark.parametrize("model", ["mix", "mix_torch", "mix_ts"])
def test_a_python_model_answers_its_client_over_http_and_grpc(repository, module, model):
    url = repository.url.removeprefix("http://") if module is httpclient else repository.grpc_url
    with _client(module, url) as client:
        answer = client.infer(model, tensors(module, AB))
    assert answer.as_numpy("SUM").tolist() == [11, 22, 33, 44]
    assert answer.as_numpy("PRODUCT").tolist() == [10, 40, 90, 160]
    assert answer.as_numpy("SUM").dtype == np.float32


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_a_model_may_change_its_inputs_and_bls_answers_in_place_as_in_triton(repository, module):
    """Triton hands `execute` arrays of the model's own: numpy's DLPack export, the way into torch, and
    in-place arithmetic both refuse a read-only array."""
    url = repository.url.removeprefix("http://") if module is httpclient else repository.grpc_url
    with _client(module, url) as client:
        answer = client.infer("mix_in_place", tensors(module, AB))
    assert answer.as_numpy("SUM").tolist() == [11, 22, 30, 30]
    assert answer.as_numpy("PRODUCT").tolist() == [10, 40, 90, 160]


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_configs_completed_by_the_model_are_served_as_its_config(repository, module):
    url = repository.url.removeprefix("http://") if module is httpclient else repository.grpc_url
    with _client(module, url) as client:
        plain, batched = (client.get_model_config(name, **({} if module is httpclient else {"as_json": True}))
                          for name in ("completed_plain", "completed_batched"))
        if module is grpcclient:
            plain, batched = plain["config"], batched["config"]
        lengths = client.infer("completed_plain", tensors(module, {"WORDS": np.array([b"one", b"three"])}))
        means = client.infer("completed_batched", tensors(module, {"ROWS": np.array([[1, 2, 3], [4, 5, 9]], np.float32)}))
    assert (plain.get("max_batch_size", 0), "dynamic_batching" in plain) == (0, False)
    assert [(t["name"], t["data_type"]) for t in plain["input"] + plain["output"]] == [("WORDS", "TYPE_STRING"),
                                                                                          ("LENGTHS", "TYPE_INT32")]
    assert (batched["max_batch_size"], "dynamic_batching" in batched, batched["backend"]) == (4, True, "python")
    assert [t["name"] for t in batched["input"] + batched["output"]] == ["ROWS", "MEANS"]
    assert lengths.as_numpy("LENGTHS").tolist() == [3, 5]
    assert means.as_numpy("MEANS").tolist() == [[2.0], [6.0]]


def test_a_load_whose_config_override_leaves_the_tensors_out_is_completed_by_the_model(repository):
    # as Triton's simple_http_model_control.py loads `simple`: a config of max_batch_size alone
    answer = repository.request("POST", "/v2/repository/models/completed_batched/load",
                                json={"parameters": {"config": json.dumps({"max_batch_size": 2})}})
    assert answer.status_code == 200, answer.text
    config = repository.request("GET", "/v2/models/completed_batched/config").json()
    assert (config["backend"], [t["name"] for t in config["input"] + config["output"]]) == ("python", ["ROWS", "MEANS"])
    with grpc_clients.InferenceServerClient(repository.grpc_url) as client:
        means = client.infer("completed_batched", tensors(grpcclient, {"ROWS": np.array([[3, 3, 6]], np.float32)}))
    assert means.as_numpy("MEANS").tolist() == [[4.0]]


def test_a_torchscript_override_without_tensors_says_what_to_declare(repository):
    answer = repository.request("POST", "/v2/repository/models/mix_ts/load",
                                json={"parameters": {"config": json.dumps({"max_batch_size": 16})}})
    assert answer.status_code == 400
    assert "the config declares no inputs: declare them (a TorchScript model records no tensor types" in answer.text
    assert repository.request("GET", "/v2/models/mix_ts/ready").status_code == 200  # the old config serves on


@pytest.mark.parametrize("target", ["mix", "mix_torch", "mix_ts"])
def test_a_synchronous_bls_call_reaches_python_and_torchscript_models(repository, target):
    with httpclient.InferenceServerClient(repository.url.removeprefix("http://")) as client:
        answer = client.infer("relay", tensors(httpclient, {"TARGET": np.array([target.encode()]), **AB}))
    assert answer.as_numpy("SUM").tolist() == [11, 22, 33, 44] and answer.as_numpy("PRODUCT").tolist() == [10, 40, 90, 160]


def test_a_bls_call_to_an_unknown_model_fails_that_request_with_the_servers_words(repository):
    with httpclient.InferenceServerClient(repository.url.removeprefix("http://")) as client:
        with pytest.raises(InferenceServerException) as refused:
            client.infer("relay", tensors(httpclient, {"TARGET": np.array([b"nowhere"]), **AB}))
        assert client.infer("relay", tensors(httpclient, {"TARGET": np.array([b"mix"]), **AB})).as_numpy("SUM") is not None
    assert "nowhere refused the call: " in str(refused.value) and "'nowhere'" in str(refused.value)


def test_asynchronous_bls_calls_run_together_and_answer_together(repository):
    with grpc_clients.InferenceServerClient(repository.grpc_url) as client:
        answer = client.infer("relay_async", tensors(grpcclient, AB))
    assert answer.as_numpy("SUM").tolist() == [11, 22, 33, 44] and answer.as_numpy("PRODUCT").tolist() == [10, 40, 90, 160]


@pytest.mark.parametrize("caller", ["tally", "tally_async"])
def test_a_bls_call_to_a_decoupled_model_reads_each_response_and_the_final_flag(repository, caller):
    with httpclient.InferenceServerClient(repository.url.removeprefix("http://")) as client:
        for n in (0, 1, 5):
            answer = client.infer(caller, tensors(httpclient, {"N": np.array([n], np.int32)}))
            assert (answer.as_numpy("RESPONSES")[0], answer.as_numpy("TOTAL")[0]) == (n, n * (n - 1) // 2)


def test_an_error_response_of_a_decoupled_bls_call_reaches_the_caller(repository):
    with httpclient.InferenceServerClient(repository.url.removeprefix("http://")) as client:
        with pytest.raises(InferenceServerException, match="cannot count down from -2"):
            client.infer("tally", tensors(httpclient, {"N": np.array([-2], np.int32)}))


def test_a_decoupled_models_responses_and_its_final_flag_stream_over_grpc(repository):
    received = []
    with grpc_clients.InferenceServerClient(repository.grpc_url) as client:
        client.start_stream(callback=lambda result, error: received.append((result, error)))
        client.async_stream_infer("countdown", tensors(grpcclient, {"N": np.array([4], np.int32)}),
                                  enable_empty_final_response=True)
        wait_for(lambda: len(received) == 5, 30, "the stream did not end")
        client.stop_stream()
    assert [error for _, error in received] == [None] * 5
    values = [result.as_numpy("LEFT").tolist() for result, _ in received[:4]]
    final = received[4][0].get_response()
    assert values == [[3], [2], [1], [0]]
    assert final.parameters["triton_final_response"].bool_param and not final.outputs


def test_a_models_own_metrics_are_read_on_the_metrics_port(repository):
    with httpclient.InferenceServerClient(repository.url.removeprefix("http://")) as client:
        for rows in (1, 3):
            client.infer("metered", tensors(httpclient, {"X": np.ones((rows, 2), np.float32)}))
    text = requests.get(f"http://127.0.0.1:{repository.metrics_port}/metrics", timeout=30).text
    samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("metered_")}
    assert samples['metered_rows{model="metered",version="1"}'] == 4
    assert samples['metered_last_batch_rows{model="metered",version="1"}'] == 3
    assert "# HELP metered_rows Rows this model has doubled" in text


# -- the server's own repository -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gate_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("gates")


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory, gate_dir):
    root = tmp_path_factory.mktemp("python-models")
    batched_gate, fan_gate, drip_gate = Gate(gate_dir, "batched"), Gate(gate_dir, "fan_out"), Gate(gate_dir, "drip")
    bounded_gate = Gate(gate_dir, "bounded")
    pair_gates = [Gate(gate_dir, "pair1"), Gate(gate_dir, "pair2")]
    python_model(root, "pair", PAIR_PY.replace("{gates}", repr([g.code() for g in pair_gates]))
                 .replace("{finalized}", repr(str(gate_dir / "pair.finalized"))),
                 scale_config(1, instance_group=[{"kind": "KIND_CPU", "count": 2}]))
    python_model(root, "batched", SCALE_PY.replace("{gate}", batched_gate.code()),
                 scale_config(2, max_batch_size=8, dynamic_batching={"max_queue_delay_microseconds": 0}))
    python_model(root, "bounded", SCALE_PY.replace("{gate}", bounded_gate.code()),
                 scale_config(2, max_batch_size=1, dynamic_batching={"default_queue_policy": {"max_queue_size": 1}}))
    python_model(root, "double", SCALE_PY.replace("{gate}", fan_gate.code()), scale_config(2))
    python_model(root, "source", SOURCE_PY, {"output": [tensor("n", "TYPE_INT32", [1])]})
    python_model(root, "sends", SENDS_PY, {"input": [tensor("x", "TYPE_FP32", [4])], "output": [tensor("y", "TYPE_FP32", [4])]})
    python_model(root, "sink", SINK_PY, {"input": [tensor("x", "TYPE_FP32", [4])]})
    python_model(root, "configless", SOURCE_PY)  # no config.pbtxt: a model.py is a python model, as Triton takes it
    python_model(root, "batching_source", SOURCE_PY, {"max_batch_size": 4, "output": [tensor("n", "TYPE_INT32", [1])]})
    python_model(root, "triple", SCALE_PY.replace("{gate}", "pass"), scale_config(3))
    python_model(root, "pre", SCALE_PY.replace("{gate}", "pass"), scale_config(1))
    python_model(root, "post", SCALE_PY.replace("{gate}", "pass"), scale_config(1))
    triton_model(root, "add_sub_ts", AddSub(), [tensor("INPUT0", "TYPE_FP32", [4]), tensor("INPUT1", "TYPE_FP32", [4])],
                 [tensor("OUTPUT0", "TYPE_FP32", [4]), tensor("OUTPUT1", "TYPE_FP32", [4])])
    from tests.builders import Scale, fp32_model

    fp32_model(root, "scale_ts", Scale(2), max_batch_size=0)
    handler_model(root, "scale_sm", None, Scale(2))
    python_model(root, "caller", CALLER_PY, {
        "input": [tensor("model", "TYPE_STRING", [1]), tensor("x", "TYPE_FP32", [4])],
        "output": [tensor("y", "TYPE_FP32", [4])]})
    python_model(root, "crashes", CRASHES_PY, scale_config(1))
    python_model(root, "describes", DESCRIBES_PY, {"input": [tensor("x", "TYPE_FP32", [4])],
                                                   "output": [tensor("about", "TYPE_STRING", [5])]})
    python_model(root, "loose", LOOSE_PY, LOOSE_CONFIG)
    python_model(root, "partial", PARTIAL_PY, PARTIAL_CONFIG)
    python_model(root, "ordered", ORDERED_PY, ORDERED_CONFIG)
    python_model(root, "negate", NEGATE_PY, {"input": [tensor("x", "TYPE_FP32", [4])], "output": [tensor("y", "TYPE_FP32", [4])]})
    python_model(root, "counted", COUNTED_PY, scale_config(1))
    python_model(root, "decoupled", STREAMS_PY, scale_config(1, model_transaction_policy={"decoupled": True}))
    python_model(root, "drip", DRIP_PY.replace("{gate}", drip_gate.code()), {
        "input": [tensor("text_input", "TYPE_STRING", [1])], "output": [tensor("text_output", "TYPE_STRING", [1])],
        "model_transaction_policy": {"decoupled": True}})
    late_gate = Gate(gate_dir, "late")
    python_model(root, "late", LATE_PY.replace("{gate}", late_gate.code()).replace("{outcome!r}", repr(str(gate_dir / "late.outcome"))), {
        "input": [tensor("x", "TYPE_FP32", [4])], "output": [tensor("y", "TYPE_FP32", [4]), tensor("pid", "TYPE_INT64", [1])],
        "model_transaction_policy": {"decoupled": True}})
    python_model(root, "maybe", MAYBE_PY, {"input": [tensor("x", "TYPE_FP32", [4]), {**tensor("scale", "TYPE_FP32", [1]), "optional": True}],
                                           "output": [tensor("y", "TYPE_FP32", [4])]})
    ensemble(root, "maybe_chain", [tensor("x", "TYPE_FP32", [4]), {**tensor("scale", "TYPE_FP32", [1]), "optional": True}],
             [tensor("y", "TYPE_FP32", [4])], [ensemble_step("maybe", {"x": "x", "scale": "scale"}, {"y": "y"})])
    python_model(root, "broken", "import not_a_module_anywhere\n", scale_config(1))
    python_model(root, "classless", "class Other:\n    pass\n", scale_config(1))
    ensemble(root, "fan", [tensor("RAW", "TYPE_FP32", [4])],
             [tensor("SUM", "TYPE_FP32", [4]), tensor("DIFF", "TYPE_FP32", [4])],
             [ensemble_step("double", {"x": "RAW"}, {"y": "TWICE"}), ensemble_step("triple", {"x": "RAW"}, {"y": "THRICE"}),
              ensemble_step("add_sub_ts", {"INPUT0": "TWICE", "INPUT1": "THRICE"}, {"OUTPUT0": "SUM", "OUTPUT1": "DIFF"})])
    python_model(root, "relay", RELAY_PY, {"input": [tensor("x", "TYPE_FP32", [4])], "output": [tensor("about", "TYPE_STRING", [5])]})
    ensemble(root, "described", [tensor("x", "TYPE_FP32", [4])], [tensor("about", "TYPE_STRING", [5])],
             [ensemble_step("describes", {"x": "x"}, {"about": "about"})])
    ensemble(root, "chain", [tensor("x", "TYPE_FP32", [4])], [tensor("y", "TYPE_FP32", [4])],
             [ensemble_step("pre", {"x": "x"}, {"y": "mid"}), ensemble_step("post", {"x": "mid"}, {"y": "y"})])
    metrics_port = free_port()
    server = start_server(root, SERVE_LOAD_MODELS="batched,bounded,source,sink,sends,double,triple,add_sub_ts,scale_ts,scale_sm,caller,crashes,"
                                                  "counted,decoupled,fan,negate,loose,partial,ordered,describes,described,relay,pair,drip,maybe,maybe_chain,late", SERVE_METRICS_PORT=str(metrics_port))
    server.metrics_port = metrics_port
    server.gates = {"batched": batched_gate, "bounded": bounded_gate, "fan": fan_gate, "pair": pair_gates, "drip": drip_gate, "late": late_gate}
    server.finalized = gate_dir / "pair.finalized"
    wait_for(server.ready, 60, "the models did not load")
    return server


CALLER_PY = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            target = pb_utils.get_input_tensor_by_name(request, "model").as_numpy()[0]
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            if target.endswith(b"_sm"):  # a SageMaker handler model takes a body
                body = np.array([json.dumps(x.tolist()).encode()], dtype=np.object_)
                call = pb_utils.InferenceRequest(model_name=target, inputs=[pb_utils.Tensor("body", body)],
                                                 requested_output_names=["body"],
                                                 parameters={"content_type": "application/json"})
            else:
                call = pb_utils.InferenceRequest(model_name=target, inputs=[pb_utils.Tensor("x", x)],
                                                 requested_output_names=["y"])
            answer = call.exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=answer.error()))
                continue
            y = pb_utils.get_output_tensor_by_name(answer, answer.output_tensors()[0].name()).as_numpy()
            if y.dtype == np.object_:
                y = np.array(json.loads(y[0]), np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", y.astype(np.float32))]))
        return responses
"""

# each instance reports its pid; x[0] == 1 or 2 waits at that gate; finalize leaves a mark
PAIR_PY = """
import os
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        x = pb_utils.get_input_tensor_by_name(requests[0], "x").as_numpy()
        if x[0] in (1, 2):
            exec({gates}[int(x[0]) - 1])
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", x), pb_utils.Tensor("count", np.array([os.getpid()], np.int32))])]

    def finalize(self):
        open({finalized}, "a").write("finalized\\n")
"""

DESCRIBES_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("about", np.array(
                    [r.request_id(), r.parameters(), str(r.correlation_id()), str(r.flags()), str(r.timeout())], np.object_))])
                for r in requests]
"""

# Calls `describes` (BLS) with its own request's id, sequence id and flags, and a parameter of its own
RELAY_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(model_name="describes", inputs=[pb_utils.get_input_tensor_by_name(request, "x")],
                                             requested_output_names=["about"], request_id=request.request_id(),
                                             correlation_id=request.correlation_id(), flags=request.flags(),
                                             parameters={"via": "relay"})
            answer = call.exec()
            responses.append(answer if answer.has_error() else pb_utils.InferenceResponse(answer.output_tensors()))
        return responses
"""

NEGATE_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", -pb_utils.get_input_tensor_by_name(r, "x").as_numpy())])
                for r in requests]
"""

# outputs of other types than the config's, as python models often give them (numpy's defaults are
# float64 and int64); x[0] < 0: an array no Triton datatype holds
LOOSE_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        x = pb_utils.get_input_tensor_by_name(requests[0], "x").as_numpy()
        scaled = x * 100.5 if x[0] >= 0 else x.astype(np.complex64)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("scaled", scaled),
                                            pb_utils.Tensor("words", np.array([b"one", b"two"], np.object_))])]
"""
LOOSE_CONFIG = {"input": [tensor("x", "TYPE_FP32", [4])],
                "output": [tensor("scaled", "TYPE_INT8", [4]), tensor("words", "TYPE_INT32", [2])]}

# y when it is among the requested outputs (every declared one when the client names none, as Triton has
# it), `extra` (declared) left out, `undeclared` made though the config has no such output
PARTIAL_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            made = [pb_utils.Tensor("undeclared", x)]
            if "y" in request.requested_output_names():
                made.append(pb_utils.Tensor("y", x * 2))
            responses.append(pb_utils.InferenceResponse(made))
        return responses
"""
PARTIAL_CONFIG = {"input": [tensor("x", "TYPE_FP32", [4])],
                  "output": [tensor("y", "TYPE_FP32", [4]), tensor("extra", "TYPE_FP32", [4])]}

# its outputs in an order of its own: c, a, b, where its config declares a, b, c
ORDERED_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(name, x * factor) for name, factor in
                                                         (("c", 3), ("a", 1), ("b", 2))]))
        return responses
"""
ORDERED_CONFIG = {"input": [tensor("x", "TYPE_FP32", [4])], "output": [tensor(name, "TYPE_FP32", [4]) for name in "abc"]}

# x[0] responses y = i·x, each from a thread after execute has returned; x[1] < 0: the second is an error,
# x[1] < -1: the first too
STREAMS_PY = """
import threading
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            threading.Thread(target=self.answer, args=(request.get_response_sender(), x)).start()

    def answer(self, sender, x):
        for i in range(int(x[0])):
            if (i == 1 and x[1] < 0) or (i == 0 and x[1] < -1):
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("x[1] is negative")))
                continue
            count = np.array([i], np.int32)
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("y", x * i), pb_utils.Tensor("count", count)]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

# a token, then (past the gate) another, as a text model streams what it makes
DRIP_PY = """
import threading
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()[0].decode()
            threading.Thread(target=self.answer, args=(request.get_response_sender(), text)).start()

    def answer(self, sender, text):
        for token in (1, 2):
            if token == 2:
                {gate}
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("text_output", np.array([f"{text} {token}"], np.object_))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

# y = x and the instance's pid, then the final flag; x[0] < 0: execute raises while a thread of the model
# still holds the request's sender, and tries to answer once the gate opens, writing how that went
LATE_PY = """
import os
import threading
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        [request] = requests
        x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
        sender = request.get_response_sender()
        if x[0] == -3:
            os._exit(3)
        if x[0] < 0:
            threading.Thread(target=self.late, args=(sender, x)).start()
            raise ValueError("x[0] is negative")
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("y", x), pb_utils.Tensor("pid", np.array([os.getpid()], np.int64))]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def late(self, sender, x):
        {gate}
        try:
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("y", x)]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            outcome = "sent"
        except pb_utils.TritonModelException as exc:
            outcome = str(exc)
        with open({outcome!r} + ".part", "w") as file:
            file.write(outcome)
        os.rename({outcome!r} + ".part", {outcome!r})
"""

# x·scale, or x when the request leaves the optional `scale` out
MAYBE_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            scale = pb_utils.get_input_tensor_by_name(request, "scale")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", x if scale is None else x * scale.as_numpy())]))
        return responses
"""

CRASHES_PY = """
import os
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        x = pb_utils.get_input_tensor_by_name(requests[0], "x").as_numpy()
        if x[0] == 13:
            os._exit(3)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", x), pb_utils.Tensor("count", np.array([os.getpid()], np.int32))])]
"""

COUNTED_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.counted = pb_utils.MetricFamily("my_requests_total", "Requests counted by the model itself",
                                             pb_utils.MetricFamily.COUNTER)  # kept: Triton ends its metrics with it
        self.requests = self.counted.Metric(labels={"model": args["model_name"]})
        self.seen = pb_utils.MetricFamily("my_sizes", "Sizes seen", pb_utils.MetricFamily.HISTOGRAM)
        self.sizes = self.seen.Metric(labels={}, buckets=[1.0, 10.0])

    def execute(self, requests):
        self.requests.increment(len(requests))
        x = pb_utils.get_input_tensor_by_name(requests[0], "x").as_numpy()
        self.sizes.observe(float(x[0]))
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", x), pb_utils.Tensor("count", np.array([1], np.int32))])]
"""


def test_a_batch_reaches_execute_as_a_list_and_a_bad_request_fails_alone(server):
    gate = server.gates["batched"]
    with ThreadPoolExecutor(5) as pool:
        first = pool.submit(infer, server, "batched", [[-1, 0, 0, 0]])
        gate.wait_entered()
        queued = [pool.submit(infer, server, "batched", [[v, 1, 1, 1]]) for v in (1, 2, -5, 3)]
        wait_for(lambda: server.metrics().get(("serve_queue_depth", (("model", "batched"),))) == 4, 30,
                 "the four requests did not queue behind the gated one")
        gate.release()
        assert first.result().status_code == 200
        answers = [f.result() for f in queued]
    good = [answers[i] for i in (0, 1, 3)]
    assert [a.status_code for a in good] == [200, 200, 200]
    assert [output(a, "count")[0][0] for a in good] == [4, 4, 4]  # one execute held all four requests
    assert [output(a)[0][0] for a in good] == [2, 4, 6]
    assert answers[2].status_code == 400 and answers[2].json() == {"error": "x must not be negative"}
    assert stats(server, "batched")["fail"]["count"] == 1


def test_a_full_queue_refuses_in_tritons_words_and_counts_no_failed_inference_as_triton_does(server):
    gate = server.gates["bounded"]
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(infer, server, "bounded", [[-1, 0, 0, 0]])
        gate.wait_entered()
        queued = pool.submit(infer, server, "bounded", [[1, 1, 1, 1]])
        wait_for(lambda: server.metrics().get(("serve_queue_depth", (("model", "bounded"),))) == 1, 30,
                 "the second request did not queue behind the gated one")
        refused = infer(server, "bounded", [[2, 2, 2, 2]])
        gate.release()
        assert [running.result().status_code, queued.result().status_code] == [200, 200]
    assert refused.status_code == 503 and refused.headers["Retry-After"]
    assert refused.json()["error"].startswith("Exceeds maximum queue size: the queue for priority 1 holds its most")
    assert {k: stats(server, "bounded")[k]["count"] for k in ("success", "fail")} == {"success": 2, "fail": 0}
    assert server.metrics()[("nv_inference_request_failure_total", (("model", "bounded"), ("reason", "REJECTED"), ("version", "1")))] == 0


@pytest.mark.parametrize("target", ["scale_ts", "double", "scale_sm"])
def test_bls_reaches_every_kind_of_model_through_the_core(server, target):
    before = stats(server, target)["success"]["count"]
    body = {"inputs": [{"name": "model", "datatype": "BYTES", "shape": [1], "data": [target]},
                       {"name": "x", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]}
    answer = server.request("POST", "/v2/models/caller/infer", json=body)
    assert answer.status_code == 200, answer.text
    assert output(answer).tolist() == [2, 4, 6, 8]
    assert stats(server, target)["success"]["count"] == before + 1  # counted as the target's own request


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_execute_sees_the_requests_id_its_parameters_and_its_properties_apart(server, protocol):
    """As Triton's front-ends do: a sequence's id and flags and the timeout are the request's properties
    (`correlation_id()`, `flags()`, `timeout()`), not among its `parameters()`; nor are its priority
    and how the answer is encoded."""
    parameters = {"tag": "blue", "priority": 0, "sequence_id": 42, "sequence_start": True, "timeout": 5_000_000}
    if protocol == "http":
        answer = server.request("POST", "/v2/models/describes/infer", json={
            "id": "req-7", "parameters": {**parameters, "binary_data_output": False},
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]})
        assert answer.status_code == 200, answer.text
        about = output(answer, "about").tolist()
    else:
        with grpc_clients.InferenceServerClient(server.grpc_url) as client:
            sent = grpcclient.InferInput("x", [4], "FP32")
            sent.set_data_from_numpy(np.array([1, 2, 3, 4], np.float32))
            result = client.infer("describes", [sent], request_id="req-7", parameters={"tag": "blue"}, sequence_id=42,
                                  sequence_start=True, priority=0, timeout=5_000_000, client_timeout=30)
        about = [value.decode() for value in result.as_numpy("about").tolist()]
    request_id, model_parameters, correlation_id, flags, timeout = about
    assert (request_id, model_parameters) == ("req-7", '{"tag":"blue"}')  # Triton's compact JSON
    assert (correlation_id, flags, timeout) == ("42", "1", "5000000")  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START


def test_a_bls_request_carries_its_id_sequence_id_and_flags_to_the_model_it_calls(server):
    answer = server.request("POST", "/v2/models/relay/infer", json={
        "id": "relayed-1", "parameters": {"sequence_id": 7, "sequence_end": True},
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]})
    assert answer.status_code == 200, answer.text
    request_id, parameters, correlation_id, flags, _ = output(answer, "about").tolist()
    assert (request_id, json.loads(parameters), correlation_id, flags) == ("relayed-1", {"via": "relay"}, "7", "2")  # SEQUENCE_END


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_ensembles_step_sees_the_ensemble_requests_id_and_parameters(server, protocol):
    """As Triton's steps do: a python model in an ensemble reads what the client sent the ensemble."""
    if protocol == "http":
        answer = server.request("POST", "/v2/models/described/infer", json={
            "id": "req-9", "parameters": {"tag": "red", "temperature": 0.25},
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]})
        assert answer.status_code == 200, answer.text
        request_id, parameters, *_ = output(answer, "about").tolist()
    else:
        with grpc_clients.InferenceServerClient(server.grpc_url) as client:
            sent = grpcclient.InferInput("x", [4], "FP32")
            sent.set_data_from_numpy(np.array([1, 2, 3, 4], np.float32))
            result = client.infer("described", [sent], request_id="req-9", parameters={"tag": "red", "temperature": 0.25},
                                  client_timeout=30)
        request_id, parameters, *_ = (value.decode() for value in result.as_numpy("about").tolist())
    assert request_id == "req-9" and json.loads(parameters) == {"tag": "red", "temperature": 0.25}


def test_generate_hands_a_python_model_its_id_and_parameters(server):
    answer = server.request("POST", "/v2/models/describes/generate", json={
        "id": "req-8", "x": [1, 2, 3, 4], "tag": "green", "parameters": {"temperature": 0.5, "stream": False}})
    assert answer.status_code == 200, answer.text
    about = answer.json()
    request_id, parameters, *_ = about.pop("about")
    assert about == {"id": "req-8", "model_name": "describes", "model_version": "1"}
    assert request_id == "req-8" and json.loads(parameters) == {"tag": "green", "temperature": 0.5, "stream": False}


@pytest.mark.parametrize("x, status, answer", [
    ([1, 5, 5, 5], 200, {"model_name": "decoupled", "model_version": "1", "y": [0, 0, 0, 0], "count": 0}),
    ([3, 1, 1, 1], 400, {"error": "model 'decoupled' sent 3 responses to the request; /generate answers with exactly one (generate_stream sends each)"}),
    ([0, 1, 1, 1], 400, {"error": "model 'decoupled' sent 0 responses to the request; /generate answers with exactly one (generate_stream sends each)"}),
    ([2, -1, 1, 1], 500, {"error": "x[1] is negative"}),
])
def test_generate_takes_a_decoupled_models_one_response(server, x, status, answer):
    reply = server.request("POST", "/v2/models/decoupled/generate", json={"x": x})
    assert (reply.status_code, reply.json()) == (status, answer)


def events(reply: requests.Response) -> list[dict]:
    return [json.loads(line.removeprefix(b"data: ")) for line in reply.iter_lines() if line]


def test_generate_stream_sends_each_response_as_the_model_makes_it(server):
    """The first event arrives while the model is held before its second: nothing waits for the end."""
    url = server.url + "/v2/models/drip/generate_stream"
    with requests.post(url, json={"text_input": "hi", "id": "s1"}, stream=True, timeout=60) as reply:
        assert (reply.status_code, reply.headers["Content-Type"]) == (200, "text/event-stream; charset=utf-8")
        lines = reply.iter_lines()
        first = next(line for line in lines if line)
        assert json.loads(first.removeprefix(b"data: ")) == \
            {"id": "s1", "model_name": "drip", "model_version": "1", "text_output": "hi 1"}
        server.gates["drip"].wait_entered()
        server.gates["drip"].release()
        rest = [json.loads(line.removeprefix(b"data: ")) for line in lines if line]
    assert rest == [{"id": "s1", "model_name": "drip", "model_version": "1", "text_output": "hi 2"}]


@pytest.mark.parametrize("x, status, stream", [
    ([2, 3, 3, 3], 200, [{"y": [0, 0, 0, 0], "count": 0}, {"y": [2, 3, 3, 3], "count": 1}]),
    ([2, -1, 1, 1], 200, [{"y": [0, 0, 0, 0], "count": 0}, {"error": "x[1] is negative"}]),  # an error after a 200
    ([2, -2, 1, 1], 500, [{"error": "x[1] is negative"}, {"error": "x[1] is negative"}]),  # the first: its status
    ([0, 1, 1, 1], 200, []),  # the final flag alone
])
def test_generate_stream_sends_each_response_or_error_as_an_event(server, x, status, stream):
    with requests.post(server.url + "/v2/models/decoupled/generate_stream", json={"x": x}, stream=True, timeout=60) as reply:
        assert (reply.status_code, reply.headers["Content-Type"]) == (status, "text/event-stream; charset=utf-8")
        answers = events(reply)
    assert [{k: v for k, v in a.items() if k not in ("model_name", "model_version")} for a in answers] == stream


def test_a_decoupled_models_responses_are_counted_by_their_place_in_the_stream(server):
    def counts() -> dict:
        places = server.request("GET", "/v2/models/decoupled/stats").json()["model_stats"][0]["response_stats"]
        return {(place, kind): entry["count"] for place, kinds in places.items() for kind, entry in kinds.items()}

    before = counts()
    with requests.post(server.url + "/v2/models/decoupled/generate_stream", json={"x": [3, -1, 1, 1]}, stream=True,
                       timeout=60) as reply:
        # each event's keys in order, as Triton writes them
        assert [list(a) for a in events(reply)] == [["count", "model_name", "model_version", "y"], ["error"],
                                                     ["count", "model_name", "model_version", "y"]]
    grew = {key: n - before.get(key, 0) for key, n in counts().items() if n != before.get(key, 0)}
    assert grew == {("0", "success"): 1, ("0", "compute_infer"): 1, ("1", "fail"): 1, ("1", "compute_infer"): 1,
                    ("2", "success"): 1, ("2", "compute_infer"): 1, ("3", "empty_response"): 1}
    with grpc_clients.InferenceServerClient(server.grpc_url) as client:
        over_grpc = client.get_inference_statistics("decoupled", as_json=True)["model_stats"][0]["response_stats"]
    assert int(over_grpc["3"]["empty_response"]["count"]) == counts()[("3", "empty_response")]


@pytest.mark.parametrize("path, body, status, message", [
    ("/v2/models/nobody/generate_stream", {"x": [1, 2, 3, 4]}, 404, "Request for unknown model: 'nobody' is not found"),
    ("/v2/models/decoupled/generate_stream", {"x": [1, 2]}, 400, "input 'x': 2 value(s) do not fill its shape [4]"),
    ("/v2/models/decoupled/versions/x/generate_stream", {}, 400, "failed to get model version from specified version string 'x' (details: stol), version should be an integral value > 0"),
])
def test_a_stream_refused_before_its_first_response_is_an_error_answer(server, path, body, status, message):
    reply = server.request("POST", path, json=body)
    assert (reply.status_code, reply.headers["Content-Type"], reply.json()) == \
        (status, "application/json", {"error": message})


@pytest.mark.parametrize("model", ["maybe", "maybe_chain"])
@pytest.mark.parametrize("scale, y", [([3], [3, 6, 9, 12]), (None, [1, 2, 3, 4])])
def test_an_optional_input_left_out_reaches_the_model_as_none(server, model, scale, y):
    """In a python model, and through an ensemble that maps it to one: `get_input_tensor_by_name` is None."""
    inputs = [{"name": "x", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]
    if scale is not None:
        inputs.append({"name": "scale", "datatype": "FP32", "shape": [1], "data": scale})
    answer = server.request("POST", f"/v2/models/{model}/infer", json={"inputs": inputs})
    assert answer.status_code == 200, answer.text
    assert output(answer).tolist() == y


def test_a_bls_error_is_returned_as_triton_returns_it(server):
    body = {"inputs": [{"name": "model", "datatype": "BYTES", "shape": [1], "data": ["nope"]},
                       {"name": "x", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]}
    answer = server.request("POST", "/v2/models/caller/infer", json=body)
    assert answer.status_code == 404 and answer.json() == {"error": "model 'nope' is not loaded"}


def test_ensemble_runs_independent_steps_at_once_and_joins_them(server):
    gate = server.gates["fan"]
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(server.request, "POST", "/v2/models/fan/infer", json={
            "inputs": [{"name": "RAW", "datatype": "FP32", "shape": [4], "data": [-1, 2, 3, 4]}]})
        gate.wait_entered()  # `double` holds at its gate; `triple` reads the same input and runs meanwhile
        wait_for(lambda: stats(server, "triple")["success"]["count"] >= 1, 30, "the fan-out did not run at once")
        gate.release()
        answer = pending.result()
    assert answer.status_code == 200, answer.text
    assert output(answer, "SUM").tolist() == [-5, 10, 15, 20] and output(answer, "DIFF").tolist() == [1, -2, -3, -4]
    for name in ("fan", "double", "triple", "add_sub_ts"):
        assert stats(server, name)["success"]["count"] >= 1
    metrics = server.metrics()
    assert metrics[("nv_inference_request_success_total", (("model", "fan"), ("version", "1")))] >= 1
    memory = {m: metrics[("serve_model_memory_bytes", (("device", "cpu"), ("model", m)))] for m in ("fan", "double", "triple", "add_sub_ts")}
    assert memory["fan"] == memory["double"] + memory["triple"] + memory["add_sub_ts"] > 0  # counted in the ensemble's


def test_an_ensemble_counts_an_execution_for_each_request_it_ran_as_triton_does(server):
    def executions() -> tuple[int, int]:
        [entry] = server.request("GET", "/v2/models/fan/stats").json()["model_stats"]
        ones = [b["compute_infer"]["count"] for b in entry["batch_stats"] if b["batch_size"] == 1]
        return entry["execution_count"], sum(ones)

    before = executions()
    for first in (1, -7):  # the second fails in a step: no execution of the ensemble
        server.request("POST", "/v2/models/fan/infer", json={
            "inputs": [{"name": "RAW", "datatype": "FP32", "shape": [4], "data": [first, 2, 3, 4]}]})
    assert [after - earlier for after, earlier in zip(executions(), before, strict=True)] == [1, 1]


def test_an_ensemble_step_error_answers_the_request_with_it(server):
    answer = server.request("POST", "/v2/models/fan/infer", json={
        "inputs": [{"name": "RAW", "datatype": "FP32", "shape": [4], "data": [-7, 2, 3, 4]}]})
    assert answer.status_code == 400 and answer.json() == {"error": "in ensemble 'fan', x must not be negative"}  # Triton's words
    assert server.request("GET", "/v2/models/fan/ready").status_code == 200


def test_unload_dependents_unloads_what_the_ensemble_loaded(server):
    repository = "/v2/repository/models"
    assert server.request("POST", f"{repository}/chain/load").status_code == 200
    assert all(server.request("GET", f"/v2/models/{m}/ready").status_code == 200 for m in ("chain", "pre", "post"))
    answer = infer(server, "chain", [1, 2, 3, 4])
    assert answer.status_code == 200 and output(answer).tolist() == [1, 2, 3, 4]
    assert server.request("POST", f"{repository}/chain/unload",
                          json={"parameters": {"unload_dependents": True}}).status_code == 200
    assert all(server.request("GET", f"/v2/models/{m}/ready").status_code != 200 for m in ("chain", "pre", "post"))
    # without the parameter, the composing models stay
    assert server.request("POST", f"{repository}/chain/load").status_code == 200
    assert server.request("POST", f"{repository}/chain/unload").status_code == 200
    assert all(server.request("GET", f"/v2/models/{m}/ready").status_code == 200 for m in ("pre", "post"))


def test_an_ensemble_naming_a_missing_tensor_does_not_load(server):
    ensemble(server.model_root, "miswired", [tensor("x", "TYPE_FP32", [4])], [tensor("y", "TYPE_FP32", [4])],
             [ensemble_step("pre", {"nope": "x"}, {"y": "y"})])
    answer = server.request("POST", "/v2/repository/models/miswired/load")
    assert answer.status_code == 400 and "has no input(s) ['nope']" in answer.json()["error"]


def test_a_crash_in_model_py_fails_only_that_model_and_it_restarts(server):
    first = infer(server, "crashes", [1, 2, 3, 4])
    assert first.status_code == 200
    crashed = infer(server, "crashes", [13, 0, 0, 0])
    assert crashed.status_code == 500 and "exited with code 3" in crashed.json()["error"]
    assert infer(server, "double", [1, 2, 3, 4]).status_code == 200  # the other models serve on
    again = infer(server, "crashes", [1, 2, 3, 4])
    assert again.status_code == 200 and output(again, "count")[0] != output(first, "count")[0]  # a new process


def test_each_instance_is_a_process_of_its_own_and_they_run_at_once(server):
    first, second = server.gates["pair"]
    with ThreadPoolExecutor(2) as pool:
        answers = [pool.submit(infer, server, "pair", [n, 0, 0, 0]) for n in (1, 2)]
        first.wait_entered()
        second.wait_entered()  # both instances hold a request at once
        first.release()
        second.release()
        pids = [output(a.result(), "count")[0] for a in answers]
    assert len(set(pids)) == 2
    assert server.request("POST", "/v2/repository/models/pair/unload").status_code == 200
    wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in pids), 30, "the instances did not end")
    assert server.finalized.read_text() == "finalized\n" * 2  # each instance's finalize ran first


def test_custom_metrics_appear_in_metrics_and_on_the_metrics_port(server):
    for _ in range(2):
        assert infer(server, "counted", [5, 0, 0, 0]).status_code == 200
    metrics = server.metrics()
    assert metrics[("my_requests_total", (("model", "counted"),))] == 2
    assert metrics[("my_sizes_bucket", (("le", "10.0"),))] == 2 and metrics[("my_sizes_count", ())] == 2
    scraped = requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10)
    assert scraped.status_code == 200 and 'my_requests_total{model="counted"} 2' in scraped.text
    assert requests.get(f"http://127.0.0.1:{server.metrics_port}/v2/models/counted", timeout=10).status_code == 404


def test_a_python_model_serves_every_protocol(server):
    invoked = server.request("POST", "/models/double/invoke", json=[1, 2, 3, 4])
    assert invoked.status_code == 200 and invoked.json() == {"y": [2, 4, 6, 8], "count": [1]}
    body = io.BytesIO()
    np.save(body, np.array([1, 2, 3, 4], np.float32))
    npy = server.request("POST", "/models/negate/invoke", data=body.getvalue(),
                         headers={"Content-Type": "application/x-npy", "Accept": "application/x-npy"})
    assert npy.status_code == 200 and np.load(io.BytesIO(npy.content)).tolist() == [-1, -2, -3, -4]
    predicted = server.request("POST", "/v1/models/double:predict", json={"inputs": {"x": [1, 2, 3, 4]}})
    assert predicted.status_code == 200 and predicted.json() == {"outputs": {"y": [2, 4, 6, 8], "count": [1]}}
    with grpc_clients.InferenceServerClient(server.grpc_url) as client:
        x = grpcclient.InferInput("x", [4], "FP32")
        x.set_data_from_numpy(np.array([1, 2, 3, 4], np.float32))
        assert client.infer("double", [x]).as_numpy("y").tolist() == [2, 4, 6, 8]


@pytest.mark.parametrize("protocol", ["json", "binary", "grpc"])
def test_outputs_of_other_types_than_declared_are_answered_as_the_model_made_them_as_in_triton(server, protocol):
    """Triton's python backend sends an output in the type the model gave it; cast to the config's INT8,
    302 wrapped to 46."""
    x = np.array([1, 2, 3, 4], np.float32)
    if protocol == "json":
        answer = infer(server, "loose", x)
        assert answer.status_code == 200, answer.text
        kinds = {o["name"]: (o["datatype"], o["data"]) for o in answer.json()["outputs"]}
        assert kinds == {"scaled": ("FP32", [100.5, 201.0, 301.5, 402.0]), "words": ("BYTES", ["one", "two"])}
        return
    module = httpclient if protocol == "binary" else grpcclient
    with _client(module, server.url.removeprefix("http://") if module is httpclient else server.grpc_url) as client:
        outputs = [module.InferRequestedOutput(name, **({"binary_data": True} if module is httpclient else {}))
                   for name in ("scaled", "words")]
        answer = client.infer("loose", tensors(module, {"x": x}), outputs=outputs)
    assert answer.as_numpy("scaled").dtype == np.float32 and answer.as_numpy("scaled").tolist() == [100.5, 201.0, 301.5, 402.0]
    assert answer.as_numpy("words").tolist() == [b"one", b"two"]


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_outputs_a_python_model_leaves_out_are_left_out_of_the_answer_as_in_triton(server, module):
    """Triton answers with the outputs the model made: a declared one left out (asked for or not) is
    absent, and one the config does not declare is dropped (a 500 here, a KeyError, before). A request
    that names no output asks for every one (requested_output_names() was empty)."""
    with _client(module, server.url.removeprefix("http://") if module is httpclient else server.grpc_url) as client:
        made = client.infer("partial", tensors(module, {"x": np.array([1, 2, 3, 4], np.float32)}))
        asked = client.infer("partial", tensors(module, {"x": np.array([1, 2, 3, 4], np.float32)}),
                             outputs=[module.InferRequestedOutput("extra")])
    named = [o["name"] for o in made.get_response()["outputs"]] if module is httpclient else \
        [o.name for o in made.get_response().outputs]
    assert named == ["y"] and made.as_numpy("y").tolist() == [2, 4, 6, 8]
    assert asked.as_numpy("extra") is None and asked.as_numpy("y") is None


@pytest.mark.parametrize("asked, answered", [(None, ["c", "a", "b"]), (["a", "c"], ["c", "a"]), (["b", "a"], ["a", "b"])])
@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_a_python_models_outputs_come_in_the_order_it_made_them_as_in_triton(server, module, asked, answered):
    """tritonserver's python backend answers the outputs in the order the model made them, those the request
    names, whatever order it names them in (measured on 2.51), where this server answered in its config's order
    or the request's: a client that reads them by place read another output."""
    with _client(module, server.url.removeprefix("http://") if module is httpclient else server.grpc_url) as client:
        outputs = None if asked is None else [module.InferRequestedOutput(name) for name in asked]
        answer = client.infer("ordered", tensors(module, {"x": np.array([1, 2, 3, 4], np.float32)}), outputs=outputs)
    entries = answer.get_response()["outputs"] if module is httpclient else answer.get_response().outputs
    assert [entry["name"] if module is httpclient else entry.name for entry in entries] == answered
    factors = {"a": 1, "b": 2, "c": 3}  # as the model makes them
    assert {name: answer.as_numpy(name).tolist() for name in answered} == \
        {name: [factors[name] * v for v in (1, 2, 3, 4)] for name in answered}


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_a_torchscript_models_outputs_come_in_its_configs_order_as_in_triton(server, module):
    """Triton's PyTorch backend answers the outputs its config declares, in that order, those the request names
    (its ReadOutputTensors walks the config's outputs), where this server answered in the request's order."""
    with _client(module, server.url.removeprefix("http://") if module is httpclient else server.grpc_url) as client:
        x = np.array([1, 2, 3, 4], np.float32)
        answer = client.infer("add_sub_ts", tensors(module, {"INPUT0": x, "INPUT1": x}),
                              outputs=[module.InferRequestedOutput(name) for name in ("OUTPUT1", "OUTPUT0")])
    entries = answer.get_response()["outputs"] if module is httpclient else answer.get_response().outputs
    assert [entry["name"] if module is httpclient else entry.name for entry in entries] == ["OUTPUT0", "OUTPUT1"]
    assert answer.as_numpy("OUTPUT0").tolist() == [2, 4, 6, 8] and answer.as_numpy("OUTPUT1").tolist() == [0, 0, 0, 0]


def test_an_output_no_triton_datatype_holds_fails_its_request_naming_it(server):
    answer = infer(server, "loose", [-1, 2, 3, 4])
    assert answer.status_code == 500
    assert "tensor 'scaled' is complex64, which no Triton datatype holds" in answer.json()["error"]
    assert infer(server, "loose", [1, 2, 3, 4]).status_code == 200


SOURCE_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("n", np.array([len(r.inputs())], np.int32))]) for r in requests]
"""
SINK_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([]) for _ in requests]
"""


SENDS_PY = """
import threading
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    \"\"\"Not decoupled, answering through each request's response sender as x[0] says: 0 the response with the
    final flag, 1 the response then the flag alone, 2 from a thread once execute has returned, 3 the flag
    alone, 4 two responses, 5 nothing, and returns None (a model that forgot to return its responses).\"\"\"

    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            how = int(x[0])
            if how == 5:
                continue
            sender = request.get_response_sender()
            response = pb_utils.InferenceResponse([pb_utils.Tensor("y", x * 2)])
            if how == 0:
                sender.send(response, flags=FINAL)
            elif how == 1:
                sender.send(response)
                sender.send(flags=FINAL)
            elif how == 2:
                threading.Thread(target=sender.send, args=(response, FINAL)).start()
            elif how == 3:
                sender.send(flags=FINAL)
            elif how == 4:
                sender.send(response)
                sender.send(response, flags=FINAL)
        return None
"""


@pytest.mark.parametrize("how, status, answer", [
    (0, 200, [0, 2, 4, 6]),
    (1, 200, [2, 2, 4, 6]),
    (2, 200, [4, 2, 4, 6]),
    (3, 500, "Unable to send response. Non-decoupled model cannot send complete final before sending a response."),
    (4, 500, "Unable to send response. Non-decoupled model cannot send more than one response."),
    (5, 500, "execute of model 'sends' must return a list of one InferenceResponse per request: 1 requests, NoneType"),
])
def test_a_model_that_is_not_decoupled_may_answer_through_its_response_sender_as_on_triton(server, how, status, answer):
    """As tritonserver 2.51 answers each (Triton's python backend allows it since 23.10), in its words."""
    response = infer(server, "sends", [how, 1, 2, 3])
    assert response.status_code == status
    assert (output(response).tolist() if status == 200 else response.json()["error"]) == answer


def test_a_python_model_may_take_no_tensors_or_answer_none_as_on_triton(server):
    """As tritonserver 2.51 serves them: a config without inputs, or without outputs, is a python model's own
    business; a request to the first sends none, the second answers none."""
    assert server.request("POST", "/v2/models/source/infer", json={"inputs": []}).json()["outputs"] == [
        {"name": "n", "datatype": "INT32", "shape": [1], "data": [0]}]
    assert server.request("POST", "/v2/models/sink/infer", json={
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]}).json()["outputs"] == []
    assert server.request("GET", "/v2/models/source").json()["inputs"] == []
    with grpc_clients.InferenceServerClient(server.grpc_url) as client:
        assert client.infer("source", []).as_numpy("n").tolist() == [0]
        assert client.infer("sink", tensors(grpcclient, {"x": np.ones(4, np.float32)})).get_response().outputs == []
    refused = server.request("POST", "/v2/models/source/infer", json={
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]})
    assert refused.status_code == 400 and refused.json() == {"error": "unknown input 'x'; the model takes none"}
    assert server.request("POST", "/v2/models/sink/infer", json={"inputs": []}).json() == {
        "error": "missing input(s) ['x']; the model takes 'x' FP32[4]"}
    assert server.request("POST", "/v2/models/source/infer", json={"inputs": []}).status_code == 200  # and serves on


def test_a_python_model_without_a_config_loads_and_a_batching_one_without_inputs_is_refused(server):
    assert server.request("POST", "/v2/repository/models/configless/load").status_code == 200
    answer = server.request("POST", "/v2/models/configless/infer", json={"inputs": []})
    assert answer.status_code == 200 and answer.json()["outputs"] == []  # what no config declares is not sent, as on Triton
    refused = server.request("POST", "/v2/repository/models/batching_source/load")
    assert refused.status_code == 400 and refused.json() == {"error": (
        "failed to load 'batching_source', a batching model takes each request's batch size from its inputs: "
        "declare one, or set max_batch_size 0")}  # Triton loads it, then fails each request: out of bounds index 0


def test_a_decoupled_model_is_refused_over_unary_endpoints_in_tritons_words_and_status(server):
    answer = infer(server, "decoupled", [1, 2, 3, 4])
    assert answer.status_code == 501
    assert answer.json() == {"error": "HTTP end point doesn't support models with decoupled transaction policy"}
    with grpc_clients.InferenceServerClient(server.grpc_url) as client:
        x = grpcclient.InferInput("x", [4], "FP32")
        x.set_data_from_numpy(np.array([1, 2, 3, 4], np.float32))
        with pytest.raises(InferenceServerException) as refused:
            client.infer("decoupled", [x])
    assert refused.value.status() == str(grpc.StatusCode.UNIMPLEMENTED)
    assert "ModelInfer RPC doesn't support models with decoupled transaction policy" in refused.value.message()


def stream(server, values: list, model: str = "decoupled", **options) -> list:
    """Each request of `values` on one gRPC stream; every response (result or error) until the stream ends."""
    answers = []
    with grpc_clients.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.append(error or result))
        for index, value in enumerate(values):
            x = grpcclient.InferInput("x", [4], "FP32")
            x.set_data_from_numpy(np.array(value, np.float32))
            client.async_stream_infer(model, [x], request_id=str(index), **options)
        client.stop_stream()  # waits for the answers under way
    return answers


def test_a_decoupled_model_streams_its_responses_over_grpc_each_with_its_final_flag(server):
    answers = stream(server, [[3, 1, 1, 1], [0, 1, 1, 1], [2, 5, 5, 5]])
    by_request, flags = {}, set()
    for answer in answers:
        by_request.setdefault(answer.get_response().id, []).append(answer.as_numpy("count")[0])
        parameters = answer.get_response().parameters
        flags.add(parameters["triton_final_response"].bool_param if "triton_final_response" in parameters else None)
    assert by_request == {"0": [0, 1, 2], "2": [0, 1]}  # a request may have no response at all
    assert flags == {False}  # as tritonserver 2.51 marks them; the final flag alone was not asked for
    assert stats(server, "decoupled")["success"]["count"] >= 3


def test_a_response_sent_after_a_decoupled_execute_raised_reaches_nobody(server, gate_dir):
    """execute raised while a thread of the model still held the request's sender: the request is answered
    with the error, and the thread's later response raises in the model (its sender is closed) rather than
    reach the model process, where it was read as the next request's answer (or, since idle instances are
    looked at, ended the instance)."""
    [before] = stream(server, [[1, 2, 3, 4]], model="late")
    [failed] = stream(server, [[-1, 2, 3, 4]], model="late")
    assert isinstance(failed, InferenceServerException) and "x[0] is negative" in failed.message()
    server.gates["late"].release()
    outcome = wait_for(lambda: (gate_dir / "late.outcome").exists() and (gate_dir / "late.outcome").read_text(), 30,
                       "the model's thread did not try to answer")
    assert outcome == "the response sender is closed: execute raised, and its requests were answered with its error"
    [after] = stream(server, [[5, 6, 7, 8]], model="late")
    assert after.as_numpy("y").tolist() == [5, 6, 7, 8] and after.as_numpy("pid")[0] == before.as_numpy("pid")[0]


def test_a_decoupled_model_whose_process_dies_fails_its_stream_alone(server):
    """The stream's answer is the error, and the instance is started again for the next request (the error
    also once went to the log as a greenlet that failed, which the server's teardown now refuses)."""
    [died] = stream(server, [[-3, 0, 0, 0]], model="late")
    assert isinstance(died, InferenceServerException) and "exited with code 3 in execute" in died.message()
    [after] = stream(server, [[5, 6, 7, 8]], model="late")
    assert after.as_numpy("y").tolist() == [5, 6, 7, 8]


def test_a_decoupled_error_fails_one_response_and_the_final_flag_is_shown_when_asked(server):
    answers = stream(server, [[3, -1, 1, 1]], enable_empty_final_response=True)
    assert isinstance(answers[1], InferenceServerException) and "x[1] is negative" in answers[1].message()
    results = [a.get_response() for a in answers if not isinstance(a, InferenceServerException)]
    assert [r.parameters["triton_final_response"].bool_param for r in results] == [False, False, True]
    assert len(results[-1].outputs) == 0  # the final flag alone


@pytest.mark.parametrize("model, error", [
    ("broken", "model.py of model 'broken' failed to import: ModuleNotFoundError"),
    ("classless", "model.py of model 'classless' defines no class TritonPythonModel"),
])
def test_a_model_py_that_cannot_serve_fails_its_load_with_the_reason(server, model, error):
    answer = server.request("POST", f"/v2/repository/models/{model}/load")
    assert answer.status_code == 400 and error in answer.json()["error"]
    assert server.request("GET", "/v2/health/live").status_code == 200


def test_tritons_http_client_reads_the_python_models_metadata(server):
    with httpclient.InferenceServerClient(server.url.removeprefix("http://")) as client:
        metadata = client.get_model_metadata("double")
    assert metadata["platform"] == "python" and [i["name"] for i in metadata["inputs"]] == ["x"]


# -- bounds: a hang and memory -----------------------------------------------------------------------------


HANGS_PY = """
import threading
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        if args["model_name"] == "hangs_initialize":
            threading.Event().wait()

    def execute(self, requests):
        x = pb_utils.get_input_tensor_by_name(requests[0], "x").as_numpy()
        if x[0] == 7:
            threading.Event().wait()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", x), pb_utils.Tensor("count", np.array([1], np.int32))])]
"""

HOLDS_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.weights = np.ones({size} // 8)  # pages of its own, in its own process

    def execute(self, requests):
        x = pb_utils.get_input_tensor_by_name(requests[0], "x").as_numpy()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", x), pb_utils.Tensor("count", np.array([1], np.int32))])]
"""


@pytest.fixture(scope="module")
def bounded(start_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("bounded")
    python_model(root, "hangs_execute", HANGS_PY, scale_config(1))
    python_model(root, "hangs_initialize", HANGS_PY, scale_config(1))
    for name in ("big_a", "big_b"):
        python_model(root, name, HOLDS_PY.replace("{size}", str(100 * MIB)), scale_config(1))
    return start_server(root, SERVE_LOAD_TIMEOUT="2", SERVE_PYTHON_RESPONSE_TIMEOUT="2",
                        SERVE_MEMORY_LIMIT="150MiB")


def test_a_hang_in_execute_is_bounded_and_the_instance_restarts(bounded):
    assert bounded.load("hangs_execute").status_code == 200
    answer = infer(bounded, "hangs_execute", [7, 0, 0, 0])
    assert answer.status_code == 500
    assert answer.json() == {"error": "model 'hangs_execute' did not finish execute within 2 s; its worker process "
                                      "was killed, and the next request starts it again"}
    assert infer(bounded, "hangs_execute", [1, 0, 0, 0]).status_code == 200


def test_a_hang_in_initialize_fails_the_load_within_the_load_timeout(bounded):
    """The answer says the model did not load (it once promised that the next request would start it)."""
    answer = bounded.load("hangs_initialize")
    assert answer.status_code == 500
    assert answer.json() == {"error": "model 'hangs_initialize' did not finish initialize within 2 s; its worker process "
                                      "was killed, and the model did not load"}
    assert bounded.request("GET", "/v2/models/hangs_initialize/ready").status_code != 200
    assert bounded.request("GET", "/ping").status_code == 200


def test_a_python_model_is_charged_its_process_and_evicted_under_pressure(bounded):
    assert bounded.load("big_a").status_code == 200
    charged = bounded.metrics()[("serve_model_memory_bytes", (("device", "cpu"), ("model", "big_a")))]
    assert charged >= 100 * MIB  # its worker's own pages, the 100 MiB it holds among them
    assert bounded.load("big_b").status_code == 200  # only one fits: the idle big_a makes room
    assert "big_a" not in bounded.loaded() and "big_b" in bounded.loaded()
    assert infer(bounded, "big_a", [1, 0, 0, 0]).status_code == 404


# Triton's model loading API for BLS, its steps' answers in order (as tritonserver 2.51 answers them)
LOADS_PY = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        steps = [pb_utils.is_model_ready("target")]
        pb_utils.load_model("target")
        steps += [pb_utils.is_model_ready("target"), pb_utils.is_model_ready("target", "7")]
        try:
            pb_utils.load_model("absent")
        except pb_utils.TritonModelException as exc:
            steps.append(str(exc))
        pb_utils.unload_model("target")
        pb_utils.unload_model("absent")  # not loaded: no error
        steps.append(pb_utils.is_model_ready("target"))
        request = requests[0]
        steps.append(sorted(request.requested_output_names()))
        try:  # model files from a model's code need what a client's need (Triton has no such rule)
            pb_utils.load_model("target", config="{}", files={"file:1/model.py": b"print('hi')"})
        except pb_utils.TritonModelException as exc:
            steps.append(str(exc))
        pb_utils.InferenceRequest(model_name="target", requested_output_names=["y"], inputs=[],
                                  preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0))
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", np.array([json.dumps(steps).encode()], np.object_))])]
"""


def test_a_python_model_loads_unloads_and_asks_after_models_as_triton_s_bls_api_does(start_server, tmp_path):
    """pb_utils.load_model, unload_model, is_model_ready and PreferredMemory did not exist: a model that
    used them failed with AttributeError; and requested_output_names() is a set, as Triton's is."""
    python_model(tmp_path, "loader", LOADS_PY, {"max_batch_size": 0, "input": [tensor("x", "TYPE_FP32", [1])],
                                                "output": [tensor("y", "TYPE_STRING", [1])]})
    python_model(tmp_path, "target", SCALE_PY.replace("{gate}", "pass"), scale_config(2))
    server = start_server(tmp_path, SERVE_LOAD_MODELS="loader")
    wait_for(server.ready, 60, "the model did not load")
    answer = server.request("POST", "/v2/models/loader/infer", json={
        "inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}], "outputs": [{"name": "y"}]})
    assert answer.status_code == 200, answer.text
    steps = json.loads(answer.json()["outputs"][0]["data"][0])
    assert steps[:3] == [False, True, False]
    assert steps[3].startswith("Failed to load model: ") and "failed to load 'absent', failed to poll from model repository" in steps[3]
    assert steps[4:6] == [False, ["y"]]
    assert "may not carry model files" in steps[6] and "SERVE_ALLOW_MODEL_FILES" in steps[6]
    assert server.loaded() == ["loader"]
