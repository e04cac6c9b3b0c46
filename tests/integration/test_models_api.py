"""The SageMaker multi-model API: load, list (paginated), get, unload, and every error case."""

import io
import os
import tarfile
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.builders import (
    Scale,
    archive,
    fp32_model,
    handler_model,
    tensor,
    triton_model,
)


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    for name in ("alpha", "beta", "gamma", "delta", "epsilon"):
        fp32_model(root, name)
    archive(fp32_model(tmp_path_factory.mktemp("src"), "packed"), root / "packed.tar.gz")
    (root / "empty").mkdir()
    (root / "corrupt" / "1").mkdir(parents=True)
    (root / "corrupt" / "1" / "model.pt").write_bytes(b"not a torchscript zip")
    (root / "corrupt" / "config.pbtxt").write_text('platform: "pytorch_libtorch"\ninput [{name: "x" data_type: TYPE_FP32 dims: [1]}]\noutput [{name: "y" data_type: TYPE_FP32 dims: [1]}]\n')
    (root / "badconfig").mkdir()
    (root / "badconfig" / "config.pbtxt").write_text("platform: pytorch_libtorch {{{")
    triton_model(root, "onnx", Scale(), [tensor("x", "TYPE_FP32", [1])], [tensor("y", "TYPE_FP32", [1])], platform="onnxruntime_onnx")
    handler_model(root, "brokenhandler", "raise RuntimeError('handler import failed')\n")
    handler_model(root, "failingmodelfn", "def model_fn(model_dir):\n    raise ValueError('no weights here')\n")
    os.symlink("/etc", root / "escape")
    with tarfile.open(root / "evil.tar.gz", "w:gz") as tar:
        info = tarfile.TarInfo("../../evil.txt")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"evil"))
    return start_server(root)


def test_load_then_get_list_invoke_and_unload(server):
    assert server.load("alpha").status_code == 200
    assert server.request("GET", "/models/alpha").json() == {"modelName": "alpha", "modelUrl": "alpha"}
    assert "alpha" in server.loaded()
    answer = server.invoke("alpha", {"instances": [[1, 2, 3, 4]]})
    assert answer.status_code == 200 and answer.json() == {"predictions": [[2, 4, 6, 8]]}
    assert server.request("DELETE", "/models/alpha").status_code == 200
    assert server.request("GET", "/models/alpha").status_code == 404
    assert server.invoke("alpha", [[1, 2, 3, 4]]).status_code == 404
    assert server.load("alpha").status_code == 200  # the name is free again


def test_load_absolute_url_and_archive(server):
    assert server.load("abs", str(server.model_root / "beta")).status_code == 200
    assert server.load("packed", "packed.tar.gz").status_code == 200
    assert server.invoke("packed", [[1, 1, 1, 1]]).json() == [[2, 2, 2, 2]]


def test_second_load_of_a_name_is_409(server):
    server.load("gamma")
    answer = server.load("gamma")
    assert answer.status_code == 409 and "already loaded" in answer.json()["error"]


def test_concurrent_loads_of_one_name_exactly_one_succeeds(server):
    with ThreadPoolExecutor(8) as pool:
        codes = sorted(pool.map(lambda _: server.load("delta").status_code, range(8)))
    assert codes == [200] + [409] * 7
    assert server.invoke("delta", [[1, 2, 3, 4]]).status_code == 200


@pytest.mark.parametrize("body, message", [
    (b"{not json", "malformed JSON"),
    (b"[1, 2]", "JSON object"),
    (b'{"url": "alpha"}', "model_name"),
    (b'{"model_name": "", "url": "alpha"}', "model_name"),
    (b'{"model_name": "a/b", "url": "alpha"}', "may not hold"),
    (b'{"model_name": "a\\\\b", "url": "alpha"}', "may not hold"),
    (b'{"model_name": "..", "url": "alpha"}', "may not hold"),
    (b'{"model_name": "x"}', "'url'"),
    (b'{"model_name": "x", "url": 7}', "'url'"),
    (b'{"model_name": "x", "url": "/etc"}', "not a path inside the model root"),
    (b'{"model_name": "x", "url": "../../etc"}', "not a path inside the model root"),
    (b'{"model_name": "x", "url": "escape"}', "not a path inside the model root"),
])
def test_malformed_load_requests_are_400(server, body, message):
    answer = server.request("POST", "/models", data=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 400 and message in answer.json()["error"]


def test_missing_url_is_404(server):
    answer = server.load("ghost", "no-such-model")
    assert answer.status_code == 404 and "does not exist" in answer.json()["error"]


@pytest.mark.parametrize("url, status, message", [
    ("empty", 400, "no model in"),
    ("evil.tar.gz", 400, "refused"),
    ("corrupt", 400, "not a TorchScript model"),
    ("badconfig", 400, "config.pbtxt does not match"),
    ("onnx", 400, "onnxruntime_onnx"),
    ("brokenhandler", 400, "handler import failed"),
    ("failingmodelfn", 500, "model_fn of model 'failed' raised ValueError: no weights here"),
])
def test_failed_loads_are_clear_and_leave_nothing_behind(server, url, status, message):
    answer = server.load("failed", url)
    assert answer.status_code == status and message in answer.json()["error"]
    assert "failed" not in server.loaded()
    assert server.load("failed", "epsilon").status_code == 200  # the name was not left half-loaded
    assert server.request("DELETE", "/models/failed").status_code == 200


def test_pagination(server):
    for name in ("p1", "p2", "p3"):
        server.load(name, "beta")
    everything = server.loaded()
    seen, token = [], None
    while True:
        query = "/models?limit=2" + (f"&next_page_token={token}" if token else "")
        page = server.request("GET", query).json()
        assert len(page["models"]) <= 2
        seen += [m["modelName"] for m in page["models"]]
        token = page.get("nextPageToken")
        if not token:
            break
    assert seen == everything and len(seen) >= 3


@pytest.mark.parametrize("query", ["limit=0", "limit=-1", "limit=abc", "limit=", "next_page_token=%25%25%25"])
def test_bad_pagination_is_400(server, query):
    answer = server.request("GET", f"/models?{query}")
    assert answer.status_code == 400 and "error" in answer.json()


def test_unknown_models_are_404(server):
    for method, path in (("GET", "/models/nobody"), ("DELETE", "/models/nobody"), ("POST", "/models/nobody/invoke")):
        answer = server.request(method, path, json=[1])
        assert answer.status_code == 404 and "'nobody' is not loaded" in answer.json()["error"]


def test_unknown_routes_and_methods_answer_json(server):
    answer = server.request("GET", "/no/such/route")
    assert answer.status_code == 404 and "no endpoint GET /no/such/route" in answer.json()["error"]
    answer = server.request("PUT", "/models")
    assert answer.status_code == 405 and "GET" in answer.json()["error"] and "POST" in answer.headers["Allow"]
