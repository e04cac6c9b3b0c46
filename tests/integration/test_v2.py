"""Triton / KServe V2: tritonclient (HTTP) unmodified against the server, plus wire-format cases."""

import json

import ml_dtypes
import numpy as np
import pytest
import torch
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from tests.builders import (
    AddSub,
    Scale,
    Upper,
    handler_model,
    tensor,
    triton_model,
    wait_for,
)

DATATYPES = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "FP16": np.float16, "FP32": np.float32, "FP64": np.float64, "BF16": ml_dtypes.bfloat16,
}


class Echo(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone()


class Logits(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 1.0


def save_models(root) -> None:
    """A model per datatype that echoes its input, a BYTES model and a model of two inputs and outputs:
    the V2 tests' models, and the gRPC tests' (test_grpc.py), which compare the two protocols on them."""
    for datatype in DATATYPES:
        triton_model(root, f"echo_{datatype.lower()}", Echo(), [tensor("x", f"TYPE_{datatype}", [-1])],
                     [tensor("y", f"TYPE_{datatype}", [-1])], max_batch_size=4)
    triton_model(root, "strings", Upper(), [tensor("TEXT", "TYPE_STRING", [-1])], [tensor("UPPER", "TYPE_STRING", [-1])])
    triton_model(root, "addsub", AddSub(), [tensor("INPUT0", "TYPE_INT32", [4]), tensor("INPUT1", "TYPE_INT32", [4])],
                 [tensor("OUTPUT0", "TYPE_INT32", [4]), tensor("OUTPUT1", "TYPE_INT32", [4])], max_batch_size=8)
    scores = triton_model(root, "scores", Logits(), [tensor("x", "TYPE_FP32", [4])],
                          [{**tensor("y", "TYPE_FP32", [4]), "label_filename": "labels.txt"}], max_batch_size=4)
    (scores / "labels.txt").write_text("apple\npear\nplum\nfig\n")


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    save_models(root)
    triton_model(root, "nobatch", Scale(), [tensor("x", "TYPE_FP32", [2, 2])], [tensor("y", "TYPE_FP32", [2, 2])])
    triton_model(root, "versions", Scale(1.0), [tensor("x", "TYPE_FP32", [1])], [tensor("y", "TYPE_FP32", [1])],
                 max_batch_size=2, versions=(1, 2), version_policy={"all": {}})
    torch.jit.script(Scale(2.0)).save(str(root / "versions" / "2" / "model.pt"))
    handler_model(root, "handler", None, Scale())
    server = start_server(root, SERVE_LOAD_MODELS="*")
    client = http.InferenceServerClient(server.url.removeprefix("http://"))
    wait_for(client.is_server_ready, message="the models named at start did not load")
    for name in [f"echo_{d.lower()}" for d in DATATYPES] + ["strings", "addsub", "nobatch", "scores", "versions", "handler"]:
        assert client.is_model_ready(name), name
    client.close()
    return server


@pytest.fixture
def client(server):
    client = http.InferenceServerClient(server.url.removeprefix("http://"), concurrency=4)
    yield client
    client.close()


def test_health_and_server_metadata(client):
    assert client.is_server_live() and client.is_server_ready()
    metadata = client.get_server_metadata()
    assert metadata["name"] and metadata["version"]
    assert sorted(metadata["extensions"]) == sorted([
        "classification", "sequence", "model_repository", "model_repository(unload_dependents)", "schedule_policy",
        "model_configuration", "system_shared_memory", "cuda_shared_memory", "binary_tensor_data", "parameters",
        "statistics", "logging"])


def test_model_metadata_and_config(client):
    metadata = client.get_model_metadata("addsub")
    assert metadata == {"name": "addsub", "versions": ["1"], "platform": "pytorch_libtorch",
                        "inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [-1, 4]},
                                   {"name": "INPUT1", "datatype": "INT32", "shape": [-1, 4]}],
                        "outputs": [{"name": "OUTPUT0", "datatype": "INT32", "shape": [-1, 4]},
                                    {"name": "OUTPUT1", "datatype": "INT32", "shape": [-1, 4]}]}
    assert client.get_model_metadata("nobatch")["inputs"][0]["shape"] == [2, 2]
    assert client.get_model_metadata("versions")["versions"] == ["1", "2"]
    assert client.get_model_metadata("versions", "2")["versions"] == ["2"]
    config = client.get_model_config("addsub")
    assert config["max_batch_size"] == 8 and config["input"][0]["dims"] == [4]
    assert config["input"][0]["data_type"] == "TYPE_INT32" and config["platform"] == "pytorch_libtorch"
    assert client.is_model_ready("versions", "2") and not client.is_model_ready("versions", "3")
    assert not client.is_model_ready("nobody")


@pytest.mark.parametrize("binary", [True, False])
def test_infer_json_and_binary(client, binary):
    a, b = np.arange(8, dtype=np.int32).reshape(2, 4), np.ones((2, 4), np.int32)
    inputs = [http.InferInput("INPUT0", [2, 4], "INT32"), http.InferInput("INPUT1", [2, 4], "INT32")]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    outputs = [http.InferRequestedOutput("OUTPUT0", binary_data=binary), http.InferRequestedOutput("OUTPUT1", binary_data=binary)]
    result = client.infer("addsub", inputs, outputs=outputs, request_id="req-7")
    assert np.array_equal(result.as_numpy("OUTPUT0"), a + b) and np.array_equal(result.as_numpy("OUTPUT1"), a - b)
    response = result.get_response()
    assert response["id"] == "req-7" and response["model_name"] == "addsub" and response["model_version"] == "1"
    assert list(response) == ["id", "model_name", "model_version", "outputs"]  # in Triton's order


@pytest.mark.parametrize("datatype, binary", [(d, b) for d in DATATYPES for b in (True, False) if (d, b) != ("BF16", False)])
def test_every_datatype_round_trips(client, datatype, binary):
    values = np.array([[0, 1, 2], [3, 4, 5]]).astype(DATATYPES[datatype])
    if datatype.startswith(("FP", "BF")):
        values = values + np.array(0.5, values.dtype)
    tensor_in = http.InferInput("x", list(values.shape), datatype)
    tensor_in.set_data_from_numpy(values, binary_data=binary)
    result = client.infer(f"echo_{datatype.lower()}", [tensor_in], outputs=[http.InferRequestedOutput("y", binary_data=binary)])
    assert result.as_numpy("y").dtype == values.dtype and np.array_equal(result.as_numpy("y"), values)
    assert result.get_output("y")["datatype"] == datatype


def test_bf16_as_json_numbers(server):
    """tritonclient sends BF16 only as binary data; JSON clients send numbers."""
    body = '{"inputs": [{"name": "x", "shape": [1, 3], "datatype": "BF16", "data": [0.5, -2, 3.140625]}]}'
    answer = post(server, "/v2/models/echo_bf16/infer", body).json()
    assert answer["outputs"][0]["datatype"] == "BF16" and answer["outputs"][0]["data"] == [0.5, -2.0, 3.140625]


@pytest.mark.parametrize("binary", [True, False])
def test_strings(client, binary):
    text = np.array([b"hello", "w\u00f6rld".encode()], dtype=object)
    tensor_in = http.InferInput("TEXT", [2], "BYTES")
    tensor_in.set_data_from_numpy(text, binary_data=binary)
    result = client.infer("strings", [tensor_in], outputs=[http.InferRequestedOutput("UPPER", binary_data=binary)])
    upper = [v if isinstance(v, bytes) else v.encode() for v in result.as_numpy("UPPER").tolist()]  # JSON gives str
    assert upper == [b"HELLO", "W\u00f6RLD".encode()]


def test_requested_output_subset_and_default_all_outputs(client):
    inputs = [http.InferInput(n, [1, 4], "INT32") for n in ("INPUT0", "INPUT1")]
    for item in inputs:
        item.set_data_from_numpy(np.ones((1, 4), np.int32))
    subset = client.infer("addsub", inputs, outputs=[http.InferRequestedOutput("OUTPUT1")])
    assert [o["name"] for o in subset.get_response()["outputs"]] == ["OUTPUT1"]
    everything = client.infer("addsub", inputs)
    assert [o["name"] for o in everything.get_response()["outputs"]] == ["OUTPUT0", "OUTPUT1"]


def test_classification_with_labels(client):
    tensor_in = http.InferInput("x", [2, 4], "FP32")
    tensor_in.set_data_from_numpy(np.array([[1.1, 3.3, 0.5, 2.4], [4, 3, 2, 1]], np.float32))
    result = client.infer("scores", [tensor_in], outputs=[http.InferRequestedOutput("y", class_count=2)])
    assert result.as_numpy("y").tolist() == [[b"3.300000:1:pear", b"2.400000:3:fig"], [b"4.000000:0:apple", b"3.000000:1:pear"]]
    unbatched = http.InferInput("x", [2, 2], "FP32")
    unbatched.set_data_from_numpy(np.array([[1, 5], [10, 4]], np.float32))
    top = client.infer("nobatch", [unbatched], outputs=[http.InferRequestedOutput("y", class_count=9)])
    assert top.as_numpy("y").tolist() == [b"20.000000:2", b"10.000000:1", b"8.000000:3", b"2.000000:0"]  # min(k, n), no labels


def test_versions_route_and_async_requests(client):
    tensor_in = http.InferInput("x", [1, 1], "FP32")
    tensor_in.set_data_from_numpy(np.array([[3]], np.float32))
    pending = [client.async_infer("versions", [tensor_in], model_version=v) for v in ("1", "2", "")]
    results = [p.get_result() for p in pending]
    assert [r.as_numpy("y").item() for r in results] == [3.0, 6.0, 6.0]
    assert [r.get_response()["model_version"] for r in results] == ["1", "2", "2"]


def test_statistics_count_items_and_executions(client):
    before = client.get_inference_statistics("nobatch")["model_stats"][0]
    tensor_in = http.InferInput("x", [2, 2], "FP32")
    tensor_in.set_data_from_numpy(np.ones((2, 2), np.float32))
    client.infer("nobatch", [tensor_in])
    bad = http.InferInput("x", [1, 4], "FP32")
    bad.set_data_from_numpy(np.ones((1, 4), np.float32))
    with pytest.raises(InferenceServerException):
        client.infer("nobatch", [bad])
    after = client.get_inference_statistics("nobatch")["model_stats"][0]
    assert after["inference_count"] - before["inference_count"] == 1  # no batch dimension: one item
    assert after["execution_count"] - before["execution_count"] == 1
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == 1
    assert after["last_inference"] >= before["last_inference"] > 0 or before["last_inference"] == 0
    batched = http.InferInput("x", [3, 4], "FP32")
    batched.set_data_from_numpy(np.ones((3, 4), np.float32))
    client.infer("scores", [batched])
    scores = client.get_inference_statistics("scores", "1")["model_stats"][0]
    assert scores["inference_count"] >= 3 and {"batch_size": 3} .items() <= scores["batch_stats"][-1].items()
    for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert scores["inference_stats"][phase]["count"] == scores["execution_count"] and scores["inference_stats"][phase]["ns"] > 0
    everything = client.get_inference_statistics()["model_stats"]
    assert {("versions", "1"), ("versions", "2"), ("scores", "1")} <= {(s["name"], s["version"]) for s in everything}


def test_scheduling_parameters_are_accepted(server):
    body = {"parameters": {"sequence_id": "abc", "sequence_start": True, "sequence_end": False, "priority": 1, "timeout": 1000},
            "inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}
    assert server.request("POST", "/v2/models/echo_fp32/infer", json=body).status_code == 200


def post(server, path, body, headers=None):
    return server.request("POST", path, data=body, headers=headers or {})


JSON_X = '{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}'


@pytest.mark.parametrize("path, body, status, message", [
    ("/v2/models/echo_fp32/infer", "", 400, "'inputs' must be a list of tensors"),
    ("/v2/models/echo_fp32/infer", '{"inputs": []}', 400, "missing input(s) ['x']; the model takes 'x' FP32[-1, -1]"),
    ("/v2/models/echo_fp32/infer", "{", 400, "malformed JSON"),
    ("/v2/models/echo_fp32/infer", "[]", 400, "JSON object"),
    ("/v2/models/nobody/infer", f'{{"inputs": [{JSON_X}]}}', 404, "Request for unknown model: 'nobody' is not found"),
    ("/v2/models/echo_fp32/versions/7/infer", f'{{"inputs": [{JSON_X}]}}', 404, "Request for unknown model: 'echo_fp32' version 7 is not found"),
    ("/v2/models/echo_fp32/versions/x/infer", f'{{"inputs": [{JSON_X}]}}', 400,
     "failed to get model version from specified version string 'x' (details: stol), version should be an integral value > 0"),
    ("/v2/models/echo_fp32/versions/-2/infer", f'{{"inputs": [{JSON_X}]}}', 400,
     "invalid model version specified '-2' , version should be an integral value > 0"),
    ("/v2/models/echo_fp32/infer", '{"inputs": [{"name": "z", "shape": [1], "datatype": "FP32", "data": [1]}]}', 400, "unknown input 'z'"),
    ("/v2/models/echo_fp32/infer", '{"inputs": [{"name": "x", "shape": [1, 2], "datatype": "INT32", "data": [1, 2]}]}', 400, "input 'x' is FP32; the request says INT32"),
    ("/v2/models/echo_fp32/infer", '{"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2]}]}', 400, "2 values for shape [1, 3]"),
    ("/v2/models/echo_fp32/infer", '{"inputs": [{"name": "x", "shape": [5, 1], "datatype": "FP32", "data": [1, 2, 3, 4, 5]}]}', 400, "batch size 5 is outside 1..4"),
    ("/v2/models/echo_fp32/infer", '{"inputs": [{"name": "x", "shape": [-1], "datatype": "FP32", "data": []}]}', 400, "non-negative"),
    # Triton's words for shapes past int64 (its L0_http test_buffer_size_overflow)
    ("/v2/models/echo_fp32/infer", '{"inputs": [{"name": "x", "shape": [16, %d], "datatype": "FP32", "data": [1]}]}' % (2**60 + 2),
     400, "causes total element count to exceed maximum size of"),
    ("/v2/models/echo_fp32/infer", '{"inputs": [{"name": "x", "shape": [4, %d], "datatype": "FP32", "data": [1]}]}' % (2**60 + 2),
     400, "byte size overflow for input 'x'"),
    ("/v2/models/echo_fp32/infer", '{"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP99", "data": [1, 2]}]}', 400, "datatype 'FP99'"),
    ("/v2/models/echo_fp32/infer", '{"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32"}]}', 400, "has no 'data'"),
    ("/v2/models/echo_fp32/infer", f'{{"inputs": [{JSON_X}, {JSON_X}]}}', 400, "appears twice"),
    ("/v2/models/echo_fp32/infer", f'{{"inputs": [{JSON_X}], "outputs": [{{"name": "q"}}]}}', 400, "unknown output(s) ['q']"),
    ("/v2/models/echo_fp32/infer", f'{{"inputs": [{JSON_X}], "outputs": [{{"name": "y", "parameters": {{"classification": 0}}}}]}}', 400, "positive whole number"),
    ("/v2/models/echo_fp32/infer", f'{{"inputs": [{JSON_X}], "parameters": {{"priority": "high"}}}}', 400, "'priority' must be int"),
    ("/v2/models/echo_fp32/infer", f'{{"inputs": [{JSON_X}], "parameters": {{"sequence_start": 1}}}}', 400, "'sequence_start' must be bool"),
    ("/v2/models/strings/infer", '{"inputs": [{"name": "TEXT", "shape": [1], "datatype": "BYTES", "data": [1]}]}', 400, "BYTES: send strings"),
    # values of a type the spec does not give them, which Triton refuses: accepted, a number id was echoed as a
    # number, true was read as 1.0, "yes" as binary, and an object handed to a python model as a parameter
    ("/v2/models/echo_fp32/infer", f'{{"id": 7, "inputs": [{JSON_X}]}}', 400, "'id' must be a string"),
    ("/v2/models/echo_fp32/infer", f'{{"id": null, "inputs": [{JSON_X}]}}', 400, "'id' must be a string"),
    ("/v2/models/echo_fp32/infer", '{"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [true, false]}]}', 400,
     "FP32: send numbers, got true/false"),
    ("/v2/models/echo_fp32/infer", f'{{"inputs": [{JSON_X}], "outputs": [{{"name": "y", "parameters": {{"binary_data": "yes"}}}}]}}',
     400, "'binary_data' must be true or false"),
    ("/v2/models/echo_fp32/infer", f'{{"inputs": [{JSON_X}], "parameters": {{"custom": {{"a": 1}}}}}}', 400,
     "parameter 'custom' must be a string, a number or true/false"),
    ("/v2/models/echo_fp32/infer", f'{{"inputs": [{JSON_X}], "parameters": {{"custom": [1]}}}}', 400,
     "parameter 'custom' must be a string, a number or true/false"),
    ("/v2/models/handler/infer", f'{{"inputs": [{JSON_X}]}}', 400, "SageMaker handler model"),
])
def test_bad_requests_are_4xx_with_a_message_and_the_next_request_works(server, path, body, status, message):
    answer = post(server, path, body)
    assert answer.status_code == status, answer.text
    assert message in answer.json()["error"]
    assert post(server, "/v2/models/echo_fp32/infer", f'{{"inputs": [{JSON_X}]}}').status_code == 200


@pytest.mark.parametrize("header, binary, message", [
    ("999", b"", "not a length within"),
    ("abc", b"", "not a length within"),
])
def test_bad_header_lengths(server, header, binary, message):
    body = f'{{"inputs": [{JSON_X}]}}'.encode() + binary
    answer = post(server, "/v2/models/echo_fp32/infer", body, {"Inference-Header-Content-Length": header})
    assert answer.status_code == 400 and message in answer.json()["error"]


def binary_request(size_claimed: int, data: bytes, datatype="FP32", shape=(1, 2), model="echo_fp32", name="x"):
    header = ('{"inputs": [{"name": "%s", "shape": %s, "datatype": "%s", "parameters": {"binary_data_size": %d}}]}'
              % (name, list(shape), datatype, size_claimed)).encode()
    return model, header + data, {"Inference-Header-Content-Length": str(len(header))}


@pytest.mark.parametrize("request_parts, message", [
    (binary_request(8, b"\0" * 4), "claims 8 bytes"),
    (binary_request(4, b"\0" * 4), "Expected 8, got 4 (the data of FP32[1, 2])"),
    (binary_request(8, b"\0" * 12), "4 bytes of binary data are not claimed"),
    (binary_request(3, b"\x05\0\0", "BYTES", (1,), "strings", "TEXT"), "ends inside an element's 4-byte length"),
    (binary_request(6, b"\x09\0\0\0ab", "BYTES", (1,), "strings", "TEXT"), "runs past the data"),
    (binary_request(10, b"\x01\0\0\0a\x01\0\0\0b", "BYTES", (1,), "strings", "TEXT"), "2 BYTES elements for a shape of 1"),
])
def test_binary_byte_counts_that_do_not_match_are_400(server, request_parts, message):
    model, body, headers = request_parts
    answer = post(server, f"/v2/models/{model}/infer", body, headers)
    assert answer.status_code == 400 and message in answer.json()["error"]


def test_wrong_method_and_oversized_body_on_infer(server):
    answer = server.request("GET", "/v2/models/echo_fp32/infer")
    assert answer.status_code == 405 and answer.headers["Allow"] == "POST" and "takes POST" in answer.json()["error"]
    answer = server.request("POST", "/v2/models/echo_fp32/infer", data=b"{" + b" " * (7 << 20) + b"}")
    assert answer.status_code == 413 and "SAGEMAKER_MAX_PAYLOAD_IN_MB" in answer.json()["error"]
    assert post(server, "/v2/models/echo_fp32/infer", f'{{"inputs": [{JSON_X}]}}').status_code == 200


def test_empty_body_without_content_type_is_a_clear_400(server):
    answer = server.request("POST", "/v2/models/echo_fp32/infer")
    assert answer.status_code == 400 and "error" in answer.json()


def test_nested_json_data_and_json_outputs_flat(server):
    body = '{"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2], [3, 4]]}]}'
    answer = post(server, "/v2/models/nobatch/infer", body).json()
    assert answer["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [2, 2], "data": [2.0, 4.0, 6.0, 8.0]}]


def test_handler_models_are_listed_without_tensors(client):
    assert client.get_model_metadata("handler")["platform"] == "sagemaker_pytorch"
    with pytest.raises(InferenceServerException, match="no Triton config"):
        client.get_model_config("handler")


def test_binary_data_output_parameter_and_per_output_override(server):
    body = {"parameters": {"binary_data_output": True},
            "inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1.5, 2]}],
            "outputs": [{"name": "y"}]}
    answer = server.request("POST", "/v2/models/echo_fp32/infer", json=body)
    length = int(answer.headers["Inference-Header-Content-Length"])
    assert answer.headers["Content-Type"] == "application/octet-stream"
    header = json.loads(answer.content[:length])
    assert header["outputs"][0]["parameters"] == {"binary_data_size": 8}
    assert np.frombuffer(answer.content[length:], "<f4").tolist() == [1.5, 2.0]
    body["outputs"] = [{"name": "y", "parameters": {"binary_data": False}}]
    answer = server.request("POST", "/v2/models/echo_fp32/infer", json=body)
    assert "Inference-Header-Content-Length" not in answer.headers and answer.json()["outputs"][0]["data"] == [1.5, 2.0]
