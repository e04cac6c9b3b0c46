"""SageMaker PyTorch layout: model.pt plus code/inference.py, with the toolkit's defaults for what is missing."""

import io

import numpy as np
import pytest

from tests.builders import Scale, archive, handler_model

CLASSIFIER = """
import json
import torch
from helper import LABELS  # a sibling module in code/

def input_fn(body, content_type):
    assert isinstance(body, str), "JSON arrives as str"
    return torch.tensor(json.loads(body)["x"], dtype=torch.float32)

def predict_fn(data, model):
    return model(data)

def output_fn(prediction, accept):
    return json.dumps({"labels": [LABELS[int(v > 2)] for v in prediction.flatten()], "accept": accept}), "application/json"
"""

SAME_NAME_A = "def predict_fn(data, model):\n    return model(data) + 100\n"
SAME_NAME_B = "def predict_fn(data, model):\n    return model(data) - 100\n"

TRANSFORM = """
def transform_fn(model, body, content_type, accept):
    return f"{type(body).__name__}:{len(body)}:{content_type}:{accept}"
"""

MODEL_FN = """
import torch

class Net(torch.nn.Module):
    def forward(self, x):
        return x.sum(dim=-1)

def model_fn(model_dir):
    return Net()
"""

BINARY_INPUT = """
import numpy as np
import torch

def input_fn(body, content_type):
    assert isinstance(body, bytearray), "non-text bodies arrive as a bytearray, as TorchServe reads them"
    return torch.from_numpy(np.frombuffer(body, dtype=np.uint8).astype(np.float32))
"""

SIBLING = """
from helper import OFFSET

def predict_fn(data, model):
    return model(data) + OFFSET
"""

AMBIGUOUS = TRANSFORM + "\ndef input_fn(body, content_type):\n    return body\n"
WRONG_ARITY = "def predict_fn(data):\n    return data\n"
RAISES = "def predict_fn(data, model):\n    raise KeyError('feature_7')\n"
BAD_RETURN = "def output_fn(prediction, accept):\n    return object()\n"


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    classifier = handler_model(root, "classifier", CLASSIFIER, Scale())
    (classifier / "code" / "helper.py").write_text("LABELS = ['low', 'high']\n")
    handler_model(root, "plus", SAME_NAME_A, Scale())
    handler_model(root, "minus", SAME_NAME_B, Scale())
    handler_model(root, "defaults", None, Scale())
    handler_model(root, "transform", TRANSFORM, Scale())
    handler_model(root, "modelfn", MODEL_FN)
    handler_model(root, "binary", BINARY_INPUT, Scale())
    handler_model(root, "raises", RAISES, Scale())
    handler_model(root, "badreturn", BAD_RETURN, Scale())
    handler_model(root, "ambiguous", AMBIGUOUS, Scale())
    handler_model(root, "arity", WRONG_ARITY, Scale())
    handler_model(root, "nomodel", "def predict_fn(data, model):\n    return data\n")
    archive(handler_model(tmp_path_factory.mktemp("src"), "packed", SAME_NAME_A, Scale()), root / "packed.tar.gz")
    for name, offset in (("sibling1", 1), ("sibling2", 2)):
        model = handler_model(root, name, SIBLING, Scale())
        (model / "code" / "helper.py").write_text(f"OFFSET = {offset}\n")
    server = start_server(root)
    for name in ("classifier", "plus", "minus", "defaults", "transform", "modelfn", "binary", "raises", "badreturn"):
        assert server.load(name).status_code == 200, name
    return server


def post(server, name, body, content_type="application/json", accept=None):
    headers = {"Content-Type": content_type} | ({"Accept": accept} if accept else {})
    return server.request("POST", f"/models/{name}/invoke", data=body, headers=headers)


def test_user_handlers_with_sibling_module(server):
    answer = post(server, "classifier", b'{"x": [0.5, 3.0]}', accept="application/json; charset=utf-8")
    assert answer.status_code == 200 and answer.headers["Content-Type"] == "application/json"
    assert answer.json() == {"labels": ["low", "high"], "accept": "application/json"}


def test_two_models_with_same_handler_module_name_do_not_collide(server):
    assert post(server, "plus", b"[1.0]").json() == [102.0]
    assert post(server, "minus", b"[1.0]").json() == [-98.0]
    assert post(server, "plus", b"[1.0]").json() == [102.0]


def test_same_named_sibling_modules_stay_apart(server):
    assert server.load("sibling1").status_code == 200 and server.load("sibling2").status_code == 200
    assert post(server, "sibling1", b"[1.0]").json() == [3.0]
    assert post(server, "sibling2", b"[1.0]").json() == [4.0]


def test_default_handlers_like_the_sagemaker_toolkit(server):
    assert post(server, "defaults", b"[[1, 2]]").json() == [[2.0, 4.0]]  # JSON ints become float32
    assert post(server, "defaults", b'{"instances": [[1, 2]]}').json() == {"predictions": [[2.0, 4.0]]}
    assert post(server, "defaults", b'{"inputs": [1]}').json() == {"outputs": [2.0]}
    assert post(server, "defaults", b"1,2\n3,4\n", "text/csv", accept="text/csv").text.split() == ["2.0,4.0", "6.0,8.0"]
    out = io.BytesIO()
    np.save(out, np.array([[1.5]], dtype=np.float64))
    answer = post(server, "defaults", out.getvalue(), "application/x-npy", accept="application/x-npy")
    result = np.load(io.BytesIO(answer.content))
    assert result.dtype == np.float64 and result.tolist() == [[3.0]]  # NPY keeps its dtype


def test_transform_fn_gets_str_for_text_and_a_bytearray_otherwise(server):
    assert post(server, "transform", b"[1]").text == "str:3:application/json:application/json"
    assert post(server, "transform", b"\x00\x01", "application/octet-stream", accept="text/plain").text == \
        "bytearray:2:application/octet-stream:text/plain"


def test_model_fn_builds_the_model(server):
    assert post(server, "modelfn", b"[[1, 2, 3]]").json() == [6.0]


def test_user_input_fn_accepts_any_content_type(server):
    assert post(server, "binary", b"\x01\x02", "image/raw").json() == [2.0, 4.0]


def test_archive_of_handler_model(server):
    assert server.load("packed", "packed.tar.gz").status_code == 200
    assert post(server, "packed", b"[1.0]").json() == [102.0]


@pytest.mark.parametrize("name, body, content_type, accept, status, message", [
    ("raises", b"[1]", "application/json", None, 500, "predict_fn of model 'raises' raised KeyError: 'feature_7'"),
    ("badreturn", b"[1]", "application/json", None, 500, "the handler returned object, which has no response body"),
    ("defaults", b"[1", "application/json", None, 400, "malformed JSON"),
    ("classifier", b"\xff\xfe", "application/json", None, 400, "not UTF-8"),
    ("defaults", b'[[1], [1, 2]]', "application/json", None, 400, "rectangular"),
    ("defaults", b'{"rows": [1]}', "application/json", None, 400, '"instances" or "inputs"'),
    ("defaults", b"abc", "image/png", None, 415, "image/png"),
    ("defaults", b"[1]", "application/json", "image/png", 406, "image/png"),
    ("defaults", b"[[1, 2, 3]]", "application/json", "text/csv", 200, None),
])
def test_handler_errors_are_clear_and_the_model_keeps_serving(server, name, body, content_type, accept, status, message):
    answer = post(server, name, body, content_type, accept)
    assert answer.status_code == status, answer.text
    if message:
        assert message in answer.json()["error"]
        assert "Traceback" not in answer.text
    assert post(server, "defaults", b"[1]").json() == [2.0]


@pytest.mark.parametrize("name, message", [
    ("ambiguous", "transform_fn together with"),
    ("arity", "predict_fn must take 2 argument(s)"),
    ("nomodel", "needs exactly one .pt, .pth or .pt2 file"),
])
def test_bad_handler_modules_fail_at_load(server, name, message):
    answer = server.load(name)
    assert answer.status_code == 400 and message in answer.json()["error"]
    assert name not in server.loaded()
