"""TensorFlow Serving's REST API: the spec's example session byte for byte, then formats, versions,
labels, b64, NaN and every error case."""

import base64
from typing import Optional

import pytest
import torch

from tests.builders import Scale, Upper, handler_model, tensor, triton_model


class HalfPlusThree(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x + 3


class Mixed(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor):
        return a + b.float(), a * 2


class Shifted(torch.nn.Module):
    def forward(self, x: torch.Tensor, shift: Optional[torch.Tensor] = None) -> torch.Tensor:
        return x if shift is None else x + shift


class Scores(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([x[:, 0], x[:, 1], x[:, 0] + x[:, 1]], dim=1)


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    scalar = [tensor("x", "TYPE_FP32", [-1])], [tensor("y", "TYPE_FP32", [-1])]
    triton_model(root, "saved_model_half_plus_three", HalfPlusThree(), *scalar, versions=(123,))
    versioned = triton_model(root, "versioned", Scale(1.0), *scalar, versions=(1, 2, 3),
                             version_policy={"all": {}}, version_labels={"stable": 1, "canary": 3})
    for version in (2, 3):
        torch.jit.script(Scale(float(version))).save(str(versioned / str(version) / "model.pt"))
    triton_model(root, "latest_only", Scale(1.0), *scalar, versions=(1, 2))
    triton_model(root, "mixed", Mixed(), [tensor("a", "TYPE_FP32", [2]), tensor("b", "TYPE_INT64", [1])],
                 [tensor("sum", "TYPE_FP32", [2]), tensor("double", "TYPE_FP32", [2])], max_batch_size=4)
    triton_model(root, "strings", Upper(), [tensor("TEXT", "TYPE_STRING", [-1])],
                 [tensor("upper_bytes", "TYPE_STRING", [-1])])
    triton_model(root, "text", Upper(), [tensor("TEXT", "TYPE_STRING", [-1])], [tensor("upper", "TYPE_STRING", [-1])])
    classifier = triton_model(root, "classifier", Scores(), [tensor("x", "TYPE_FP32", [2])],
                              [{**tensor("scores", "TYPE_FP32", [3]), "label_filename": "labels.txt"}], max_batch_size=8)
    (classifier / "labels.txt").write_text("left\nright\nboth\n")
    handler_model(root, "handler", None, Scale())
    triton_model(root, "shifted", Shifted(), [tensor("x", "TYPE_FP32", [1]), {**tensor("shift", "TYPE_FP32", [1]), "optional": True}],
                 [tensor("y", "TYPE_FP32", [1])], max_batch_size=4)
    server = start_server(root)
    for name in ("saved_model_half_plus_three", "versioned", "latest_only", "mixed", "strings", "text", "classifier", "handler",
                 "shifted"):
        assert server.load(name).status_code == 200, name
    return server


def get(server, path):
    return server.request("GET", path)


def post(server, path, body: bytes | str):
    return server.request("POST", path, data=body)


# -- the spec's example session, byte for byte ---------------------------------------------------

def test_spec_status(server):
    answer = get(server, "/v1/models/saved_model_half_plus_three")
    assert answer.status_code == 200 and answer.headers["Content-Type"] == "application/json"
    # the spec's answer byte for byte, then the two keys KServe's V1 client reads (a TF Serving client
    # reads model_version_status alone)
    assert answer.text == (
        '{\n "model_version_status": [\n  {\n   "version": "123",\n   "state": "AVAILABLE",\n'
        '   "status": {\n    "error_code": "OK",\n    "error_message": ""\n   }\n  }\n ],\n'
        ' "name": "saved_model_half_plus_three",\n "ready": true\n}'
    )


def test_spec_predict(server):
    answer = post(server, "/v1/models/saved_model_half_plus_three:predict", '{"instances": [1.0,2.0,5.0]}')
    assert answer.status_code == 200 and answer.text == '{\n    "predictions": [3.5, 4.0, 5.5]\n}'


def test_spec_regress(server):
    body = '{"signature_name": "tensorflow/serving/regress", "examples": [{"x": 1.0}, {"x": 2.0}]}'
    answer = post(server, "/v1/models/saved_model_half_plus_three:regress", body)
    assert answer.status_code == 200 and answer.text == '{\n    "results": [3.5, 4.0]\n}'


def test_spec_unknown_servable(server):
    answer = post(server, "/v1/models/half:predict", '{"instances": [1.0,5.0]}')
    assert answer.status_code == 404 and answer.reason == "Not Found"
    assert answer.headers["Content-Type"] == "application/json"
    assert answer.text == '{ "error": "Servable not found for request: Latest(half)" }'


# -- formats ---------------------------------------------------------------------------------------

def test_row_and_columnar_formats_agree_on_a_multi_input_model(server):
    rows = post(server, "/v1/models/mixed:predict",
                '{"instances": [{"a": [1, 2], "b": [10]}, {"a": [3, 4], "b": [20]}]}')
    columns = post(server, "/v1/models/mixed:predict", '{"inputs": {"a": [[1, 2], [3, 4]], "b": [[10], [20]]}}')
    assert rows.json() == {"predictions": [{"sum": [11.0, 12.0], "double": [2.0, 4.0]},
                                           {"sum": [23.0, 24.0], "double": [6.0, 8.0]}]}
    assert columns.json() == {"outputs": {"sum": [[11.0, 12.0], [23.0, 24.0]], "double": [[2.0, 4.0], [6.0, 8.0]]}}


@pytest.mark.parametrize("body, predictions", [
    ('{"instances": [{"x": [1]}, {"x": [2]}]}', [[1.0], [2.0]]),
    ('{"instances": [{"x": [1], "shift": [10]}, {"x": [2], "shift": [20]}]}', [[11.0], [22.0]]),
    ('{"inputs": {"x": [[1], [2]]}}', [[1.0], [2.0]]),
    ('{"inputs": [[1], [2]]}', [[1.0], [2.0]]),  # unnamed: the one required input
])
def test_an_optional_input_may_be_left_out_of_every_instance(server, body, predictions):
    answer = post(server, "/v1/models/shifted:predict", body).json()
    assert answer == ({"predictions": predictions} if "instances" in body else {"outputs": predictions})


def test_single_output_name_is_omitted_and_scalars_work(server):
    assert post(server, "/v1/models/saved_model_half_plus_three:predict", '{"inputs": [2]}').json() == {"outputs": [4.0]}


def test_b64_in_and_out(server):
    encoded = base64.b64encode(b"hello").decode()
    answer = post(server, "/v1/models/strings:predict", f'{{"instances": [{{"b64": "{encoded}"}}, "abc"]}}')
    assert answer.json() == {"predictions": [{"b64": base64.b64encode(b"HELLO").decode()}, {"b64": "QUJD"}]}
    assert post(server, "/v1/models/text:predict", '{"inputs": ["abc"]}').json() == {"outputs": ["ABC"]}


def test_nan_and_infinity_round_trip_as_bare_tokens(server):
    answer = post(server, "/v1/models/saved_model_half_plus_three:predict", '{"inputs": [NaN, Infinity, -Infinity, 1]}')
    assert answer.status_code == 200 and answer.text == '{\n    "outputs": [NaN, Infinity, -Infinity, 3.5]\n}'


def test_classify_with_labels_and_context(server):
    body = '{"examples": [{"x": [1, 2]}, {"x": [0.5, 0]}]}'
    answer = post(server, "/v1/models/classifier:classify", body)
    assert answer.json() == {"results": [[["left", 1.0], ["right", 2.0], ["both", 3.0]],
                                         [["left", 0.5], ["right", 0.0], ["both", 0.5]]]}
    context = post(server, "/v1/models/saved_model_half_plus_three:regress", '{"context": {"x": 4}, "examples": [{}]}')
    assert context.json() == {"results": [5.0]}


def test_metadata_lists_signatures_from_the_config(server):
    metadata = get(server, "/v1/models/mixed/metadata").json()
    assert metadata["model_spec"] == {"name": "mixed", "signature_name": "", "version": "1"}
    definition = metadata["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert definition["method_name"] == "tensorflow/serving/predict"
    assert definition["inputs"]["b"] == {"dtype": "DT_INT64", "name": "b", "tensor_shape": {
        "dim": [{"size": "-1", "name": ""}, {"size": "1", "name": ""}], "unknown_rank": False}}
    regress = get(server, "/v1/models/saved_model_half_plus_three/metadata").json()["metadata"]["signature_def"]["signature_def"]
    assert sorted(regress) == ["serving_default", "tensorflow/serving/regress"]


# -- versions and labels -----------------------------------------------------------------------------

def test_versions_newest_first_and_routing(server):
    status = get(server, "/v1/models/versioned").json()["model_version_status"]
    assert [s["version"] for s in status] == ["3", "2", "1"]
    for path, expected in (("", 6.0), ("/versions/2", 4.0), ("/versions/1", 2.0), ("/labels/stable", 2.0), ("/labels/canary", 6.0)):
        assert post(server, f"/v1/models/versioned{path}:predict", '{"inputs": [2]}').json() == {"outputs": [expected]}, path
    assert get(server, "/v1/models/versioned/labels/canary").json()["model_version_status"][0]["version"] == "3"
    assert get(server, "/v1/models/versioned/versions/2/metadata").json()["model_spec"]["version"] == "2"


def test_only_the_latest_version_serves_by_default(server):
    assert [s["version"] for s in get(server, "/v1/models/latest_only").json()["model_version_status"]] == ["2"]
    answer = post(server, "/v1/models/latest_only/versions/1:predict", '{"inputs": [1]}')
    assert answer.status_code == 404 and answer.json()["error"] == "Servable not found for request: Specific(latest_only, 1)"


# -- errors ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("method, path, body, status, message", [
    ("POST", "/v1/models/mixed:predict", '{"instances": [], "inputs": []}', 400, "only one of 'inputs' or 'instances'"),
    ("POST", "/v1/models/mixed:predict", '{"signature_name": ""}', 400, "Missing 'inputs' or 'instances' key"),
    ("POST", "/v1/models/mixed:predict", '{"instances": []}', 400, "non-empty list"),
    ("POST", "/v1/models/saved_model_half_plus_three:predict", '{"instances": [[1], [2, 3]]}', 400, "input 'x'"),
    ("POST", "/v1/models/saved_model_half_plus_three:predict", '{"instances": ["a"]}', 400, "send numbers"),
    ("POST", "/v1/models/saved_model_half_plus_three:predict", '{"instances": [1.0', 400, "JSON Parse error"),
    ("POST", "/v1/models/saved_model_half_plus_three:predict", '[1.0]', 400, "JSON object"),
    ("POST", "/v1/models/saved_model_half_plus_three:predict", '{"instances": [{"b64": "!!"}]}', 400, "invalid base64"),
    ("POST", "/v1/models/mixed:predict", '{"instances": [{"a": [1, 2]}]}', 400, "every instance must name the inputs"),
    ("POST", "/v1/models/shifted:predict", '{"instances": [{"x": [1], "shift": [1]}, {"x": [2]}]}', 400,
     "instance 1 names ['x']; every instance must name the inputs ['x'], and the same of the optional ['shift']"),
    ("POST", "/v1/models/mixed:predict", '{"inputs": [[1, 2]]}', 400, "the model takes 2 inputs"),
    ("POST", "/v1/models/mixed:predict", '{"inputs": {"a": [[1, 2]], "b": [[1]], "c": [1]}}', 400, "unknown input 'c'"),
    ("POST", "/v1/models/mixed:predict", '{"inputs": {"a": [[1, 2]], "b": [[1.5]]}}', 400, "INT64: got floating-point"),
    ("POST", "/v1/models/mixed:predict", '{"signature_name": "nope", "inputs": {}}', 400, 'Serving signature name: "nope" not found'),
    ("POST", "/v1/models/mixed:regress", '{"examples": [{"a": 1}]}', 400, 'name: "tensorflow/serving/regress" not found'),
    ("POST", "/v1/models/saved_model_half_plus_three:regress", '{"signature_name": "serving_default", "examples": [{"x": 1}]}',
     400, "Expected regress signature method_name to be tensorflow/serving/regress"),
    ("POST", "/v1/models/saved_model_half_plus_three:regress", '{"examples": []}', 400, "non-empty list of objects"),
    ("POST", "/v1/models/saved_model_half_plus_three:regress", '{"examples": [{"y": 1}]}', 400, "example 0 lacks feature 'x'"),
    ("POST", "/v1/models/saved_model_half_plus_three:regress", '{"examples": [{"x": 1, "z": 2}]}', 400, "unknown feature(s) ['z']"),
    ("POST", "/v1/models/saved_model_half_plus_three:regress", '{"context": {"x": 1}, "examples": [{"x": 1}]}', 400, "both 'context'"),
    ("POST", "/v1/models/versioned/versions/9:predict", '{"inputs": [1]}', 404, "Servable not found for request: Specific(versioned, 9)"),
    ("GET", "/v1/models/versioned/versions/9", None, 404, "Could not find version 9 of model versioned"),
    ("GET", "/v1/models/nobody", None, 404, "Could not find any versions of model nobody"),
    ("GET", "/v1/models/versioned/versions/two", None, 400, "Failed to convert version: two to numeric."),
    ("POST", "/v1/models/versioned/labels/beta:predict", '{"inputs": [1]}', 400, "Unrecognized servable version label: beta"),
    ("GET", "/v1/models/versioned:predict", None, 400, "Malformed request: GET /v1/models/versioned:predict"),
    ("POST", "/v1/models/versioned", "{}", 400, "Malformed request: POST /v1/models/versioned"),
    ("POST", "/v1/models/versioned:explain", "{}", 400, "Malformed request"),
    ("DELETE", "/v1/models/versioned", None, 400, "Malformed request"),
    ("GET", "/v1/models/handler/metadata", None, 400, "SageMaker handler model"),
])
def test_errors_are_json_with_tf_serving_statuses(server, method, path, body, status, message):
    answer = server.request(method, path, data=body)
    assert answer.status_code == status, answer.text
    assert answer.headers["Content-Type"] == "application/json"
    assert message in answer.json()["error"]
    assert post(server, "/v1/models/saved_model_half_plus_three:predict", '{"inputs": [1]}').status_code == 200


def test_models_loaded_through_any_api_are_visible_here(server):
    assert server.load("late", "saved_model_half_plus_three").status_code == 200
    assert post(server, "/v1/models/late:predict", '{"instances": [2]}').json() == {"predictions": [4.0]}
    assert server.request("DELETE", "/models/late").status_code == 200
    assert post(server, "/v1/models/late:predict", '{"instances": [2]}').status_code == 404
