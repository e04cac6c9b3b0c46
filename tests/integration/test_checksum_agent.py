"""Triton's checksum repository agent against the real server: a model whose files have the digests its
config gives loads; a file changed after the config was written, an unknown algorithm or agent, and a
path outside the model's directory are refused at load, saying which, and the server serves on."""

import hashlib
import json

import pytest
import torch

from tests.builders import Scale, fp32_model


def agents(**parameters) -> dict:
    return {"model_repository_agents": {"agents": [{"name": "checksum", "parameters": parameters}]}}


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    directory = fp32_model(root, "checked", Scale(3.0))
    data = (directory / "1" / "model.pt").read_bytes()
    server = start_server(root)
    server.directory = directory
    server.digests = {name: hashlib.new(name, data).hexdigest() for name in ("md5", "sha256", "sha512")}
    server.config = json.loads((directory / "config.json").read_text())
    return server


def load(server, change: dict):
    return server.request("POST", "/v2/repository/models/checked/load",
                          json={"parameters": {"config": json.dumps({**server.config, **change})}})


@pytest.mark.parametrize("algorithm", ["MD5", "sha256", "SHA512"])
def test_files_with_the_digests_the_config_gives_load(server, algorithm):
    answer = load(server, agents(**{f"{algorithm}:1/model.pt": server.digests[algorithm.lower()].upper()}))
    assert answer.status_code == 200, answer.text
    body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    assert server.request("POST", "/v2/models/checked/infer", json=body).json()["outputs"][0]["data"] == [3, 6, 9, 12]


def test_a_file_changed_after_its_digest_was_written_is_refused_without_showing_its_digest(server):
    config = agents(**{"MD5:1/model.pt": server.digests["md5"]})
    assert load(server, config).status_code == 200
    model = server.directory / "1" / "model.pt"
    original = model.read_bytes()
    torch.jit.script(Scale(4.0)).save(str(model))  # the same kind of file, tampered with
    try:
        answer = load(server, config)
        found = hashlib.md5(model.read_bytes()).hexdigest()
    finally:
        model.write_bytes(original)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert f"Mismatched MD5 hash for file 1/model.pt, expect: {server.digests['md5']}" in error and found not in error
    assert server.request("GET", "/ping").status_code == 200


@pytest.mark.parametrize(("change", "words"), [
    (agents(**{"CRC32:1/model.pt": "00"}), "Unsupported checksum algorithm: CRC32"),
    (agents(**{"1/model.pt": "00"}), "failed to parse key: '1/model.pt'"),
    (agents(**{"MD5:../checked/1/model.pt": "00"}), "must be a relative path inside the model directory"),
    (agents(**{"MD5:/etc/passwd": "00"}), "must be a relative path inside the model directory"),
    (agents(**{"MD5:2/model.pt": "00"}), "'2/model.pt' is not a file in the model's directory"),
    ({"model_repository_agents": {"agents": [{"name": "relocation"}]}}, "agent 'relocation' is not run here"),
])
def test_what_the_agent_cannot_check_is_refused_with_the_reason(server, change, words):
    answer = load(server, change)
    assert answer.status_code == 400 and words in answer.json()["error"], answer.text
    assert server.request("GET", "/ping").status_code == 200
