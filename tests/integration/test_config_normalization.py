"""A loaded model's config as Triton normalises it, read alike by the model's own `initialize`, by
/config over HTTP and by gRPC's ModelConfig: the platform and file name its backend implies, the
latest version, a dynamic batch's preferred size, pinned memory, and each instance group named, kinded
and counted. The expected documents are what tritonserver 2.51 printed for the same configs."""

import json

import pytest
import tritonclient.http as httpclient
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2

from tests import grpc_clients
from tests.builders import ensemble, ensemble_step, fp32_model, python_model, tensor, wait_for

# Each instance leaves its initialize's args where the test reads them: the model's own directory.
REPORTS_ARGS_PY = """
import json
from pathlib import Path

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        reports = Path(args["model_repository"]) / "initialized"
        reports.mkdir(exist_ok=True)
        (reports / (args["model_instance_name"] + ".json")).write_text(json.dumps(args))

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy())])
                for r in requests]
"""
X, Y = tensor("x", "TYPE_FP32", [4]), tensor("y", "TYPE_FP32", [4])
PINNED = {"priority": "PRIORITY_DEFAULT", "input_pinned_memory": {"enable": True},
          "output_pinned_memory": {"enable": True}, "gather_kernel_buffer_threshold": 0, "eager_batching": False}


def group(name: str, count: int = 1) -> dict:
    return {"name": name, "kind": "KIND_CPU", "count": count, "gpus": [], "secondary_devices": [], "profile": [],
            "passive": False, "host_policy": ""}


# name → what the normalised config holds that the written one left out
EXPECTED = {
    "groups": {"platform": "", "backend": "python", "default_model_filename": "model.py",
               "version_policy": {"latest": {"num_versions": 1}}, "optimization": PINNED,
               "instance_group": [group("groups_0", 2), group("named")]},
    "torchscript": {"platform": "pytorch_libtorch", "backend": "pytorch", "default_model_filename": "model.pt",
                    "version_policy": {"latest": {"num_versions": 1}}, "optimization": PINNED,
                    "instance_group": [group("torchscript")]},
    "pipeline": {"platform": "ensemble", "default_model_filename": "", "version_policy": {"latest": {"num_versions": 1}},
                 "instance_group": []},
}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    python_model(root, "groups", REPORTS_ARGS_PY, {"max_batch_size": 8, "dynamic_batching": {}, "input": [X], "output": [Y],
                                                    "instance_group": [{"count": 2}, {"name": "named", "kind": "KIND_CPU"}]})
    fp32_model(root, "torchscript", max_batch_size=8, platform="", backend="pytorch")  # no platform: Triton names it
    ensemble(root, "pipeline", [X], [Y], [ensemble_step("torchscript", {"x": "x"}, {"y": "y"})], {"max_batch_size": 8})
    return root


@pytest.fixture(scope="module")
def server(start_server, root):
    server = start_server(root, SERVE_LOAD_MODELS="*")
    wait_for(lambda: server.loaded() == sorted(EXPECTED), 60, "the models did not load")
    wait_for(server.grpc_ready, 60, "the gRPC front-end did not come up")
    return server


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_http_and_grpc_serve_the_config_as_triton_normalises_it(server, name):
    over_http = server.request("GET", f"/v2/models/{name}/config").json()
    with grpc_clients.InferenceServerClient(server.grpc_url) as client:
        over_grpc = client.get_model_config(name).config
    assert {key: over_http.get(key) for key in EXPECTED[name]} == EXPECTED[name]
    assert over_http["name"] == name and ("optimization" in over_http) == (name != "pipeline")
    assert over_grpc == json_format.ParseDict(over_http, model_config_pb2.ModelConfig())


def test_a_dynamic_batch_prefers_its_largest_size_as_triton_says(server):
    config = server.request("GET", "/v2/models/groups/config").json()
    assert config["dynamic_batching"]["preferred_batch_size"] == [8]


def test_each_python_instance_is_told_its_name_kind_and_the_config_clients_read(server, root):
    names = sorted(path.stem for path in (root / "groups" / "initialized").iterdir())
    assert names == ["groups_0_0", "groups_0_1", "named_0"]  # `<group>_<n>`, as Triton names them
    served = server.request("GET", "/v2/models/groups/config").json()
    for name in names:
        args = json.loads((root / "groups" / "initialized" / f"{name}.json").read_text())
        assert (args["model_instance_name"], args["model_instance_kind"], args["model_instance_device_id"]) == (name, "CPU", "0")
        assert json.loads(args["model_config"]) == served


def test_the_metadata_names_a_python_model_s_platform_as_triton_does(server):
    with httpclient.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=30) as client:
        assert client.get_model_metadata("groups")["platform"] == "python"  # the config's platform is ""
        assert client.get_model_metadata("torchscript")["platform"] == "pytorch_libtorch"
