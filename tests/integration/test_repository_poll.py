"""Triton's poll mode against the real server (SERVE_REPOSITORY_POLL_SECONDS): a model whose files
change is loaded again, one that fails to load as changed serves on as it was, one whose files go is
unloaded, one that appears is loaded, and one loaded with a client's config is left as the client
loaded it. Every wait is for the answer to change, with a deadline."""

import json
import shutil

import pytest
import torch

from tests.builders import Scale, fp32_model, wait_for


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    for name in ("changing", "broken_later", "leaving", "overridden"):
        fp32_model(root, name, Scale(2.0))
    server = start_server(root, SERVE_LOAD_MODELS="*", SERVE_REPOSITORY_POLL_SECONDS="0.1")
    wait_for(lambda: server.ready() and len(server.loaded()) == 4, 60, "the models did not load")
    return server


def answer(server, name: str):
    body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 1, 1, 1]}]}
    response = server.request("POST", f"/v2/models/{name}/infer", json=body)
    return response.json()["outputs"][0]["data"][0] if response.status_code == 200 else response.status_code


def replace_weights(server, name: str, factor: float) -> None:
    """Written beside it, then renamed over it: what a deployment tool does, so no look sees half a file."""
    directory = server.model_root / name / "1"
    torch.jit.script(Scale(factor)).save(str(directory / "model.pt.new"))
    (directory / "model.pt.new").rename(directory / "model.pt")


def test_a_model_whose_files_change_is_loaded_again(server):
    replace_weights(server, "changing", 7.0)
    wait_for(lambda: answer(server, "changing") == 7.0, 30, "the changed model was not loaded again")


def test_a_change_that_cannot_load_leaves_the_model_serving_as_it_was_until_it_can(server):
    (server.model_root / "broken_later" / "1" / "model.pt").write_bytes(b"not a model")
    replace_weights(server, "changing", 8.0)  # a change after the broken one: both were looked at, twice
    wait_for(lambda: answer(server, "changing") == 8.0, 30, "the changed model was not loaded again")
    assert answer(server, "broken_later") == 2.0
    replace_weights(server, "broken_later", 3.0)
    wait_for(lambda: answer(server, "broken_later") == 3.0, 30, "the mended model was not loaded")


def test_a_model_whose_files_go_is_unloaded_and_one_that_comes_is_loaded(server):
    shutil.rmtree(server.model_root / "leaving")
    wait_for(lambda: "leaving" not in server.loaded(), 30, "the removed model was not unloaded")
    assert answer(server, "leaving") == 404
    staging = server.model_root.parent / "staging"
    fp32_model(staging, "arriving", Scale(4.0))
    (staging / "arriving").rename(server.model_root / "arriving")
    wait_for(lambda: answer(server, "arriving") == 4.0, 30, "the new model was not loaded")


def test_a_model_loaded_with_a_clients_config_is_left_as_the_client_loaded_it(server):
    config = json.loads((server.model_root / "overridden" / "config.json").read_text())
    loaded = server.request("POST", "/v2/repository/models/overridden/load",
                            json={"parameters": {"config": json.dumps({**config, "max_batch_size": 2})}})
    assert loaded.status_code == 200, loaded.text
    replace_weights(server, "overridden", 9.0)
    replace_weights(server, "changing", 10.0)  # looked at after the overridden model changed
    wait_for(lambda: answer(server, "changing") == 10.0, 30, "the changed model was not loaded again")
    assert answer(server, "overridden") == 2.0
    assert server.request("GET", "/v2/models/overridden/config").json()["max_batch_size"] == 2
