"""The V2 model repository extension: index, load and reload (config override and files), unload."""

import base64
import io
import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from tests.builders import Gate, Scale, fp32_model, handler_model, python_model
from tests.integration.test_observability import log_lines

CONFIG = {"name": "fromfiles", "backend": "pytorch", "max_batch_size": 4,
          "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}],
          "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}]}
FAULTY_PY = """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("no weights")

    def execute(self, requests):
        return []
"""


def scripted_bytes(module) -> bytes:
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(module), buffer)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    for name in ("alpha", "beta", "base"):
        fp32_model(root, name)
    fp32_model(root, "gone", versions=(2,))
    python_model(root, "faulty", FAULTY_PY)
    (root / "broken").mkdir()
    handler_model(root, "swap", "def predict_fn(data, model):\n    return model(data)\n", Scale())
    return start_server(root, SERVE_ALLOW_MODEL_FILES="true")  # the relaxation under test; test_trust.py has the default


@pytest.fixture
def client(server):
    client = http.InferenceServerClient(server.url.removeprefix("http://"))
    yield client
    client.close()


def sagemaker_invoke(server, name):
    return server.invoke(name, [[1.0]])


def test_index_lists_every_model_with_state_and_reason(server, client):
    """Each entry as tritonserver 2.51 writes it (measured beside it): a model never loaded by its name
    alone; one unloaded, or whose load failed, with the version it served or was to serve."""
    client.load_model("alpha")
    with pytest.raises(InferenceServerException):
        client.load_model("broken")
    with pytest.raises(InferenceServerException, match="no weights"):
        client.load_model("faulty")
    client.load_model("gone")
    client.unload_model("gone")
    index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    assert index["alpha"] == {"name": "alpha", "version": "1", "state": "READY"}  # no empty reason, as Triton writes it
    assert index["beta"] == {"name": "beta"}
    assert index["gone"] == {"name": "gone", "version": "2", "state": "UNAVAILABLE", "reason": "unloaded"}
    assert index["faulty"] == {"name": "faulty", "version": "1", "state": "UNAVAILABLE",
                               "reason": "initialize of model 'faulty' raised RuntimeError: no weights"}
    assert index["broken"] == {"name": "broken", "state": "UNAVAILABLE", "reason": index["broken"]["reason"]}
    assert "no model in 'broken'" in index["broken"]["reason"]  # no version: its directory holds none
    ready = server.request("POST", "/v2/repository/index", json={"ready": True}).json()
    assert {e["name"] for e in ready} == {m for m in server.loaded()}


def test_load_unload_and_visibility_across_apis(server, client):
    client.load_model("beta")
    assert client.is_model_ready("beta") and "beta" in server.loaded()
    assert server.request("POST", "/v1/models/beta:predict", data='{"instances": [[1, 2, 3, 4]]}').json() == {"predictions": [[2.0, 4.0, 6.0, 8.0]]}
    client.unload_model("beta", unload_dependents=True)
    assert not client.is_model_ready("beta") and "beta" not in server.loaded()
    client.unload_model("beta")  # not loaded: a success, as in Triton
    with pytest.raises(InferenceServerException, match="failed to load 'nowhere', failed to poll from model repository"):
        client.load_model("nowhere")


def test_reload_keeps_the_old_model_serving_until_the_new_one_is_ready(server, client, tmp_path):
    client.load_model("swap")
    assert sagemaker_invoke(server, "swap").json() == [[2.0]]
    gate = Gate(tmp_path, "reload")
    (server.model_root / "swap" / "code" / "inference.py").write_text(
        f"import torch\ndef model_fn(model_dir):\n    {gate.code()}\n    return torch.jit.load(model_dir + '/model.pt')\n"
        "def predict_fn(data, model):\n    return model(data) + 100\n")
    with ThreadPoolExecutor(1) as pool:
        url = server.url.removeprefix("http://")  # tritonclient's client belongs to the thread that made it
        reloading = pool.submit(lambda: http.InferenceServerClient(url).load_model("swap"))
        gate.wait_entered()
        assert sagemaker_invoke(server, "swap").json() == [[2.0]]  # the old model still answers
        gate.release()
        reloading.result()
    assert sagemaker_invoke(server, "swap").json() == [[102.0]]
    (server.model_root / "swap" / "code" / "inference.py").write_text("raise ImportError('broken on purpose')\n")
    with pytest.raises(InferenceServerException, match="broken on purpose"):
        client.load_model("swap")
    assert sagemaker_invoke(server, "swap").json() == [[102.0]]  # a failed reload leaves the old one serving


def test_config_override_of_a_model_in_the_root(server, client):
    config = {**CONFIG, "name": "base", "max_batch_size": 2,
              "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
              "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [4]}]}
    client.load_model("base", config=json.dumps(config))
    assert client.get_model_config("base")["max_batch_size"] == 2
    answer = server.request("POST", "/v2/models/base/infer", json={"inputs": [
        {"name": "x", "shape": [3, 4], "datatype": "FP32", "data": [0] * 12}]})
    assert answer.status_code == 400 and "outside 1..2" in answer.json()["error"]


ALPHA = {"name": "alpha", "backend": "pytorch", "max_batch_size": 4,
         "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
         "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [4]}]}


@pytest.mark.parametrize("override, message", [
    ({"dynamic_batching": {"preferred_batch_size": [8]}}, "preferred_batch_size 8 must be within 1..4"),
    ({"instance_group": [{"kind": "KIND_CPU", "gpus": [0]}]}, "has kind KIND_CPU but specifies one or more GPUs"),
    ({"input": [{"name": "x", "data_type": "TYPE_FP32", "dims": []}]}, "input 'x' has no dims"),
    ({"dynamic_batching": {"priority_levels": 2, "default_priority_level": 1,
                           "priority_queue_policy": {"3": {"max_queue_size": 1}}}}, "names priority level 3; levels are 1..2"),
    ({"version_policy": {"latest": {"num_versions": 0}}}, "num_versions must be at least 1"),
])
def test_a_config_override_triton_refuses_is_a_400_and_the_model_serves_on(server, override, message):
    """A client's load may carry a config: one Triton refuses (measured on tritonserver 2.51) was served."""
    assert server.request("POST", "/v2/repository/models/alpha/load").status_code == 200  # as the model root holds it
    answer = server.request("POST", "/v2/repository/models/alpha/load",
                            json={"parameters": {"config": json.dumps({**ALPHA, **override})}})
    assert answer.status_code == 400 and answer.json()["error"].startswith("failed to load 'alpha', "), answer.text
    assert message in answer.json()["error"]
    served = server.request("POST", "/v2/models/alpha/infer", json={"inputs": [
        {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
    assert served.status_code == 200, served.text


def test_model_built_from_files_lives_in_server_storage(server, client):
    client.load_model("fromfiles", config=json.dumps(CONFIG), files={"file:1/model.pt": scripted_bytes(Scale(5.0))})
    tensor_in = http.InferInput("x", [1, 1], "FP32")
    tensor_in.set_data_from_numpy(__import__("numpy").array([[2]], "float32"))
    assert client.infer("fromfiles", [tensor_in]).as_numpy("y").tolist() == [[10.0]]
    assert not (server.model_root / "fromfiles").exists()
    client.unload_model("fromfiles")


@pytest.mark.parametrize("parameters, status, message", [
    ({"file:1/model.pt": base64.b64encode(b"x").decode()}, 400, "need the 'config' parameter"),
    ({"config": "{not json", "file:1/model.pt": "eA=="}, 400, "config.json is not valid JSON"),
    ({"config": json.dumps({**CONFIG, "max_batch_size": "lots"}), "file:1/model.pt": "eA=="}, 400, "ModelConfig"),
    ({"config": 7}, 400, "must be a string"),
    ({"config": json.dumps(CONFIG), "file:../../escape.pt": "eA=="}, 400, "relative path inside"),
    ({"config": json.dumps(CONFIG), "file:/etc/passwd": "eA=="}, 400, "relative path inside"),
    ({"config": json.dumps(CONFIG), "file:1/model.pt\x00x": "eA=="}, 400, "relative path inside"),
    ({"config": json.dumps(CONFIG), "file:1/" + "B" * 300: "eA=="}, 400, "File name too long"),  # past NAME_MAX
    ({"config": json.dumps(CONFIG), "file:1/model.pt": "%%%"}, 400, "not valid base64"),
    ({"config": json.dumps(CONFIG), "file:1/model.pt": base64.b64encode(b"garbage").decode()}, 400, "not a TorchScript model"),
    ({"config": json.dumps(CONFIG)}, 404, "failed to poll from model repository"),
])
def test_bad_load_requests(server, parameters, status, message):
    answer = server.request("POST", "/v2/repository/models/fromfiles2/load", json={"parameters": parameters})
    assert answer.status_code == status, answer.text
    assert message in answer.json()["error"]
    if not any(words in message for words in ("'config' parameter", "must be a string", "base64")):  # refused before any load
        assert answer.json()["error"].startswith("failed to load 'fromfiles2', ")  # Triton's words first
    assert "fromfiles2" not in server.loaded()
    assert server.request("POST", "/v2/repository/models/alpha/load").status_code == 200  # loads and serves on
    assert server.invoke("alpha", [[1, 2, 3, 4]]).json() == [[2.0, 4.0, 6.0, 8.0]]


@pytest.mark.parametrize("path, body, message", [
    ("/v2/repository/models/a%5Cb/load", "", "may not hold"),
    ("/v2/repository/index", '{"ready": "yes"}', "'ready' must be true or false"),
    ("/v2/repository/index", "[1]", "JSON object"),
    ("/v2/repository/models/alpha/unload", '{"parameters": {"unload_dependents": "no"}}', "unload_dependents"),
    ("/v2/repository/models/alpha/load", '{"parameters": []}', "'parameters' must be an object"),
])
def test_bad_repository_bodies(server, path, body, message):
    answer = server.request("POST", path, data=body)
    assert answer.status_code == 400 and message in answer.json()["error"]


def test_a_client_mistake_in_a_load_is_one_warning_without_a_traceback(server):
    errors = sum(line["level"] == "ERROR" for line in log_lines(server))
    for parameters in ({"config": "{not json"}, {"config": json.dumps({**CONFIG, "max_batch_size": "lots"})}):
        answer = server.request("POST", "/v2/repository/models/alpha/load", json={"parameters": parameters})
        assert answer.status_code == 400 and answer.json()["error"].startswith("failed to load 'alpha', "), answer.text
    answer = server.request("POST", "/v2/repository/models/broken/load")  # fails on a thread: no model in it
    assert answer.status_code == 400 and "no model in 'broken'" in answer.json()["error"]
    lines = log_lines(server)
    assert sum(line["message"] == "Invalid config override" and line["level"] == "WARNING" for line in lines) >= 2
    assert sum(line["level"] == "ERROR" for line in lines) == errors  # a client's mistake is not the server's error
